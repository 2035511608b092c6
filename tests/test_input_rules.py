"""One rule per kind of bad input, the same error in numpy_attn, jax_attn eager and under
``jax.jit``: dtype mismatches, float64 without JAX's 64-bit mode, torch tensors, ``rng``/``key``
of the wrong type, bad ``context_length``/``context_size``, and float16 scores beyond its range."""

import functools
import math
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jax_attn
import numpy_attn
from numpy_attn.spec import QKV
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.tolerances import tolerance_for
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)
CONTEXT_LAYERS = {"CausalAttention": "context_length", "MultiHeadAttentionWrapper": "context_length",
                  "MultiHeadAttention": "context_length", "FusedCausalAttention": "context_size"}  # fmt: skip


def case_and_params(layer, dtype="float32"):
    case = Case(layer, d_in=4, d_out=4, num_heads=2, bias=True, dtype=dtype)
    return case, to_params(case.build_torch())


def call(path, case, params, x, **changes):
    """Call ``case``'s function on the ``path``: "numpy", "jax" (eager) or "jit"."""
    kwargs = case.kwargs() | changes
    if path == "numpy":
        return getattr(numpy_attn, case.function_name)(params, x, **kwargs)
    fn = getattr(jax_attn, case.function_name)
    if path == "jax":
        return fn(params, x, **kwargs)
    return jax.jit(functools.partial(fn, **kwargs))(params, x)


# ------------------------------------------------------------------ dtype mismatch: one rule


@pytest.mark.parametrize("path", ["numpy", "jax", "jit"])
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize(
    "weights, x_dtype, odd_key",
    [("float32", "float64", None), ("float32", "float16", None), ("float32", "float32", "last")],
    ids=["x_float64", "x_float16", "one_weight_float64"],
)
def test_an_input_of_another_dtype_than_the_weights_is_one_type_error(path, layer, weights, x_dtype, odd_key):
    case, params = case_and_params(layer, weights)
    first = next(iter(params))
    if odd_key:  # the last weight in float64: the message names it
        first = list(params)[-1]
        params[first] = params[first].astype(np.float64)
    x = case.make_input().astype(x_dtype)
    got, want = (np.float64, x_dtype) if odd_key else (weights, x_dtype)
    message = rf"params\['{first}'\] has dtype {np.dtype(got).name} but x has dtype {want}"
    with jax.enable_x64(True), pytest.raises(TypeError, match=message):  # jit keeps float64 only in x64
        call(path, case, params, x)


@pytest.mark.parametrize("path", ["numpy", "jax", "jit"])
def test_the_mismatch_names_the_same_weight_whatever_the_dict_order(path):
    """The first mismatched weight in the layer's own order (torch's), not the dict's."""
    case, params = case_and_params("MultiHeadAttention")
    params = dict(reversed(params.items()))
    for key in ("W_query.weight", "out_proj.bias"):
        params[key] = params[key].astype(np.float64)
    message = r"params\['W_query.weight'\] has dtype float64 but x has dtype float32"
    with jax.enable_x64(True), pytest.raises(TypeError, match=message):
        call(path, case, params, case.make_input())


# ------------------------------------------------------------------ float64 without x64


def test_float64_without_x64_is_refused_by_jax_attn():
    case, params = case_and_params("MultiHeadAttention", "float64")
    x = case.make_input()
    message = (
        r"x has dtype float64, which JAX computes in float32 unless 64-bit mode is on: "
        r"call jax.config.update\('jax_enable_x64', True\)"
    )
    with jax.enable_x64(False), pytest.raises(TypeError, match=message):
        call("jax", case, params, x)


def test_float64_with_x64_stays_float64_and_jit_without_x64_follows_jax():
    case, params = case_and_params("MultiHeadAttention", "float64")
    x = case.make_input()
    expected = call("numpy", case, params, x)
    with jax.enable_x64(True):
        actual = call("jax", case, params, x)
    assert actual.dtype == np.float64
    np.testing.assert_allclose(actual, expected, *tolerance_for("float64"))
    with jax.enable_x64(False):  # JAX's rule: jit casts float64 arguments to float32 first
        assert call("jit", case, params, x).dtype == np.float32


# ------------------------------------------------------------------ torch tensors


def torch_inputs():
    case, params = case_and_params("MultiHeadAttention")
    module = case.build_torch()
    x = torch.from_numpy(case.make_input())
    return case, params, module, x


@pytest.mark.parametrize("path", ["numpy", "jax"])
@pytest.mark.parametrize("kind", ["plain", "requires_grad", "bfloat16"])
def test_torch_tensors_as_input_get_a_type_error_saying_how_to_convert(path, kind):
    case, params, _, x = torch_inputs()
    x = {"plain": x, "requires_grad": x.requires_grad_(), "bfloat16": x.to(torch.bfloat16)}[kind]
    dtype = "bfloat16" if kind == "bfloat16" else "float32"
    message = rf"x is a torch.Tensor with dtype torch.{dtype}, which NumPy cannot read: "
    with pytest.raises(TypeError, match=message + r".*\.detach\(\)\.cpu\(\)\.numpy\(\)"):
        call(path, case, params, x)


