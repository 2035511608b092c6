"""The one per-dtype tolerance table of the project.

A step matches when ``max|actual - expected| <= atol + rtol * max|expected|`` over its finite
entries, with NaN and inf at the same places (see ``parity_tests.compare.compare_arrays``).
The dtype of a comparison is the less precise of the two arrays'. The float32 and float64
bounds leave room for other BLAS summation orders and ``exp`` kernels; the half-precision
bounds for torch and JAX rounding intermediates differently.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["TOLERANCES", "tolerance_for"]

# dtype name -> (rtol, atol)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}

_PRECISION_ORDER = ("bfloat16", "float16", "float32", "float64")


def tolerance_for(*dtypes: Any) -> tuple[float, float]:
    """``(rtol, atol)`` for a comparison between arrays of these dtypes (the least precise wins).

    Non-floating dtypes (bool masks, integers) compare exactly.
    """
    names = [np.dtype(d).name if not isinstance(d, str) else d for d in dtypes]
    floating = [n for n in names if n in TOLERANCES]
    if not floating:
        return (0.0, 0.0)
    return TOLERANCES[min(floating, key=_PRECISION_ORDER.index)]
