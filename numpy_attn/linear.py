"""``torch.nn.functional.linear`` on torch-layout weights, and the three projections at once."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["linear", "qkv_projections"]


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``x @ weight.T + bias`` with ``weight`` in torch's ``(out_features, in_features)`` layout."""
    out = x @ weight.T  # (..., out_features)
    return out if bias is None else out + bias


def qkv_projections(
    x: np.ndarray, params: Mapping[str, np.ndarray], *, fused: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``W_query(x), W_key(x), W_value(x)``: three matmuls as in the notes, or, ``fused``, one
    matmul with the three weights stacked (one pass over x, the fast paths' choice)."""
    names = ("W_query", "W_key", "W_value")
    if not fused:
        return tuple(linear(x, params[f"{n}.weight"], params.get(f"{n}.bias")) for n in names)
    weight = np.concatenate([params[f"{n}.weight"] for n in names])  # (3 * E, D)
    bias = None if "W_query.bias" not in params else np.concatenate([params[f"{n}.bias"] for n in names])
    return tuple(np.split(linear(x, weight, bias), 3, axis=-1))  # 3 x (..., E)
