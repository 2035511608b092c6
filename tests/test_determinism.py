"""Same inputs, weights and key: bit-identical results, call after call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import jax_attn
import torch_ref
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.frameworks import jax_context, run_case, run_jax
from tests.covering import each_value_params
from tests.gpt_cases import TINY, token_ids, torch_model
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)
# the layers with dropout run at this probability in both tests: the float32 programs compiled
# for the first test serve the second from the run's compilation cache
DROPOUT = 0.5


def case_for(layer):
    return Case(layer, batch=2, tokens=7, d_in=5, d_out=8, num_heads=2, bias=True, seed=12)


def assert_identical(first, second):
    assert list(first) == list(second)
    for name in first:
        np.testing.assert_array_equal(np.asarray(first[name]), np.asarray(second[name]), err_msg=name)


@pytest.mark.parametrize("layer", LAYERS)
def test_repeated_calls_are_bit_identical(layer):
    case = case_for(layer)
    params, x = to_params(case.build_torch()), case.make_input()
    rng = lambda: np.random.default_rng(7)  # noqa: E731
    key = jax.random.key(7)
    dropout = DROPOUT if case.kwargs(DROPOUT) != case.kwargs(0.0) else 0.0
    random = {"rng": rng} if dropout else {}
    numpy_runs = [
        run_case("numpy", case, params, x, dropout=dropout, **{k: v() for k, v in random.items()})[1]
        for _ in range(2)
    ]
    assert_identical(*numpy_runs)
    with jax_context("float32"):
        keys = {"key": key} if dropout else {}
        assert_identical(*(run_jax(case, params, x, dropout=dropout, **keys)[1] for _ in range(2)))
        assert_identical(*(run_jax(case, params, x, dropout=dropout, jit=True, **keys)[1] for _ in range(2)))
        modules = [
            getattr(jax_attn, layer).from_params(params, **case.kwargs(dropout), rngs=nnx.Rngs(3))
            for _ in range(2)
        ]
        np.testing.assert_array_equal(*(np.asarray(module(x)) for module in modules))


DTYPES = ["float32", "float64", "bfloat16"]


# every layer and every dtype in `make test` (one mechanism, jax_attn.compiled, serves them all;
# each run compiles two programs); `make test-slow` runs the rest of layer x dtype
@pytest.mark.parametrize("layer, dtype", each_value_params({"layer": LAYERS, "dtype": DTYPES}))
def test_eager_and_jit_are_bit_identical(layer, dtype):
    """An eager call runs the very program jax.jit compiles (jax_attn.compiled)."""
    case = case_for(layer).with_(dtype=dtype)
    params, x = to_params(case.build_torch()), case.make_input()
    with jax_context(dtype):
        keep = {}
        if case.kwargs(DROPOUT) != case.kwargs(0.0):
            keep = {"key": jax.random.key(5)}
        dropout = DROPOUT if keep else 0.0
        eager = run_jax(case, params, x, dropout=dropout, **keep)[1]
        jitted = run_jax(case, params, x, dropout=dropout, jit=True, **keep)[1]
        assert_identical(eager, jitted)


def _gpt_decode(params, x, dtype):
    caches = jax_attn.init_gpt_cache(TINY, x.shape[0], dtype)
    _, caches = jax_attn.gpt_model_decode(params, x[:, :5], caches, TINY)
    return jax_attn.gpt_model_decode(params, x[:, 5:6], caches, TINY)[0]  # (B, 1, V)


def _attention_decode(function, **sizes):
    def run(params, x, dtype):
        cache = jax_attn.init_kv_cache(x.shape[0], 2, 16, 16, dtype)
        _, cache = getattr(jax_attn, function)(params, x[:, :5], cache, **sizes)
        return getattr(jax_attn, function)(params, x[:, 5:6], cache, **sizes)[0]  # (B, 1, D)

    return run


def _block(params, x, dtype):
    return jax_attn.transformer_block(params, x, num_heads=2, context_length=16)


# the public functions that run a block, a model or a decoding step: an eager call runs as one
# program, the one jax.jit compiles (numpy_attn.api's `static`), not op by op; function ->
# (the weights' prefix in the tiny GPT, or None for FusedCausalAttention's; its input; the run)
COMPOSITE = {
    "transformer_block": ("trf_blocks.0.", "x", _block),
    "gpt_model_decode": ("", "token_ids", _gpt_decode),
    "multi_head_attention_decode": (
        "trf_blocks.0.att.",
        "x",
        _attention_decode("multi_head_attention_decode", num_heads=2, context_length=16),
    ),
    "fused_causal_attention_decode": (
        None,
        "x",
        _attention_decode("fused_causal_attention_decode", num_heads=2, context_size=16),
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("function", list(COMPOSITE))
def test_an_eager_block_or_decoding_step_is_the_jitted_program(function, dtype):
    prefix, input_kind, run = COMPOSITE[function]
    dtype = jnp.dtype(dtype)
    torch.manual_seed(0)
    module = torch_model() if prefix is not None else torch_ref.FusedCausalAttention(32, 2, 16)
    params = {
        name[len(prefix or "") :]: jnp.asarray(value, dtype)
        for name, value in to_params(module).items()
        if name.startswith(prefix or "")
    }
    if input_kind == "token_ids":
        x = jnp.asarray(token_ids(2, 6))
    else:
        x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 6, 32)), dtype)
    eager = run(params, x, dtype)
    jitted = jax.jit(lambda params, x: run(params, x, dtype))(params, x)
    np.testing.assert_array_equal(np.asarray(eager, np.float32), np.asarray(jitted, np.float32))
