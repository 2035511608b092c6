"""One rule per kind of bad input, the same error in numpy_attn, jax_attn eager and under
``jax.jit``: dtype mismatches, float64 without JAX's 64-bit mode, torch tensors, ``rng``/``key``
of the wrong type, bad ``context_length``/``context_size``, and float16 scores beyond its range."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jax_attn
import numpy_attn
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


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_key_that_is_not_a_jax_random_key_is_a_type_error(dropout):
    case, params = case_and_params("MultiHeadAttention")
    x = case.make_input()
    message = r"key must be a jax.random key \(jax.random.key\(seed\)\) or None, got "
    with pytest.raises(TypeError, match=message + r"an array of dtype int32, shape \(\)"):
        call("jax", case, params, x, dropout=dropout, key=0)
    with pytest.raises(TypeError, match=message + r"0 \(int\)"):
        jax_attn.dropout(jnp.ones(3), 0.5, key=0)
    for key in (jax.random.key(0), jax.random.PRNGKey(0)):  # typed and raw keys are accepted
        assert jax_attn.dropout(jnp.ones(3), 0.5, key=key).shape == (3,)


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
