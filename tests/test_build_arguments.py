"""What builds arrays from arguments, the same error in numpy_attn and jax_attn: sizes too large
for an array (XLA aborted the whole process), weight names that are not str, Flax ``dtype``
arguments that are not a floating dtype and bias flags that are not bools."""

import json
import math
import pathlib
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_attn
import numpy_attn
from numpy_attn import cache_checks
from numpy_attn.checks import check_mapping
from numpy_attn.memory import MAX_ELEMENTS, check_array_size, check_memory
from parity_tests.cases import Case
from tests.gpt_cases import TINY, token_ids
from torch_ref import to_params

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}

# ------------------------------------------------------------------ sizes too large for an array


def too_big(what, shape):
    return (
        f"{what} of shape {shape} would have {math.prod(shape)} elements, more than an array may hold "
        "(576460752303423487 = 2**59 - 1)"
    )


def test_the_bound_is_what_16_byte_elements_fit_in_int64():
    assert MAX_ELEMENTS == 2**59 - 1 == (2**63 - 1) // 16


def test_check_array_size_refuses_one_element_past_the_bound():
    check_array_size("x", (MAX_ELEMENTS,))
    check_array_size("x", (1, MAX_ELEMENTS, 1))
    message = (
        "x of shape (1073741824, 536870912) would have 576460752303423488 elements, more than an "
        "array may hold (576460752303423487 = 2**59 - 1)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_array_size("x", (2**30, 2**29))


def test_check_array_size_multiplies_numpy_ints_without_wrapping():
    """2**40 * 2**40 in int64 wraps to 0: the product is taken in Python ints."""
    with pytest.raises(ValueError, match=re.escape(too_big("x", (2**40, 2**40)))):
        check_array_size("x", (np.int64(2**40), np.int64(2**40)))


def test_kv_cache_sizes_at_the_bound_pass_the_size_check_and_meet_the_memory_check():
    check_array_size(KV, (1, 1, MAX_ELEMENTS, 1))  # the bound itself is an array's size
    sizes = {"batch": 1, "num_heads": 1, "max_length": MAX_ELEMENTS, "head_dim": 1, "dtype": np.float32}
    with pytest.raises(
        ValueError, match=r"^1 KV cache\(s\) of keys and values .* would take 4\.5 EiB, more than"
    ):
        cache_checks.init_kv_cache(numpy_attn.FRAMEWORK, sizes)  # checked only: nothing is allocated


MEMORY = r"would take [0-9.]+ [KMGTPE]iB, more than the [0-9.]+ [KMGTPE]iB of memory here"
BOOK = {"vocab_size": 50257, "context_length": 1024, "emb_dim": 768, "n_heads": 12, "n_layers": 12}
BOOK |= {"drop_rate": 0.0, "qkv_bias": False}


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda: jax_attn.GPTModel({**BOOK, "vocab_size": 2**30}, rngs=nnx.Rngs(0)), "GPTModel's"),
        (lambda: jax_attn.GPTModel({**BOOK, "n_layers": 10**6}, rngs=nnx.Rngs(0)), "GPTModel's"),
        (lambda: jax_attn.MultiHeadAttentionWrapper(8, 8, 16, 0.0, 10**9, rngs=nnx.Rngs(0)), "Wrapper's"),
        (lambda: jax_attn.init_kv_cache(1, 12, 2**25, 1024), "KV cache"),  # 128 GiB: RESOURCE_EXHAUSTED
        (lambda: numpy_attn.init_kv_cache(1, 12, 2**25, 1024), "KV cache"),
        (lambda: numpy_attn.init_gpt_cache({**BOOK, "n_layers": 10**4}, 64), "KV cache"),
        (lambda: jax_attn.init_gpt_cache({**BOOK, "n_layers": 10**4}, 64), "KV cache"),
    ],
    ids=["gpt_vocab_2**30", "gpt_10**6_blocks", "wrapper_10**9_heads", "jax_cache", "numpy_cache",
         "numpy_gpt_cache", "jax_gpt_cache"],
)  # fmt: skip
def test_what_cannot_fit_in_memory_is_refused_before_anything_is_allocated(make, what):
    with pytest.raises(ValueError, match=f"{what}.*{MEMORY}"):
        make()


def test_the_memory_bound_is_the_limit_itself():
    """Exactly the bytes there are passes; one byte more is refused, naming both sizes."""
    check_memory("a 1 GiB thing", 2**30, limit=2**30)
    message = r"^a 1 GiB thing would take 1\.0 GiB, more than the 1\.0 GiB of memory here$"
    with pytest.raises(ValueError, match=message):
        check_memory("a 1 GiB thing", 2**30 + 1, limit=2**30)


