"""RMSNorm, the normalisation of the book's Llama 3 and Qwen3 (``numpy_attn/rms_norm.py`` is its mirror)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (no mean subtracted, no shift), computed in
    x's dtype promoted to at least float32 (the book's Qwen3 RMSNorm), cast back. As
    ``numpy_attn.rms_norm``."""
    x_acc = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    variance = (x_acc**2).mean(axis=-1, keepdims=True)  # (..., 1)
    norm_x = x_acc / jnp.sqrt(variance + eps)
    return (norm_x * weight.astype(x_acc.dtype)).astype(x.dtype)
