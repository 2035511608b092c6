"""Rotary position embeddings (RoPE), as the book's Llama 3 and Qwen3 and transformers rotate.

A head's vector ``x`` of even size H at position p is cut into halves ``x1 = x[:H/2]``, ``x2 =
x[H/2:]``, and pair i, ``(x1[i], x2[i])``, is rotated by the angle ``p * inv_freq[i]``: ``x * cos +
rotate_half(x) * sin`` with ``rotate_half(x) = [-x2, x1]`` (the half-split rotation, not the
RoFormer paper's interleaved pairs). The dot product of a query at position p and a key at
position s then depends on p - s alone.

Precision: ``inv_freq`` is ``decoder_spec.rope_frequencies``' float32; the angles are float32
products ``position * inv_freq``; cos, sin and the rotation are computed in x's dtype promoted to
at least float32, and cast back to x's dtype. ``jax_attn/rope.py`` is the same file in JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.decoder_spec import rope_frequencies


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each ``(..., T, H)`` in ``dtype``: of the angles ``positions * inv_freq``, both halves.

    Args: positions integer ``(..., T)``; inv_freq float32 ``(H/2,)``.
    """
    angles = positions.astype(np.float32)[..., None] * inv_freq  # (..., T, H/2), float32 products
    angles = np.concatenate([angles, angles], axis=-1).astype(dtype)  # (..., T, H)
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``x * cos + rotate_half(x) * sin`` in cos's dtype, cast to x's: x ``(..., T, H)``, cos and sin
    ``(T, H)``. Returns: x's shape and dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # 2 x (..., T, H/2)
    rotated = np.concatenate([-x2, x1], axis=-1)  # (..., T, H)
    return (x.astype(cos.dtype) * cos + rotated.astype(cos.dtype) * sin).astype(x.dtype)


def rope(
    x: np.ndarray, *, rope_base: float = 10_000.0, rope_freq: Mapping[str, Any] | None = None, offset: int = 0
) -> np.ndarray:
    """RoPE: ``x`` ``(..., T, H)`` (H even; heads ``(B, N, T, H)``) with token t rotated for position
    ``offset + t`` (``offset``: the tokens before, a KV cache's length).

    Args: rope_base the frequencies' base (the book's ``rope_base``, transformers' ``rope_theta``);
    rope_freq None or Llama 3's frequency scaling (``decoder_spec.rope_frequencies``).
    Returns: x's shape and dtype.
    """
    num_tokens, head_size = x.shape[-2], x.shape[-1]
    inv_freq = rope_frequencies(head_size, rope_base, rope_freq)  # (H/2,)
    positions = offset + np.arange(num_tokens)  # (T,)
    cos, sin = rope_cos_sin(positions, inv_freq, np.promote_types(x.dtype, np.float32))  # 2 x (T, H)
    return apply_rope(x, cos, sin)
