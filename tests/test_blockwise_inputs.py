"""``blockwise_attention`` and ``blockwise_self_attention`` check their input as the other
building blocks do (``scaled_dot_product_attention``'s checks and words), the same in numpy_attn,
jax_attn and under ``jax.jit`` (the layers' blockwise path runs none of these checks:
tests/test_fast_checks.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jax_attn
import numpy_attn
from parity_tests.tolerances import tolerance_for

RNG = np.random.default_rng(20)
QUERIES = RNG.standard_normal((2, 2, 6, 4)).astype(np.float32)  # (B, N, T, H)
X = RNG.standard_normal((2, 5, 3)).astype(np.float32)  # (B, T, D)
WEIGHT = RNG.standard_normal((12, 3)).astype(np.float32)  # (3E, D), E = 4
BIAS = RNG.standard_normal(12).astype(np.float32)
TORCH_ADVICE = (
    "which NumPy cannot read: pass a NumPy or JAX array (a torch tensor t: t.detach().cpu().numpy(), "
    "bfloat16 after .float(); a torch module's weights: torch_ref.to_params(module))"
)


def raised(call):
    """``(type, text)`` of the exception ``call()`` raises."""
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def errors_alike(function_name, arguments, jit=True):
    """The errors of numpy_attn's and jax_attn's ``function_name`` on the same ``arguments`` (NumPy
    arrays, lists, torch tensors; ``num_heads`` and flags), and under ``jax.jit``, where the native
    NumPy arrays are traced arguments and the rest are closed over (jit takes no big-endian array
    or torch tensor): the check applies while tracing."""
    numpy_function = getattr(numpy_attn, function_name)
    jax_function = getattr(jax_attn, function_name)
    found = [raised(lambda: numpy_function(**arguments)), raised(lambda: jax_function(**arguments))]
    if jit:
        traced = {
            name: value
            for name, value in arguments.items()
            if isinstance(value, np.ndarray) and value.dtype.isnative and value.dtype != np.float64
        }
        fixed = {name: value for name, value in arguments.items() if name not in traced}
        found.append(raised(lambda: jax.jit(lambda **arrays: jax_function(**arrays, **fixed))(**traced)))
    return found


ATTENTION_ERRORS = {
    "integer": (
        {
            "queries": QUERIES.astype(np.int32),
            "keys": QUERIES.astype(np.int32),
            "values": QUERIES.astype(np.int32),
        },
        TypeError,
        "queries must have a floating dtype (float16, float32, float64; bfloat16 in jax_attn), "
        "got int32 with shape (2, 2, 6, 4)",
    ),
    "big_endian": (
        {"queries": QUERIES.astype(">f4")},
        TypeError,
        "queries has dtype >f4, big-endian; give it in the machine's byte order: .astype(np.float32)",
    ),
    "mixed_dtypes": (
        {"keys": QUERIES.astype(np.float16)},
        TypeError,
        "keys has dtype float16 but queries has dtype float32",
    ),
    "fewer_values": (
        {"values": QUERIES[..., :5, :]},
        ValueError,
        "values must have shape (..., S, Hv) with S=6 (keys have shape (2, 2, 6, 4)), got shape (2, 2, 5, 4)",
    ),
    "keys_of_another_head_size": (
        {"keys": QUERIES[..., :1]},
        ValueError,
        "keys must have shape (..., S, H) with H=4 (queries have shape (2, 2, 6, 4)), got shape (2, 2, 6, 1)",
    ),
    "torch_tensors": (
        {name: torch.from_numpy(QUERIES) for name in ("queries", "keys", "values")},
        TypeError,
        f"queries is a torch.Tensor with dtype torch.float32, {TORCH_ADVICE}",
    ),
}
PADDING_ERRORS = {
    "short_padding_mask": (
        np.ones((2, 5), bool),
        ValueError,
        "padding_mask must be a bool array of shape (B, S) = (2, 6), got bool array of shape (2, 5)",
    ),
    "list_padding_mask": ([[False] * 6] * 2, TypeError, "padding_mask must be an array, got list"),
    "torch_padding_mask": (
        torch.zeros((2, 6), dtype=torch.bool),
        TypeError,
        f"padding_mask is a torch.Tensor with dtype torch.bool, {TORCH_ADVICE}",
    ),
}


@pytest.mark.parametrize("name", list(ATTENTION_ERRORS))
def test_blockwise_attention_refuses_bad_operands_as_scaled_dot_product_attention_does(name):
    """Integer, big-endian, mixed dtypes, values of fewer keys, keys of another head size and
    torch tensors: before, NumPy's and JAX's own errors, or (mixed dtypes, fewer values in
    jax_attn) a result."""
    changes, error, message = ATTENTION_ERRORS[name]
    arguments = {"queries": QUERIES, "keys": QUERIES, "values": QUERIES} | changes
    assert errors_alike("blockwise_attention", arguments) == [(error, message)] * 3
    # scaled_dot_product_attention's error for the same mistake
    assert raised(lambda: numpy_attn.scaled_dot_product_attention(**arguments)) == (error, message)


@pytest.mark.parametrize(
    "changed, shape",
    [("keys", (1, 2, 6, 4)), ("values", (2, 1, 6, 4)), ("keys", (2, 6, 4))],
    ids=["keys_of_one_batch", "values_of_one_head", "keys_without_the_head_axis"],
)
def test_blockwise_attention_refuses_keys_or_values_of_other_leading_axes_alike(changed, shape):
    """scaled_dot_product_attention broadcasts a leading axis of 1; the blocks, cut per batch and
    head, do not: numpy_attn raised an error from inside its loop (a concatenation or an index),
    jax_attn returned the broadcast result."""
    arguments = {"queries": QUERIES, "keys": QUERIES, "values": QUERIES}
    arguments[changed] = np.broadcast_to(QUERIES[:1, :1], shape).copy() if len(shape) == 4 else QUERIES[0]
    message = (
        f"{changed} must have the leading axes (2, 2) of queries (the blockwise path cuts its blocks "
        f"per batch and head), got shape {shape}"
    )
    assert errors_alike("blockwise_attention", arguments) == [(ValueError, message)] * 3
    for package in (numpy_attn, jax_attn):  # attend, on every path: one answer whatever the implementation
        for implementation in ("reference", "blockwise", "auto"):
            with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
                package.attend(*arguments.values(), path=package.ComputePath(implementation))


@pytest.mark.parametrize("name", list(PADDING_ERRORS))
def test_blockwise_attention_refuses_a_bad_padding_mask_alike(name):
    """Before: a raw broadcast error or a result in numpy_attn, a result that took key 6 for
    visible, an AttributeError or an odd TypeError in jax_attn."""
    padding_mask, error, message = PADDING_ERRORS[name]
    arguments = {"queries": QUERIES, "keys": QUERIES, "values": QUERIES, "padding_mask": padding_mask}
    assert errors_alike("blockwise_attention", arguments) == [(error, message)] * 3


def test_jax_blockwise_attention_refuses_float64_without_x64():
    """Before, computed in float32 without a word. (Under jax.jit JAX casts float64 arguments to
    float32 before any function runs: JAX's rule.)"""
    queries = QUERIES.astype(np.float64)
    message = (
        "queries has dtype float64, which JAX computes in float32 unless 64-bit mode is on: call "
        "jax.config.update('jax_enable_x64', True) at start-up (or compute inside "
        "`with jax.enable_x64(True):`), or pass float32 arrays"
    )
    with jax.enable_x64(False):
        assert raised(lambda: jax_attn.blockwise_attention(queries, queries, queries)) == (TypeError, message)
        assert raised(lambda: jax_attn.scaled_dot_product_attention(queries, queries, queries)) == (
            TypeError,
            message,
        )
        assert raised(
            lambda: jax_attn.blockwise_self_attention(X.astype(np.float64), WEIGHT, num_heads=2)
        ) == (
            TypeError,
            message.replace("queries", "x", 1),
        )


SELF_ATTENTION_ERRORS = {
    "integer_weight": (
        {"weight": WEIGHT.astype(np.int32)},
        TypeError,
        "weight must have a floating dtype (float16, float32, float64; bfloat16 in jax_attn), "
        "got int32 with shape (12, 3)",
    ),
    "torch_weight": (
        {"weight": torch.from_numpy(WEIGHT)},
        TypeError,
        f"weight is a torch.Tensor with dtype torch.float32, {TORCH_ADVICE}",
    ),
    "torch_bias": (
        {"bias": torch.from_numpy(BIAS)},
        TypeError,
        f"bias is a torch.Tensor with dtype torch.float32, {TORCH_ADVICE}",
    ),
    "torch_x": (
        {"x": torch.from_numpy(X)},
        TypeError,
        f"x is a torch.Tensor with dtype torch.float32, {TORCH_ADVICE}",
    ),
    "big_endian_bias": (
        {"bias": BIAS.astype(">f4")},
        TypeError,
        "bias has dtype >f4, big-endian; give it in the machine's byte order: .astype(np.float32)",
    ),
    "half_weight": (
        {"weight": WEIGHT.astype(np.float16)},
        TypeError,
        "weight has dtype float16 but x has dtype float32",
    ),
    "narrow_weight": (
        {"weight": WEIGHT[:, :2]},
        ValueError,
        "weight must have shape (3E, D) with D=3 (x has shape (2, 5, 3)), got shape (12, 2)",
    ),
    "torch_padding_mask": (
        {"padding_mask": torch.zeros((2, 5), dtype=torch.bool)},
        TypeError,
        f"padding_mask is a torch.Tensor with dtype torch.bool, {TORCH_ADVICE}",
    ),
}


@pytest.mark.parametrize("name", list(SELF_ATTENTION_ERRORS))
def test_blockwise_self_attention_refuses_bad_arrays_alike(name):
    """A torch weight or bias gave NumPy's "Cannot interpret 'torch.float32' as a data type";
    the other errors were already alike: they stay so, on NumPy inputs and under jax.jit."""
    changes, error, message = SELF_ATTENTION_ERRORS[name]
    arguments = {"x": X, "weight": WEIGHT, "bias": BIAS, "num_heads": 2} | changes
    assert errors_alike("blockwise_self_attention", arguments) == [(error, message)] * 3


@pytest.mark.parametrize("dropout", [None, 0.25])
def test_jax_blockwise_functions_take_numpy_arrays(dropout):
    """NumPy x, weight and keep mask (before: TracerArrayConversionError, x[b] and the keep mask
    indexed with the loop's traced index); the same context as from JAX arrays and numpy_attn."""
    keep = np.random.default_rng(21).random((2, 2, 5, 5)) > 0.25  # (B, N, T, T), True = keep
    kwargs = {"num_heads": 2, "causal": True, "block_size": 5, "dropout": dropout}
    kwargs |= {"attn_keep_mask": keep} if dropout else {}
    expected = numpy_attn.blockwise_self_attention(X, WEIGHT, BIAS, **kwargs)
    from_numpy = jax_attn.blockwise_self_attention(X, WEIGHT, BIAS, **kwargs)
    from_jax = jax_attn.blockwise_self_attention(
        jnp.asarray(X),
        jnp.asarray(WEIGHT),
        jnp.asarray(BIAS),
        **kwargs | {"attn_keep_mask": jnp.asarray(keep)},
    )
    np.testing.assert_array_equal(from_numpy, from_jax)
    np.testing.assert_allclose(from_numpy, expected, *tolerance_for("float32"))
    heads = [QUERIES[..., :5, :]] * 3
    keep_mask = keep if dropout else None
    attention = {"dropout": dropout, "attn_keep_mask": keep_mask, "causal": True, "block_size": 5}
    np.testing.assert_allclose(
        jax_attn.blockwise_attention(*heads, **attention),
        numpy_attn.blockwise_attention(*heads, **attention),
        *tolerance_for("float32"),
    )
