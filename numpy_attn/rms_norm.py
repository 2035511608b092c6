"""RMSNorm, the normalisation of the book's Llama 3 and Qwen3 (``jax_attn/rms_norm.py`` is its mirror)."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, *, eps: float = 1e-6) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis (no mean subtracted, no shift),
    computed in x's dtype promoted to at least float32 (the book's Qwen3 RMSNorm), cast back.

    Args: x ``(..., D)``; weight ``(D,)`` (a torch ``nn.RMSNorm``'s ``weight``, the book's ``scale``).
    Returns: ``(..., D)``, x's dtype.
    """
    x_acc = x.astype(np.promote_types(x.dtype, np.float32))
    variance = (x_acc**2).mean(axis=-1, keepdims=True)  # (..., 1)
    norm_x = x_acc / np.sqrt(variance + eps)
    return (norm_x * weight.astype(x_acc.dtype)).astype(x.dtype)