@pytest.mark.parametrize("path", ["numpy", "jax"])
@pytest.mark.parametrize("kind", ["named_parameters", "state_dict", "bfloat16"])
def test_torch_tensors_as_params_get_a_type_error_naming_the_weight(path, kind):
    case, _, module, x = torch_inputs()
    if kind == "bfloat16":
        module = module.to(torch.bfloat16)
    if kind == "state_dict":  # no gradient, buffers dropped
        params = {k: v for k, v in module.state_dict().items() if k != "mask"}
    else:  # nn.Parameter, requires_grad=True
        params = dict(module.named_parameters())
    kind_name = "torch.Tensor" if kind == "state_dict" else "torch.nn.parameter.Parameter"
    message = rf"params\['W_query.weight'\] is a {kind_name} with dtype torch.\w+, which NumPy cannot read"
    with pytest.raises(TypeError, match=message + r".*torch_ref.to_params\(module\)"):
        call(path, case, params, x.numpy())


# ------------------------------------------------------------------ rng and key


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_rng_that_is_not_a_generator_is_a_type_error(dropout):
    case, params = case_and_params("MultiHeadAttention")
    x = case.make_input()
    message = (
        r"rng must be a numpy.random.Generator \(numpy.random.default_rng\(seed\)\) or None, got 0 \(int\)"
    )
    with pytest.raises(TypeError, match=message):
        call("numpy", case, params, x, dropout=dropout, rng=0)
    with pytest.raises(TypeError, match=message):
        numpy_attn.dropout(x, 0.5, rng=0)


KEY_LAYERS = ["CausalAttention", "MultiHeadAttentionWrapper", "MultiHeadAttention", "FusedCausalAttention"]


@pytest.mark.parametrize("layer", KEY_LAYERS)
def test_key_that_is_not_a_jax_random_key_is_a_type_error(layer):
    """Eagerly the layers name the value given, as the building blocks and numpy_attn's rng do
    ("got 0 (int)", not the int32 array jit would make of it); under the caller's jax.jit the
    key is an array already, and named as one."""
    case, params = case_and_params(layer)
    x = case.make_input()
    message = "key must be a jax.random key (jax.random.key(seed)) or None, got "
    with pytest.raises(TypeError, match=f"^{re.escape(message)}0 \\(int\\)$"):
        call("jax", case, params, x, key=0)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}0 \\(int\\)$"):
        jax_attn.dropout(jnp.ones(3), 0.5, key=0)
    with pytest.raises(TypeError, match=r"got 0 \(int\)$"):
        call("numpy", case, params, x, rng=0)
    jitted = jax.jit(lambda key: getattr(jax_attn, case.function_name)(params, x, **case.kwargs(), key=key))
    with pytest.raises(
        TypeError, match=f"^{re.escape(message)}an array of dtype int32, shape \\(\\)"
    ):  # JAX adds a note
        jitted(0)
    for key in (jax.random.key(0), jax.random.PRNGKey(0)):  # typed and raw keys are accepted
        assert jax_attn.dropout(jnp.ones(3), 0.5, key=key).shape == (3,)
        assert np.isfinite(call("jax", case, params, x, key=key)).all()


# ------------------------------------------------------------------ context_length / context_size


BAD_CONTEXTS = [
    (None, TypeError, "None (NoneType)"),
    (math.nan, TypeError, "nan (float)"),
    (math.inf, TypeError, "inf (float)"),
    (6.0, TypeError, "6.0 (float)"),
    (True, TypeError, "True (bool)"),
    ("6", TypeError, "'6' (str)"),
    (0, ValueError, "0"),
    (-1, ValueError, "-1"),
]


@pytest.mark.parametrize("path", ["numpy", "jax"])
@pytest.mark.parametrize("layer", list(CONTEXT_LAYERS))
@pytest.mark.parametrize("value, error, got", BAD_CONTEXTS, ids=[repr(v) for v, _, _ in BAD_CONTEXTS])
def test_context_that_is_not_a_positive_int_is_refused(path, layer, value, error, got):
    case, params = case_and_params(layer)
    name = CONTEXT_LAYERS[layer]
    with pytest.raises(error, match=f"^{name} must be a positive int, got {re.escape(got)}(\n|$)"):
        call(path, case, params, case.make_input(), **{name: value})


@pytest.mark.parametrize("package", [numpy_attn, jax_attn])
def test_context_of_decode_functions_is_checked_and_numpy_ints_are_accepted(package):
    case, params = case_and_params("MultiHeadAttention")
    x = case.make_input()
    cache = package.init_kv_cache(2, 2, 6, 2)
    with pytest.raises(TypeError, match=r"^context_length must be a positive int, got 6.0 \(float\)(\n|$)"):
        package.multi_head_attention_decode(params, x, cache, num_heads=2, context_length=6.0)
    output, _ = package.multi_head_attention_decode(params, x, cache, num_heads=2, context_length=np.int64(6))
    assert output.shape == (2, 6, 4)


# ------------------------------------------------------------------ float16 beyond its range


