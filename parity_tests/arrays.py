"""Arrays from any framework, as NumPy, without importing any framework."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["dtype_name", "erf", "to_float64"]


def dtype_name(array: Any) -> str:
    """``"float32"``, ``"bfloat16"``, ... for NumPy arrays, JAX arrays and torch tensors alike."""
    dtype = array.dtype
    return str(dtype).removeprefix("torch.") if type(dtype).__module__ == "torch" else np.dtype(dtype).name


def to_float64(array: Any) -> np.ndarray:
    """A float64 NumPy copy of a NumPy/JAX array or a torch tensor (bfloat16 included)."""
    if hasattr(array, "detach"):  # a torch tensor: NumPy cannot read bfloat16 tensors directly
        return array.detach().cpu().double().numpy()
    return np.asarray(array).astype(np.float64)


# the error function elementwise, from Python's math.erf: NumPy has none, and the checker needs NumPy alone
erf = np.vectorize(math.erf, otypes=[np.float64])