@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
def test_a_reference_call_whose_scores_cannot_fit_points_to_the_blockwise_path(package):
    params = to_params(Case("MultiHeadAttention", d_in=4, d_out=4, num_heads=2).build_torch())
    x = np.zeros((4, 200_000, 4), np.float32)  # (B, N, T, S) float32 scores: 1.2 TiB
    with pytest.raises(ValueError, match=f"MultiHeadAttention's 4 arrays .* attention scores {MEMORY}; "
                       "implementation='blockwise' holds O\\(T\\) instead"):  # fmt: skip
        package.multi_head_attention(params, x, num_heads=2, context_length=200_000)


def test_an_address_space_limit_lowers_the_bound():
    """Under ``ulimit -v`` (RLIMIT_AS) the bound is the limit, not the machine's memory: a cache that
    fits the machine but not the limit is refused in one line (before: a deadlock or a kill)."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2**32, 2**32))\n"
        "import numpy_attn\n"
        "try:\n    numpy_attn.init_kv_cache(1, 1, 2**28, 8)\nexcept ValueError as error:\n    print(error)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert (result.returncode, result.stdout.strip()) == (
        0,
        (
            "1 KV cache(s) of keys and values (1, 1, 268435456, 8) in float32 would take 16.2 GiB, "
            "more than the 4.0 GiB of memory here"
        ),
    )


# Each entry point, with sizes that aborted jax_attn (SIGABRT: "overflow in static extent
# product"), gave raw errors (JaxRuntimeError, "get(): incompatible function arguments"), or
# NumPy's MemoryError; or sizes one element past the bound. They run in a child process: a
# regression must not take pytest down with it.
KV = "the cache's keys (batch, num_heads, max_length, head_dim)"
MASK = "the mask (num_queries, num_keys)"
BIG_GPT = {**TINY, "vocab_size": 2**40, "emb_dim": 2**20, "n_heads": 1}
CACHE_GPT = {**TINY, "context_length": 2**59, "emb_dim": 1, "n_heads": 1}
HUGE_CALLS = {
    "PKG.init_kv_cache(2**21, 2**21, 2**21, 1)": too_big(KV, (2**21, 2**21, 2**21, 1)),
    "PKG.init_kv_cache(1, 1, 10**30, 1)": too_big(KV, (1, 1, 10**30, 1)),
    "PKG.init_kv_cache(1, 1, 2**59, 1)": too_big(KV, (1, 1, 2**59, 1)),
    "PKG.causal_mask(2**62)": too_big(MASK, (2**62, 2**62)),
    "PKG.causal_mask(3, 2**62)": too_big(MASK, (3, 2**62)),
    "PKG.causal_mask(2**30, 2**29)": too_big(MASK, (2**30, 2**29)),
    f"PKG.init_gpt_cache({CACHE_GPT!r}, 1)": too_big(KV, (1, 1, 2**59, 1)),
}
HUGE_MODULES = {
    "jax_attn.SelfAttentionV1(2**31, 2**31, rngs=nnx.Rngs(0))": too_big("weight 'W_query'", (2**31, 2**31)),
    "jax_attn.SelfAttentionV2(2**32, 2**32, rngs=nnx.Rngs(0))": too_big(
        "weight 'W_query.weight'", (2**32, 2**32)
    ),
    "jax_attn.SelfAttentionV1(2**30, 2**29, rngs=nnx.Rngs(0))": too_big("weight 'W_query'", (2**30, 2**29)),
    "jax_attn.FusedCausalAttention(2**30, 1, 4, 0.0, 0.0, rngs=nnx.Rngs(0))": too_big(
        "weight 'Wqkv.weight'", (3 * 2**30, 2**30)
    ),
    f"jax_attn.GPTModel({BIG_GPT!r}, rngs=nnx.Rngs(0))": too_big("weight 'tok_emb.weight'", (2**40, 2**20)),
}


def test_huge_sizes_are_refused_before_any_array_is_built():
    packages = ("numpy_attn", "jax_attn")
    expected = {
        code.replace("PKG", package): message for code, message in HUGE_CALLS.items() for package in packages
    }
    expected |= HUGE_MODULES
    script = (
        "import json, jax_attn, numpy_attn\nfrom flax import nnx\nresults = {}\n"
        f"for code in {list(expected)!r}:\n"
        "    try:\n        eval(code)\n        results[code] = 'no error'\n"
        "    except Exception as error:\n        results[code] = f'{type(error).__name__}: {error}'\n"
        "print(json.dumps(results))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.splitlines()[-1])
    assert results == {code: f"ValueError: {message}" for code, message in expected.items()}


# ------------------------------------------------------------------ weight names that are not str

NOT_STR_KEY = "params must be a mapping of str to arrays, got key 1 (int)"


def causal_params():
    rng = np.random.default_rng(0)
    shapes = numpy_attn.parameter_shapes("CausalAttention", d_in=4, d_out=4)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def test_check_mapping_names_the_first_key_that_is_not_a_str():
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        check_mapping({"W_query.weight": np.ones(2), 1: np.ones(2), (2,): np.ones(2)})


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_a_layer_function_refuses_a_weight_name_that_is_not_a_str_alike(package):
    """jax_attn raised JAX's "Comparator raised exception while sorting pytree dictionary keys"."""
    x = np.random.default_rng(1).standard_normal((1, 2, 4)).astype(np.float32)
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        PACKAGES[package].causal_attention(
            {**causal_params(), 1: np.ones(4, np.float32)}, x, context_length=4
        )


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_the_gpt_refuses_a_weight_name_that_is_not_a_str_alike(package):
    rng = np.random.default_rng(0)
    params = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in numpy_attn.gpt_param_shapes(TINY).items()
    }
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        PACKAGES[package].gpt_model({**params, 1: np.ones(4, np.float32)}, token_ids(1, 4), TINY)
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        jax_attn.GPTModel.from_params({**params, 1: np.ones(4, np.float32)}, TINY)