def large_scores(xp, dtype):
    """One head whose scores q . k = 2 * 190**2 = 72200 overflow float16 (max 65504), while
    the scaled ones (72200 / sqrt(2) = 51053) do not."""
    queries = xp.full((1, 1, 4, 2), 190.0, dtype)
    values = xp.asarray(np.arange(8, dtype=np.float32).reshape(1, 1, 4, 2), dtype)
    return queries, queries, values


@pytest.mark.parametrize("package, xp", [(numpy_attn, np), (jax_attn, jnp)], ids=["numpy", "jax"])
def test_float16_scores_beyond_its_range_stay_finite_and_match_float32(package, xp):
    expected = package.scaled_dot_product_attention(*large_scores(xp, np.float32))
    actual = package.scaled_dot_product_attention(*large_scores(xp, np.float16))
    assert actual.dtype == np.float16
    np.testing.assert_allclose(np.asarray(actual, np.float32), expected, *tolerance_for("float16"))


@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
def test_float16_reference_and_blockwise_paths_give_one_answer(package):
    """Large float16 activations: "auto" must not change the answer with T."""
    params = {
        name: np.eye(2, dtype=np.float16) for name in ("W_query.weight", "W_key.weight", "W_value.weight")
    }
    x = np.full((1, 4, 2), 190.0, np.float16)
    outputs = {
        implementation: np.asarray(
            package.causal_attention(params, x, context_length=4, implementation=implementation, block_size=2)
        )
        for implementation in ("reference", "blockwise")
    }
    assert np.isfinite(outputs["reference"]).all()
    np.testing.assert_allclose(
        outputs["reference"].astype(np.float32),
        outputs["blockwise"].astype(np.float32),
        *tolerance_for("float16"),
    )


# ------------------------------------------------------------------ the building blocks: one rule each

PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}
BLOCKS = ["softmax", "scaled_dot_product_attention", "attend", "attend_heads", "linear",
          "split_projection", "dropout", "split_heads", "merge_heads"]  # fmt: skip
B, N, T, H, D = 2, 2, 3, 2, 3  # batch, heads, tokens, head size, input width; E = N * H = 4


def block_arrays(block, dtype=np.float32):
    """Valid array arguments of ``block``, by name (masks as given to it), drawn with one seed."""
    rng = np.random.default_rng(7)

    def draw(*shape):
        return rng.standard_normal(shape).astype(dtype)

    keep, padding = np.ones((B, N, T, T), bool), np.zeros((B, T), bool)
    heads = {"queries": draw(B, N, T, H), "keys": draw(B, N, T, H), "values": draw(B, N, T, H)}
    return {
        "softmax": {"x": draw(B, T)},
        "scaled_dot_product_attention": heads | {"mask": np.zeros((T, T), bool), "attn_keep_mask": keep},
        "attend": heads | {"padding_mask": padding, "attn_keep_mask": keep},
        "attend_heads": {
            "x": draw(B, T, D),
            "qkv[0]": draw(12, D),
            "qkv[1]": draw(12),
            "padding_mask": padding,
            "attn_keep_mask": keep,
        },
        "linear": {"x": draw(B, T, D), "weight": draw(4, D), "bias": draw(4)},
        "split_projection": {"x": draw(B, T, D), "weight": draw(12, D), "bias": draw(12)},
        "dropout": {"x": draw(B, T), "keep_mask": np.ones((B, T), bool)},
        "split_heads": {"x": draw(B, T, 4)},
        "merge_heads": {"x": draw(B, N, T, H)},
    }[block]


def call_block(package, block, arrays, **kwargs):
    """``block`` of ``package`` on the arrays of ``block_arrays`` (by name)."""
    fn = getattr(package, block)
    a = dict(arrays)
    if block == "scaled_dot_product_attention":
        return fn(a["queries"], a["keys"], a["values"], a["mask"], dropout=0.5,
                  attn_keep_mask=a["attn_keep_mask"], **kwargs)  # fmt: skip
    if block == "attend":
        masking = numpy_attn.Masking(causal=True, padding_mask=a["padding_mask"])
        dropout = numpy_attn.AttnDropout(0.5, None, a["attn_keep_mask"])
        return fn(a["queries"], a["keys"], a["values"], masking, dropout)[0]
    if block == "attend_heads":
        masking = numpy_attn.Masking(causal=True, padding_mask=a["padding_mask"])
        dropout = numpy_attn.AttnDropout(0.5, None, a["attn_keep_mask"])
        return fn(a["x"], (a["qkv[0]"], a["qkv[1]"]), N, masking, dropout)[0]
    if block == "dropout":
        return fn(a["x"], 0.5, keep_mask=a["keep_mask"])
    if block == "split_heads":
        return fn(a["x"], N)
    if block in ("linear", "split_projection"):
        return fn(a["x"], a["weight"], a["bias"])
    return fn(a["x"])  # softmax, merge_heads


def output_of(value):
    return value[0] if isinstance(value, tuple) else value


