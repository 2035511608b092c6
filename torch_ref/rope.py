"""Rotary position embeddings (RoPE) as the book's Llama 3 and Qwen3 use them: the oracle's own code.

A head's vector ``x`` of even size H at position p is cut into halves ``x1 = x[:H/2]``, ``x2 =
x[H/2:]`` and pair i = ``(x1[i], x2[i])`` is rotated by the angle ``p * inv_freq[i]``, with
``inv_freq[i] = rope_base ** (-2i / H)`` (the half-split rotation of the book and transformers, not
the interleaved pairs of the RoFormer paper). Llama 3 lowers the low frequencies (``freq_config``:
``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_context_length``).

Precision, the same in numpy_attn and jax_attn: ``inv_freq`` is computed in float64 and kept in
float32 (the book and transformers keep it in float32); the angles are float32 products
``position * inv_freq``; cos, sin and the rotation are computed in x's dtype promoted to at least
float32, and the result is cast back to x's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["FREQ_CONFIG_KEYS", "apply_rope", "compute_rope_params", "rope_frequencies"]

FREQ_CONFIG_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_context_length")


def rope_frequencies(
    head_dim: int, theta_base: float = 10_000.0, freq_config: Mapping[str, Any] | None = None
) -> torch.Tensor:
    """``inv_freq`` ``(H/2,)`` float32: ``theta_base ** (-2i / H)``, with Llama 3's scaling.

    Llama 3: a frequency whose wavelength ``2 pi / f`` exceeds ``original_context_length /
    low_freq_factor`` is divided by ``factor``; one below ``original_context_length /
    high_freq_factor`` is kept; between, ``(1 - s) f / factor + s f`` with ``s =
    (original_context_length / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
    """
    inv_freq = [1.0 / theta_base ** (2 * i / head_dim) for i in range(head_dim // 2)]  # float64 (Python)
    if freq_config is not None:
        factor, context = freq_config["factor"], freq_config["original_context_length"]
        low, high = freq_config["low_freq_factor"], freq_config["high_freq_factor"]
        scaled = []
        for freq in inv_freq:
            wavelength = 2 * math.pi / freq
            if wavelength < context / high:  # high frequencies: kept
                scaled.append(freq)
            elif wavelength > context / low:  # low frequencies: divided by factor
                scaled.append(freq / factor)
            else:  # between: interpolated
                smooth = (context / wavelength - low) / (high - low)
                scaled.append((1 - smooth) * freq / factor + smooth * freq)
        inv_freq = scaled
    return torch.tensor(inv_freq, dtype=torch.float64).to(torch.float32)  # (H/2,)


def compute_rope_params(
    head_dim: int,
    theta_base: float = 10_000.0,
    context_length: int = 4096,
    freq_config: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(context_length, H)``: the angles of positions 0, 1, ... for both halves,
    computed in ``dtype`` promoted to at least float32 from float32 angles."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE's pairs, got {head_dim}")
    inv_freq = rope_frequencies(head_dim, theta_base, freq_config)  # (H/2,) float32
    positions = torch.arange(context_length, dtype=torch.float32)  # (T,)
    angles = positions[:, None] * inv_freq[None, :]  # (T, H/2), float32 products
    angles = torch.cat([angles, angles], dim=1).to(torch.promote_types(dtype, torch.float32))  # (T, H)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """``x`` ``(B, N, T, H)`` rotated: token t at position ``offset + t`` (rows of ``cos``/``sin``).

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``, computed in cos's dtype,
    cast back to x's."""
    num_tokens, head_dim = x.shape[-2], x.shape[-1]
    cos, sin = cos[offset : offset + num_tokens], sin[offset : offset + num_tokens]  # (T, H)
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]  # 2 x (B, N, T, H/2)
    rotated = torch.cat((-x2, x1), dim=-1)  # (B, N, T, H)
    compute = cos.dtype
    return (x.to(compute) * cos + rotated.to(compute) * sin).to(x.dtype)
