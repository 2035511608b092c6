"""Splitting the projection width into heads and merging them back."""

from __future__ import annotations

import numpy as np

from numpy_attn.validation import check_divisible, check_input

__all__ = ["merge_heads", "split_heads", "unchecked_merge_heads", "unchecked_split_heads"]


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, T, E) -> (B, N, T, H)``: ``unchecked_split_heads`` of a floating ``(B, T, E)`` array
    whose E ``num_heads`` divides (TypeError or ValueError otherwise)."""
    shape = check_input(x, layout="(B, T, E)")
    check_divisible("E", shape[-1], num_heads)
    return unchecked_split_heads(x, num_heads)


def unchecked_split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, T, E) -> (B, N, T, H)``: the notes' ``view(b, T, N, H).transpose(1, 2)``."""
    b, num_tokens, d_out = x.shape
    x = x.reshape(b, num_tokens, num_heads, d_out // num_heads)  # (B, T, N, H)
    return x.swapaxes(1, 2)  # (B, N, T, H)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """``(B, N, T, H) -> (B, T, E)``: ``unchecked_merge_heads`` of a floating ``(B, N, T, H)``
    array (TypeError or ValueError otherwise)."""
    check_input(x, layout="(B, N, T, H)")
    return unchecked_merge_heads(x)


def unchecked_merge_heads(x: np.ndarray) -> np.ndarray:
    """``(B, N, T, H) -> (B, T, E)``: the notes' ``transpose(1, 2).contiguous().view(b, T, E)``."""
    b, num_heads, num_tokens, head_dim = x.shape
    x = x.swapaxes(1, 2)  # (B, T, N, H)
    return x.reshape(b, num_tokens, num_heads * head_dim)  # (B, T, E)