@pytest.mark.parametrize("block", BLOCKS)
def test_the_checked_building_blocks_give_one_answer_in_both_packages(block):
    """The checks change no value: numpy_attn and jax_attn agree on the valid call."""
    arrays = block_arrays(block)
    expected = output_of(call_block(numpy_attn, block, arrays))
    actual = output_of(call_block(jax_attn, block, arrays))
    np.testing.assert_allclose(np.asarray(actual), expected, *tolerance_for("float32"))


TORCH_MESSAGE = (
    r" is a torch.Tensor with dtype torch.\w+, which NumPy cannot read: .*\.detach\(\)\.cpu\(\)\.numpy\(\)"
)


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("block, name", [(block, name) for block in BLOCKS for name in block_arrays(block)])
def test_a_torch_tensor_as_any_array_of_a_building_block_is_named(package, block, name):
    arrays = block_arrays(block)
    arrays[name] = torch.from_numpy(arrays[name])
    with pytest.raises(TypeError, match=re.escape(name) + TORCH_MESSAGE):
        call_block(PACKAGES[package], block, arrays)


@pytest.mark.parametrize("package", list(PACKAGES))
def test_a_list_given_to_a_building_block_is_a_type_error_naming_it(package):
    with pytest.raises(TypeError, match=r"^x must be an array, got list(\n|$)"):
        PACKAGES[package].softmax([1.0])
    with pytest.raises(TypeError, match=r"^weight must be an array, got list(\n|$)"):
        PACKAGES[package].linear(np.ones((2, 3), np.float32), [[1.0, 2.0, 3.0]])


@pytest.mark.parametrize("path", ["numpy", "jax"])
@pytest.mark.parametrize(
    "layer, mask", [("MultiHeadAttention", "attn_keep_mask"), ("FusedCausalAttention", "attn_keep_mask"),
                    ("FusedCausalAttention", "out_keep_mask"), ("FusedCausalAttention", "padding_mask")],
)  # fmt: skip
def test_a_torch_tensor_as_a_layer_mask_is_named(path, layer, mask):
    case, params = case_and_params(layer)
    x = case.make_input()
    shape = {"attn_keep_mask": (2, 2, 6, 6), "out_keep_mask": x.shape, "padding_mask": (2, 6)}[mask]
    tensor = torch.ones(shape, dtype=torch.bool)
    fn = getattr(PACKAGES[path], case.function_name)
    args = (tensor,) if mask == "padding_mask" else ()
    kwargs = case.kwargs() | ({} if mask == "padding_mask" else {mask: tensor})
    with pytest.raises(TypeError, match=mask + TORCH_MESSAGE):
        fn(params, x, *args, **kwargs)


@pytest.mark.parametrize("path", ["numpy", "jax", "jit"])
@pytest.mark.parametrize(
    "block, odd, message",
    [
        ("scaled_dot_product_attention", ("keys", "values"), "keys has dtype float16 but queries has dtype"),
        ("scaled_dot_product_attention", ("values",), "values has dtype float64 but queries has dtype"),
        ("attend", ("keys",), "keys has dtype float64 but queries has dtype"),
        ("attend_heads", ("qkv[1]",), "qkv[1] has dtype float16 but x has dtype"),
        ("linear", ("weight",), "weight has dtype float64 but x has dtype"),
        ("linear", ("bias",), "bias has dtype float16 but x has dtype"),
        ("split_projection", ("weight", "bias"), "weight has dtype float16 but x has dtype"),
    ],
)
def test_mixed_dtypes_in_a_building_block_are_one_type_error(path, block, odd, message):
    arrays = block_arrays(block)
    dtype = message.split(" has dtype ")[1].split()[0]
    message += " float32"  # the first array's
    for name in odd:
        arrays[name] = arrays[name].astype(dtype)
    package = numpy_attn if path == "numpy" else jax_attn
    with jax.enable_x64(True), pytest.raises(TypeError, match=f"^{re.escape(message)}(\n|$)"):
        if path == "jit":  # checked while tracing: shapes and dtypes are known
            jax.jit(lambda arrays: output_of(call_block(package, block, arrays)))(arrays)
        else:
            call_block(package, block, arrays)


X64_MESSAGE = r"has dtype float64, which JAX computes in float32 unless 64-bit mode is on"


@pytest.mark.parametrize("block", BLOCKS)
def test_float64_without_x64_is_refused_by_the_jax_building_blocks(block):
    arrays = block_arrays(block, np.float64)
    first = next(iter(arrays))
    with jax.enable_x64(False):
        with pytest.raises(TypeError, match=f"^{re.escape(first)} {X64_MESSAGE}"):
            call_block(jax_attn, block, arrays)
        # JAX's rule under jit: float64 arguments arrive as float32, and so is the result
        jitted = jax.jit(lambda arrays: output_of(call_block(jax_attn, block, arrays)))(arrays)
        assert jitted.dtype == np.float32
    with jax.enable_x64(True):  # with 64-bit mode float64 stays float64, as in numpy_attn
        assert output_of(call_block(jax_attn, block, arrays)).dtype == np.float64
    assert output_of(call_block(numpy_attn, block, arrays)).dtype == np.float64


def big_endian_message(name):
    return f"{name} has dtype >f4, big-endian; give it in the machine's byte order: .astype(np.float32)"


