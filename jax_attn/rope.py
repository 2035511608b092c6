"""Rotary position embeddings (RoPE): ``numpy_attn.rope`` in JAX (its docstring says how and in
which precision). ``inv_freq`` is a function of the sizes, computed by NumPy at trace time; the
position may be traced (a KV cache's length).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from numpy_attn.decoder_spec import rope_frequencies


def rope_cos_sin(positions: jax.Array, inv_freq: Any, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)``, each ``(..., T, H)`` in ``dtype``: of the angles ``positions * inv_freq``, both halves.
    As ``numpy_attn.rope.rope_cos_sin``."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (..., T, H/2), float32 products
    angles = jnp.concatenate([angles, angles], axis=-1).astype(dtype)  # (..., T, H)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x * cos + rotate_half(x) * sin`` in cos's dtype, cast to x's: x ``(..., T, H)``, cos and sin
    ``(T, H)``. Returns: x's shape and dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # 2 x (..., T, H/2)
    rotated = jnp.concatenate([-x2, x1], axis=-1)  # (..., T, H)
    return (x.astype(cos.dtype) * cos + rotated.astype(cos.dtype) * sin).astype(x.dtype)


def rope(
    x: jax.Array, *, rope_base: float = 10_000.0, rope_freq: Mapping[str, Any] | None = None,
    offset: int | jax.Array = 0,
) -> jax.Array:  # fmt: skip
    """RoPE: ``x`` ``(..., T, H)`` (H even; heads ``(B, N, T, H)``) with token t rotated for position
    ``offset + t`` (``offset``: the tokens before, a KV cache's length). As ``numpy_attn.rope``; ``offset``
    may be traced under ``jax.jit``."""
    num_tokens, head_size = x.shape[-2], x.shape[-1]
    inv_freq = rope_frequencies(head_size, rope_base, rope_freq)  # (H/2,)
    positions = offset + jnp.arange(num_tokens)  # (T,)
    cos, sin = rope_cos_sin(positions, inv_freq, jnp.promote_types(x.dtype, jnp.float32))  # 2 x (T, H)
    return apply_rope(x, cos, sin)
