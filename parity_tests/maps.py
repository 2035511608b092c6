"""Pictures of attention weights and of differences that tell the truth about their size.

- Weights are drawn on one fixed 0-1 scale (near-uniform weights look near-uniform, not stretched
  over the whole colour range), with their values in the cells when the map is small, hidden
  cells grey, the query tokens down and the key tokens across.
- Differences are drawn in units of the tolerance (``|actual - expected| / (atol + rtol *
  max|expected|)``, the comparison's own bound) on one fixed log scale from 0.01 to 100: rounding
  noise is dark, a difference at the tolerance is mid-scale and 100x beyond is the top colour, in
  every panel alike. Entries equal in both (hidden -inf scores included) differ by 0, never NaN.

These functions draw on axes given to them: the heatmap command, ``diff --heatmap`` and the
notebooks use them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "HIDDEN_COLOUR",
    "UNITS_RANGE",
    "VALUES_IN_CELLS",
    "difference_units",
    "draw_difference",
    "draw_units",
    "draw_weights",
]

HIDDEN_COLOUR = "lightgrey"
UNITS_RANGE = (1e-2, 1e2)  # the fixed scale of every difference panel, in tolerance units
VALUES_IN_CELLS = 8  # maps of at most this many rows and columns show their values


def difference_units(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """``|actual - expected|`` in units of the tolerance ``atol + rtol * max|expected|`` (the finite
    entries' maximum): 0 where the two are equal (the same infinity or both NaN included), inf
    where only one is NaN or infinite."""
    expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    finite = np.isfinite(expected)
    scale = atol + rtol * float(np.abs(expected[finite]).max(initial=0.0))
    with np.errstate(invalid="ignore"):
        error = np.abs(actual - expected)
    same = (expected == actual) | (np.isnan(expected) & np.isnan(actual))
    error = np.where(same, 0.0, np.nan_to_num(error, nan=np.inf, posinf=np.inf))  # not the largest float
    return error / max(scale, np.finfo(np.float64).tiny)


def _label_axes(
    axis: Any, rows: int, columns: int, tokens: Sequence[str], axis_names: tuple[str, str]
) -> None:
    axis.set_ylabel(axis_names[0])
    axis.set_xlabel(axis_names[1])
    if len(tokens) == columns == rows:
        axis.set_xticks(range(columns), list(tokens), rotation=45, ha="right", fontsize=8)
        axis.set_yticks(range(rows), list(tokens), fontsize=8)


def draw_weights(
    axis: Any,
    weights: np.ndarray,
    hidden: np.ndarray | None = None,
    tokens: Sequence[str] = (),
    title: str = "",
    axis_names: tuple[str, str] = ("query", "key"),
) -> Any:
    """``weights`` ``(T, S)`` on the fixed 0-1 scale, ``hidden`` cells (True) grey, values in the
    cells for maps of at most ``VALUES_IN_CELLS`` rows and columns. Returns the image."""
    import matplotlib

    weights = np.asarray(weights, np.float64)
    hidden = np.zeros(weights.shape, bool) if hidden is None else np.asarray(hidden, bool)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad=HIDDEN_COLOUR)
    image = axis.imshow(
        np.ma.masked_array(weights, hidden | np.isnan(weights)), cmap=cmap, vmin=0.0, vmax=1.0
    )
    if max(weights.shape) <= VALUES_IN_CELLS:
        for (row, column), value in np.ndenumerate(weights):
            if not hidden[row, column]:
                colour = "black" if value > 0.6 else "white"
                axis.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
    _label_axes(axis, *weights.shape, tokens, axis_names)
    axis.set_title(title, fontsize=9)
    return image


def draw_units(
    axis: Any,
    units: np.ndarray,
    hidden: np.ndarray | None = None,
    tokens: Sequence[str] = (),
    title: str = "",
    axis_names: tuple[str, str] = ("query", "key"),
) -> Any:
    """Differences already in tolerance units ``(T, S)`` on the fixed log scale ``UNITS_RANGE``
    (clipped to it), ``hidden`` cells grey. Returns the image."""
    import matplotlib
    from matplotlib.colors import LogNorm

    units = np.asarray(units, np.float64)
    hidden = np.zeros(units.shape, bool) if hidden is None else np.asarray(hidden, bool)
    low, high = UNITS_RANGE
    cmap = matplotlib.colormaps["inferno"].with_extremes(bad=HIDDEN_COLOUR)
    shown = np.ma.masked_array(np.clip(units, low, high), hidden | np.isnan(units))
    image = axis.imshow(shown, cmap=cmap, norm=LogNorm(vmin=low, vmax=high))
    _label_axes(axis, *units.shape, tokens, axis_names)
    axis.set_title(title, fontsize=9)
    return image


def draw_difference(
    axis: Any,
    expected: np.ndarray,
    actual: np.ndarray,
    rtol: float,
    atol: float,
    hidden: np.ndarray | None = None,
    tokens: Sequence[str] = (),
    title: str = "",
    axis_names: tuple[str, str] = ("query", "key"),
) -> tuple[Any, np.ndarray]:
    """``|actual - expected|`` ``(T, S)`` in tolerance units (``difference_units``), drawn by
    ``draw_units``. Returns the image and the units."""
    units = difference_units(expected, actual, rtol, atol)
    return draw_units(axis, units, hidden, tokens, title, axis_names), units