@pytest.mark.parametrize("which", ["weights", "x", "both"])
@pytest.mark.parametrize(
    "path, mapping",
    [("numpy", dict), ("numpy", types.MappingProxyType), ("jax", dict)],
    ids=["numpy-dict", "numpy-mapping", "jax-dict"],
)
def test_big_endian_weights_or_input_are_refused_with_the_byte_order_named(path, mapping, which):
    """A dict of NumPy arrays takes the remembered verdict (``_check_described``), another
    mapping the uncached checks (jit takes no mappingproxy): both name the big-endian array."""
    case, params = case_and_params("MultiHeadAttention")
    x = case.make_input()
    call(path, case, mapping(params), x)  # the native call passes (and is remembered)
    if which != "x":
        params = {k: v.astype(">f4") for k, v in params.items()}
    if which != "weights":
        x = x.astype(">f4")
    name = "params['W_query.weight']" if which == "weights" else "x"
    for _ in range(2):  # a second time: the remembered verdicts keep no failing call
        with pytest.raises(TypeError, match=f"^{re.escape(big_endian_message(name))}(\n|$)"):
            call(path, case, mapping(params), x)


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("block", BLOCKS)
def test_big_endian_arrays_given_to_a_building_block_are_refused(package, block):
    arrays = block_arrays(block)
    name = list(arrays)[-1] if block in ("linear", "split_projection") else next(iter(arrays))
    arrays[name] = arrays[name].astype(">f4")
    with pytest.raises(TypeError, match=f"^{re.escape(big_endian_message(name))}(\n|$)"):
        call_block(PACKAGES[package], block, arrays)


@pytest.mark.parametrize("package", list(PACKAGES))
def test_scaled_dot_product_attention_checks_rng_and_names_its_dropout(package):
    queries = block_arrays("scaled_dot_product_attention")["queries"]
    sdpa = PACKAGES[package].scaled_dot_product_attention
    if package == "numpy":
        message = r"^rng must be a numpy.random.Generator \(numpy.random.default_rng\(seed\)\) or None, "
        with pytest.raises(TypeError, match=message + r"got 0 \(int\)$"):
            sdpa(queries, queries, queries, rng=0)  # no dropout: still refused, as the layers do
    else:
        with pytest.raises(
            TypeError, match=r"^key must be a jax.random key \(jax.random.key\(seed\)\) or None"
        ):
            sdpa(queries, queries, queries, key=0)
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\), got 1.0(\n|$)"):
        sdpa(queries, queries, queries, dropout=1.0)
    with pytest.raises(TypeError, match=r"^dropout must be a float in \[0, 1\), got str(\n|$)"):
        sdpa(queries, queries, queries, dropout="0.1")


@pytest.mark.parametrize("path", ["numpy", "jax", "jit"])
@pytest.mark.parametrize(
    "block, change, message",
    [
        ("linear", lambda a: a.update(weight=a["weight"][:, :1], bias=None),
         "weight must have shape (out_features, in_features) with in_features=3 (x has shape (2, 3, 3)), "
         "got shape (4, 1)"),
        ("linear", lambda a: a.update(bias=a["bias"][:1]),
         "bias must have shape (4,) for weight of shape (4, 3), got shape (1,)"),
        ("scaled_dot_product_attention", lambda a: a.update(keys=a["keys"][..., :1]),
         "keys must have shape (..., S, H) with H=2 (queries have shape (2, 2, 3, 2)), "
         "got shape (2, 2, 3, 1)"),
        ("scaled_dot_product_attention", lambda a: a.update(values=a["values"][..., :1, :]),
         "values must have shape (..., S, Hv) with S=3 (keys have shape (2, 2, 3, 2)), "
         "got shape (2, 2, 1, 2)"),
        ("split_heads", lambda a: None, "num_heads must be a positive int, got 0"),
        ("split_heads", lambda a: a.update(x=a["x"][..., :3]), "E=3 is not divisible by num_heads=2"),
        ("merge_heads", lambda a: a.update(x=a["x"][0]),
         "x must have shape (B, N, T, H), got shape (2, 3, 2) (rank 3)"),
    ],
)  # fmt: skip
def test_shapes_that_do_not_fit_a_building_block_are_one_value_error(path, block, change, message):
    arrays = block_arrays(block)
    change(arrays)
    package = numpy_attn if path == "numpy" else jax_attn

    def run(arrays):
        if message.startswith("num_heads"):
            return package.split_heads(arrays["x"], 0)
        return output_of(call_block(package, block, arrays))

    with pytest.raises(ValueError, match=f"^{re.escape(message)}(\n|$)"):
        jax.jit(run)(arrays) if path == "jit" else run(arrays)


@pytest.mark.parametrize("package", list(PACKAGES))
def test_a_big_endian_weight_given_to_blockwise_self_attention_is_named(package):
    x, weight = np.ones((1, 4, 3), np.float32), np.ones((12, 3), ">f4")
    with pytest.raises(TypeError, match=f"^{re.escape(big_endian_message('weight'))}(\n|$)"):
        PACKAGES[package].blockwise_self_attention(x, weight, None, num_heads=2)


