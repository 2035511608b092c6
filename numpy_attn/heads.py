"""Splitting the projection width into heads and merging them back."""

from __future__ import annotations

import numpy as np

__all__ = ["merge_heads", "split_heads"]


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, T, E) -> (B, N, T, H)``: the notes' ``view(b, T, N, H).transpose(1, 2)``."""
    b, num_tokens, d_out = x.shape
    x = x.reshape(b, num_tokens, num_heads, d_out // num_heads)  # (B, T, N, H)
    return x.swapaxes(1, 2)  # (B, N, T, H)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """``(B, N, T, H) -> (B, T, E)``: the notes' ``transpose(1, 2).contiguous().view(b, T, E)``."""
    b, num_heads, num_tokens, head_dim = x.shape
    x = x.swapaxes(1, 2)  # (B, T, N, H)
    return x.reshape(b, num_tokens, num_heads * head_dim)  # (B, T, E)
