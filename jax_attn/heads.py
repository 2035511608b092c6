"""Splitting the projection width into heads and merging them back."""

from __future__ import annotations

import jax
from numpy_attn.validation import JAX_FLOATS, check_divisible, check_input

from jax_attn.checks import check_x64

__all__ = ["merge_heads", "split_heads", "unchecked_merge_heads", "unchecked_split_heads"]


def split_heads(x: jax.Array, num_heads: int) -> jax.Array:
    """``(B, T, E) -> (B, N, T, H)``: ``unchecked_split_heads`` of a floating ``(B, T, E)`` array
    whose E ``num_heads`` divides (TypeError or ValueError otherwise; float64 needs 64-bit mode)."""
    shape = check_input(x, layout="(B, T, E)", floating=JAX_FLOATS)
    check_x64("x", x)
    check_divisible("E", shape[-1], num_heads)
    return unchecked_split_heads(x, num_heads)


def unchecked_split_heads(x: jax.Array, num_heads: int) -> jax.Array:
    """``(B, T, E) -> (B, N, T, H)``: the notes' ``view(b, T, N, H).transpose(1, 2)``."""
    b, num_tokens, d_out = x.shape
    x = x.reshape(b, num_tokens, num_heads, d_out // num_heads)  # (B, T, N, H)
    return x.swapaxes(1, 2)  # (B, N, T, H)


def merge_heads(x: jax.Array) -> jax.Array:
    """``(B, N, T, H) -> (B, T, E)``: ``unchecked_merge_heads`` of a floating ``(B, N, T, H)``
    array (TypeError or ValueError otherwise; float64 needs 64-bit mode)."""
    check_input(x, layout="(B, N, T, H)", floating=JAX_FLOATS)
    check_x64("x", x)
    return unchecked_merge_heads(x)


def unchecked_merge_heads(x: jax.Array) -> jax.Array:
    """``(B, N, T, H) -> (B, T, E)``: the notes' ``transpose(1, 2).contiguous().view(b, T, E)``."""
    b, num_heads, num_tokens, head_dim = x.shape
    x = x.swapaxes(1, 2)  # (B, T, N, H)
    return x.reshape(b, num_tokens, num_heads * head_dim)  # (B, T, E)