def test_the_flax_loaders_refuse_a_weight_name_that_is_not_a_str():
    """``from_params`` raised AttributeError ('int' object has no attribute 'rsplit')."""
    params = {**causal_params(), 1: np.ones(4, np.float32)}
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        jax_attn.CausalAttention.from_params(params, context_length=4)
    module = jax_attn.CausalAttention(4, 4, 4, 0.0, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        module.load_params(params)


# ------------------------------------------------------------------ Flax dtype arguments and bias flags

NOT_FLOATING = "dtype must be a floating dtype (float16, float32, float64; bfloat16 in jax_attn), got {}"
BAD_DTYPES = [
    (jnp.int32, NOT_FLOATING.format("int32")),
    (bool, NOT_FLOATING.format("bool")),
    (jnp.complex64, NOT_FLOATING.format("complex64")),
    (None, NOT_FLOATING.format("None")),
    ("not a dtype", NOT_FLOATING.format("'not a dtype'")),
    (np.dtype(">f4"), "dtype is >f4, big-endian; give it in the machine's byte order: np.float32"),
]


DTYPE_IDS = ["int32", "bool", "complex64", "None", "str", ">f4"]


@pytest.mark.parametrize("dtype, message", BAD_DTYPES, ids=DTYPE_IDS)
def test_flax_modules_refuse_a_dtype_that_is_not_floating(dtype, message):
    """JAX raised its own errors ("dtype argument to `uniform` must be a float dtype"), and
    dtype=None said "dtype has dtype float64"."""
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.MultiHeadAttention(4, 4, 4, 0.0, 2, dtype=dtype, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.GPTModel(TINY, dtype=dtype, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, "float32", np.float32])
def test_flax_modules_take_the_floating_dtypes(dtype):
    module = jax_attn.MultiHeadAttention(4, 4, 4, 0.0, 2, dtype=dtype, rngs=nnx.Rngs(0))
    assert module.W_query.kernel[...].dtype == np.dtype(dtype)


BAD_FLAGS = [
    (lambda flag: jax_attn.SelfAttentionV2(4, 4, qkv_bias=flag, rngs=nnx.Rngs(0)), "qkv_bias"),
    (lambda flag: jax_attn.MultiHeadAttention(4, 4, 4, 0.0, 2, out_bias=flag, rngs=nnx.Rngs(0)), "out_bias"),
    (lambda flag: jax_attn.FusedCausalAttention(8, 2, 4, 0.0, 0.0, bias=flag, rngs=nnx.Rngs(0)), "bias"),
]


@pytest.mark.parametrize("build, name", BAD_FLAGS, ids=[name for _, name in BAD_FLAGS])
@pytest.mark.parametrize("flag", ["no", 0, None], ids=repr)
def test_flax_modules_refuse_a_bias_flag_that_is_not_a_bool(build, name, flag):
    """'no' was taken as True and 0 as False, by truth value."""
    message = f"{name} must be a bool, got {flag!r} ({type(flag).__name__})"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        build(flag)


def test_flax_modules_take_numpy_bools():
    module = jax_attn.SelfAttentionV2(4, 4, qkv_bias=np.bool_(True), rngs=nnx.Rngs(0))
    assert module.W_query.bias is not None


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_the_gpt_config_refuses_a_qkv_bias_that_is_not_a_bool_alike(package):
    message = "config['qkv_bias'] must be a bool, got 'no' (str)"
    config = TINY | {"qkv_bias": "no"}
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        PACKAGES[package].init_gpt_cache(config, 1)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.GPTModel(config, rngs=nnx.Rngs(0))