@pytest.mark.parametrize("package", list(PACKAGES))
def test_attend_heads_names_an_input_of_another_rank(package):
    arrays = block_arrays("attend_heads")
    arrays["x"] = arrays["x"][0]
    with pytest.raises(ValueError, match=r"^x must have shape \(B, T, D\), got shape \(3, 3\) \(rank 2\)$"):
        call_block(PACKAGES[package], "attend_heads", arrays)


@pytest.mark.parametrize("path", ["numpy", "jax"])
def test_a_big_endian_mask_gets_the_mask_error_not_jaxs(path):
    case, params = case_and_params("FusedCausalAttention")
    padding_mask = np.zeros((2, 6), ">f4")  # a mask must be bool: refused as such in both packages
    message = r"^padding_mask must be a bool array of shape \(B, S\) = \(2, 6\), got float32 array"
    with pytest.raises(ValueError, match=message):
        getattr(PACKAGES[path], case.function_name)(params, case.make_input(), padding_mask, **case.kwargs())


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("block", ["attend", "attend_heads"])
def test_attend_names_its_dropout_rate(package, block):
    arrays = block_arrays(block)
    fn = getattr(PACKAGES[package], block)
    if block == "attend":
        first = (arrays["queries"], arrays["keys"], arrays["values"])
    else:
        first = (arrays["x"], (arrays["qkv[0]"], arrays["qkv[1]"]), N)
    with pytest.raises(ValueError, match=r"^dropout.rate must be in \[0, 1\), got 1.0(\n|$)"):
        fn(*first, numpy_attn.Masking(), numpy_attn.AttnDropout(1.0))


OPTIONAL = ("mask", "padding_mask", "attn_keep_mask", "keep_mask", "bias", "qkv[1]")


@pytest.mark.parametrize("path", ["numpy", "jax", "jit"])
@pytest.mark.parametrize(
    "block, name",
    [(block, name) for block in BLOCKS for name in block_arrays(block) if name not in OPTIONAL],
)
def test_none_for_a_required_array_of_a_building_block_is_named(path, block, name):
    """None is refused as any other non-array (it used to be skipped: an AttributeError later,
    or dropout(None, p) returned None); only a bias or a mask may be None."""
    arrays = block_arrays(block)
    arrays[name] = None
    package = numpy_attn if path == "numpy" else jax_attn
    run = functools.partial(call_block, package, block)
    with pytest.raises(TypeError, match=f"^{re.escape(name)} must be an array, got NoneType(\n|$)"):
        jax.jit(run)(arrays) if path == "jit" else run(arrays)


@pytest.mark.parametrize("package", list(PACKAGES))
def test_none_for_a_required_array_of_the_blockwise_blocks_is_named(package):
    fn = PACKAGES[package]
    queries, weight = block_arrays("attend")["queries"], block_arrays("split_projection")["weight"]
    x = block_arrays("attend_heads")["x"]
    with pytest.raises(TypeError, match=r"^values must be an array, got NoneType$"):
        fn.blockwise_attention(queries, queries, None)
    with pytest.raises(TypeError, match=r"^x must be an array, got NoneType$"):
        fn.blockwise_self_attention(None, weight, None, num_heads=N)
    with pytest.raises(TypeError, match=r"^weight must be an array, got NoneType$"):
        fn.blockwise_self_attention(x, None, None, num_heads=N)
    assert fn.blockwise_self_attention(x, weight, None, num_heads=N).shape == (B, T, 4)  # no bias


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("block", ["attend", "attend_heads"])
@pytest.mark.parametrize("option", ["masking", "dropout", "path"])
@pytest.mark.parametrize("value", [None, "blockwise"])
def test_attend_options_of_another_type_are_named(package, block, option, value):
    """Not an AttributeError on ``masking.padding_mask``: a TypeError naming the argument."""
    arrays = block_arrays(block)
    if block == "attend":
        first = (arrays["queries"], arrays["keys"], arrays["values"])
    else:
        first = (arrays["x"], (arrays["qkv[0]"], arrays["qkv[1]"]), N)
    options = {
        "masking": numpy_attn.Masking(),
        "dropout": numpy_attn.AttnDropout(),
        "path": numpy_attn.ComputePath(),
    }
    kind = type(options[option]).__name__
    options[option] = value
    message = f"{option} must be a numpy_attn.{kind}, got {type(value).__name__}"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        getattr(PACKAGES[package], block)(*first, *options.values())


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize(
    "qkv, got", [("one", "tuple of length 1"), ("three", "tuple of length 3"), ("array", "ndarray")]
)
def test_attend_heads_qkv_must_be_a_weight_bias_pair(package, qkv, got):
    arrays = block_arrays("attend_heads")
    weight, bias = arrays["qkv[0]"], arrays["qkv[1]"]
    given = {"one": (weight,), "three": (weight, bias, bias), "array": weight}[qkv]
    message = f"qkv must be a (weight, bias) pair, bias None for none, got {got}"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        PACKAGES[package].attend_heads(arrays["x"], given, N)
    expected = PACKAGES[package].attend_heads(arrays["x"], (weight, None), N)[0]  # a list is a pair too
    np.testing.assert_array_equal(PACKAGES[package].attend_heads(arrays["x"], [weight, None], N)[0], expected)


