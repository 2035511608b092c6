"""Softmax, the numerically stable one and the notes' naive one."""

from __future__ import annotations

from typing import Any

import numpy as np

from numpy_attn.validation import NUMPY_FLOATS, check_axis, check_operands

__all__ = ["compute_dtype", "softmax", "softmax_naive", "unchecked_softmax"]


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype scores, softmax and the blockwise path's sums and context are computed in:
    float32 for half-precision inputs (float16, bfloat16), whose scores can exceed float16's
    range and whose running sums grow with the sequence; the input dtype otherwise. NumPy or JAX
    dtypes: the one rule of both packages' softmax, reference path and blockwise path."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` of a floating array: ``unchecked_softmax`` after the building blocks'
    input checks (TypeError for a non-array, another framework's tensor, a non-floating dtype)
    and ``check_axis``'s (a 0-d x, or an axis out of range, is a ValueError naming x's shape and
    the axis). An empty axis gives an empty array, as in jax_attn."""
    check_operands(NUMPY_FLOATS, x=x)
    check_axis(x.shape, axis)
    return unchecked_softmax(x, axis)


def unchecked_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``softmax`` for arguments already checked (the layers'): along ``axis``, subtracting the
    maximum first so that ``exp`` cannot overflow.

    float16 and bfloat16 are computed in float32 and cast back. A slice whose every entry is
    ``-inf`` (every key masked) gives zeros, not the NaN of ``torch.softmax``; NaN still
    propagates to its own slice.
    """
    x_acc = x.astype(compute_dtype(x.dtype), copy=False)
    # at least the lowest finite value: a fully masked slice's exp(-inf - lowest) = 0
    x_max = x_acc.max(axis=axis, keepdims=True, initial=np.finfo(x_acc.dtype).min)
    unnormalized = np.exp(x_acc - x_max)
    denominator = unnormalized.sum(axis=axis, keepdims=True)
    # >= 1, the maximum's exp(0) being in it, but for a fully masked slice's 0 (its zeros stay zeros)
    np.maximum(denominator, 1, out=denominator)
    # times the reciprocal of the sum, as torch's CPU softmax kernel does
    weights = unnormalized * (1 / denominator)
    return weights.astype(x.dtype, copy=False)


def softmax_naive(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The notes' ``exp(x) / exp(x).sum()``: overflows to NaN for large inputs (kept to show it).
    ``softmax``'s input checks, with its errors."""
    check_operands(NUMPY_FLOATS, x=x)
    check_axis(x.shape, axis)
    return np.exp(x) / np.sum(np.exp(x), axis=axis, keepdims=True)
