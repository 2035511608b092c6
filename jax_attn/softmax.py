"""Softmax, the numerically stable one and the notes' naive one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpy_attn.softmax import compute_dtype
from numpy_attn.validation import check_axis

from jax_attn.checks import check_jax_operands

__all__ = ["softmax", "softmax_naive", "unchecked_softmax"]


def softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """Softmax along ``axis`` of a floating array: ``unchecked_softmax`` after the building blocks'
    input checks (TypeError for a non-array, another framework's tensor, a non-floating dtype,
    float64 without 64-bit mode) and ``check_axis``'s (a 0-d x, or an axis out of range, is a
    ValueError naming x's shape and the axis). An empty axis gives an empty array, as in
    numpy_attn."""
    check_jax_operands(x=x)
    check_axis(x.shape, axis)
    return unchecked_softmax(x, axis)


def unchecked_softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``softmax`` for arguments already checked (the layers'): along ``axis``, subtracting the
    maximum first so that ``exp`` cannot overflow.

    float16 and bfloat16 are computed in float32 and cast back. A slice whose every entry is
    ``-inf`` (every key masked) gives zeros, not the NaN of ``torch.softmax``; NaN still
    propagates to its own slice. The maximum is a constant for differentiation, as in
    ``jax.nn.softmax``, so fully masked slices have zero (not NaN) gradients. An empty axis
    gives an empty array (the maximum of nothing is not taken).
    """
    if x.shape[axis] == 0:  # static: no cost on the compiled path
        return jnp.asarray(x)
    x_acc = x.astype(compute_dtype(x.dtype))
    x_max = jnp.max(x_acc, axis=axis, keepdims=True)
    x_max = jax.lax.stop_gradient(jnp.where(x_max == -jnp.inf, 0, x_max))  # fully masked: 0
    unnormalized = jnp.exp(x_acc - x_max)
    denominator = jnp.sum(unnormalized, axis=axis, keepdims=True)
    # times the reciprocal of the sum, as torch's CPU softmax kernel does
    weights = unnormalized * (1 / jnp.where(denominator == 0, 1, denominator))
    return weights.astype(x.dtype)


def softmax_naive(x: jax.Array, axis: int = -1) -> jax.Array:
    """The notes' ``exp(x) / exp(x).sum()``: overflows to NaN for large inputs (kept to show it).
    ``softmax``'s input checks, with its errors."""
    check_jax_operands(x=x)
    check_axis(x.shape, axis)
    return jnp.exp(x) / jnp.sum(jnp.exp(x), axis=axis, keepdims=True)
