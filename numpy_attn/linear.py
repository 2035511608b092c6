"""``torch.nn.functional.linear`` on torch-layout weights."""

from __future__ import annotations

import numpy as np

__all__ = ["linear"]


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``x @ weight.T + bias`` with ``weight`` in torch's ``(out_features, in_features)`` layout."""
    out = x @ weight.T  # (..., out_features)
    return out if bias is None else out + bias