def qkv_params(bias=True):
    """``W_query``, ``W_key`` and ``W_value`` ``(4, D)`` (E = 4), with biases, and an
    ``out_proj`` weight: the keys of a bigger layer, which ``qkv_projections`` ignores."""
    rng = np.random.default_rng(11)
    params = {f"{n}.weight": rng.standard_normal((4, D)).astype(np.float32) for n in QKV}
    if bias:
        params |= {f"{n}.bias": rng.standard_normal(4).astype(np.float32) for n in QKV}
    return params | {"out_proj.weight": rng.standard_normal((4, 4)).astype(np.float32)}


def without(*keys):
    return lambda params: {k: v for k, v in params.items() if k not in keys}


def replaced(key, change):
    return lambda params: params | {key: change(params[key])}


MISSING = "params do not fit qkv_projections: missing keys"
PARTIAL = "(biases for the three projections or none, got"
QKV_BAD = [  # (change of the params, change of x, fused, error, message)
    (lambda p: list(p.items()), None, False, TypeError,
     "params must be a mapping of str to arrays, got list"),
    (lambda p: p | {0: p["W_key.weight"]}, None, False, TypeError,
     "params must be a mapping of str to arrays, got key 0 (int)"),
    (without("W_key.weight", "W_value.weight"), None, False, ValueError,
     f"{MISSING} ['W_key.weight', 'W_value.weight']"),
    (without("W_key.bias", "W_value.bias"), None, True, ValueError,
     f"{MISSING} ['W_key.bias', 'W_value.bias'] {PARTIAL} ['W_query.bias'])"),
    (without("W_query.bias"), None, False, ValueError,
     f"{MISSING} ['W_query.bias'] {PARTIAL} ['W_key.bias', 'W_value.bias'])"),
    (replaced("W_value.weight", lambda w: w[:3]), None, False, ValueError,
     "params do not fit qkv_projections: mis-shaped keys: 'W_value.weight' has shape (3, 3), "
     "expected (4, 3)"),
    (replaced("W_key.bias", lambda b: b[:1]), None, True, ValueError,
     "params do not fit qkv_projections: mis-shaped keys: 'W_key.bias' has shape (1,), expected (4,)"),
    (replaced("W_query.weight", lambda w: w[0]), None, False, ValueError,
     "params do not fit qkv_projections: mis-shaped keys: 'W_query.weight' has shape (3,), expected (E, D)"),
    (replaced("W_key.weight", lambda w: w.tolist()), None, False, TypeError,
     "params['W_key.weight'] must be an array, got list"),
    (None, lambda x: x[..., :2], False, ValueError,
     "params['W_query.weight'] must have shape (out_features, in_features) with in_features=2 "
     "(x has shape (2, 3, 2)), got shape (4, 3)"),
    (None, lambda x: x.astype(np.float16), True, TypeError,
     "params['W_query.weight'] has dtype float32 but x has dtype float16"),
    (replaced("W_value.bias", lambda b: b.astype(np.float16)), None, False, TypeError,
     "params['W_value.bias'] has dtype float16 but x has dtype float32"),
    (None, lambda x: x[0].view(np.matrix), False, TypeError,
     "x must be an array, got numpy.matrix (always 2-D, * a matrix product): pass np.asarray(x)"),
    (None, None, 1, TypeError, "fused must be a bool, got 1 (int)"),
]  # fmt: skip


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("change_params, change_x, fused, error, message", QKV_BAD)
def test_qkv_projections_checks_its_arguments(package, change_params, change_x, fused, error, message):
    """It checked nothing: KeyError for a missing weight, a bias of W_query alone ignored (or
    W_query's used alone), NumPy's or JAX's own errors for shapes, silent promotion of dtypes."""
    params, x = qkv_params(), block_arrays("linear")["x"]
    params = change_params(params) if change_params else params
    x = change_x(x) if change_x else x
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        PACKAGES[package].qkv_projections(x, params, fused=fused)


@pytest.mark.parametrize("package", list(PACKAGES))
def test_qkv_weights_checks_its_params(package):
    qkv_weights, params = PACKAGES[package].qkv_weights, qkv_params()
    message = f"params do not fit qkv_weights: missing keys ['W_query.bias', 'W_value.bias'] {PARTIAL}"
    with pytest.raises(ValueError, match=f"^{re.escape(message + ' [' + repr('W_key.bias') + '])')}$"):
        qkv_weights(without("W_query.bias", "W_value.bias")(params))
    message = "params['W_key.weight'] has dtype float16 but params['W_query.weight'] has dtype float32"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        qkv_weights(replaced("W_key.weight", lambda w: w.astype(np.float16))(params))
    message = (
        "params do not fit qkv_weights: mis-shaped keys: 'W_key.weight' has shape (4, 2), expected (4, 3)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qkv_weights(replaced("W_key.weight", lambda w: w[:, :2])(params))
    with pytest.raises(TypeError, match=r"^params must be a mapping of str to arrays, got NoneType$"):
        qkv_weights(None)


def test_qkv_projections_checks_under_jit_too():
    """Shapes and dtypes are checked while tracing (JAX adds a line to the message)."""
    params, x = qkv_params(), block_arrays("linear")["x"]
    message = "params['W_value.bias'] has dtype float16 but x has dtype float32"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}(\n|$)"):
        jax.jit(jax_attn.qkv_projections)(x, replaced("W_value.bias", lambda b: b.astype(np.float16))(params))
    message = "params do not fit qkv_weights: missing keys ['W_key.bias'] "
    message += f"{PARTIAL} ['W_query.bias', 'W_value.bias'])"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}(\n|$)"):
        jax.jit(jax_attn.qkv_weights)(without("W_key.bias")(params))


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("bias", [True, False])
def test_qkv_projections_are_the_three_linears_and_qkv_weights_their_stack(package, bias):
    fn, params, x = PACKAGES[package], qkv_params(bias), block_arrays("linear")["x"]
    names = ("W_query", "W_key", "W_value")
    expected = [np.asarray(fn.linear(x, params[f"{n}.weight"], params.get(f"{n}.bias"))) for n in names]
    for got, want in zip(fn.qkv_projections(x, params), expected, strict=True):  # the same ops: the same bits
        np.testing.assert_array_equal(np.asarray(got), want)
    for got, want in zip(fn.qkv_projections(x, params, fused=True), expected, strict=True):  # one matmul
        np.testing.assert_allclose(np.asarray(got), want, *tolerance_for(str(x.dtype)))
    weight, stacked_bias = fn.qkv_weights(params)
    np.testing.assert_array_equal(np.asarray(weight), np.concatenate([params[f"{n}.weight"] for n in names]))
    if bias:
        np.testing.assert_array_equal(
            np.asarray(stacked_bias), np.concatenate([params[f"{n}.bias"] for n in names])
        )
    else:
        assert stacked_bias is None


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize(
    "rate, got",
    [
        (10**400, "an int of 1329 bits"),
        (-(10**5000), "an int of 16610 bits"),
        (10**18, "1000000000000000000"),
    ],
    ids=["1e400", "-1e5000", "1e18"],
)
def test_a_huge_int_dropout_rate_is_the_range_error(package, rate, got):
    """Not OverflowError (``float(p)``) or Python's refusal to print a long int."""
    x = block_arrays("dropout")["x"]
    with pytest.raises(ValueError, match=f"^p must be in \\[0, 1\\), got {got}$"):
        PACKAGES[package].dropout(x, rate)
    with pytest.raises(ValueError, match=f"^dropout must be in \\[0, 1\\), got {got}$"):
        PACKAGES[package].scaled_dot_product_attention(x, x, x, dropout=rate)


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("dtype, rate_type", [("float32", np.float64), ("float16", np.float32)])
def test_a_numpy_scalar_dropout_rate_keeps_x_dtype_and_bits(package, dtype, rate_type):
    """The rate is a Python float to the scaling: an np.float64 rate promoted float32 x to
    float64 in numpy_attn, an np.float32 one float16 x to float32 in both packages."""
    arrays = block_arrays("scaled_dot_product_attention", dtype)
    x, attn_keep = arrays["queries"], arrays["attn_keep_mask"]
    keep = np.random.default_rng(5).random(x.shape) >= 0.5
    fn = PACKAGES[package]
    for rate in (0.5, 0.1):
        expected = fn.dropout(x, rate, keep_mask=keep)
        actual = fn.dropout(x, rate_type(rate), keep_mask=keep)
        assert actual.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))
        attention = [
            fn.scaled_dot_product_attention(x, x, x, dropout=p, attn_keep_mask=attn_keep)
            for p in (rate, rate_type(rate))
        ]
        assert attention[1].dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(attention[1]), np.asarray(attention[0]))
        blockwise = [
            fn.blockwise_attention(x, x, x, dropout=p, attn_keep_mask=attn_keep, block_size=2)
            for p in (rate, rate_type(rate))
        ]  # numpy_attn's tiles scaled by 1 / (1 - np.float64(0.1)) in float64: 2e-7 off
        assert blockwise[1].dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(blockwise[1]), np.asarray(blockwise[0]))


def test_a_numpy_scalar_drop_rate_in_a_gpt_config_keeps_float32():
    """numpy_attn's gpt_model raised 'params[...] has dtype float32 but x has dtype float64'."""
    cfg = {
        "vocab_size": 11,
        "context_length": 6,
        "emb_dim": 4,
        "n_heads": 2,
        "n_layers": 1,
        "drop_rate": 0.1,
        "qkv_bias": False,
    }
    params = {k: np.full(s, 0.1, np.float32) for k, s in numpy_attn.gpt_param_shapes(cfg).items()}
    ids = np.array([[1, 2]])
    logits = [
        numpy_attn.gpt_model(params, ids, cfg | {"drop_rate": rate}, rng=np.random.default_rng(0))
        for rate in (0.1, np.float64(0.1))
    ]
    assert logits[1].dtype == np.float32
    np.testing.assert_array_equal(logits[1], logits[0])
