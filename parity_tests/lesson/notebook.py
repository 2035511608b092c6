"""What the notebooks of ``notebooks/`` call after computing a step in torch, NumPy and JAX.

``show("query_2", torch=query_2, numpy=query_2_np, jax=query_2_jax, printed="query_2")`` prints
the value once, a tick with max|diff| for NumPy and JAX against torch (the tolerance table's) and
what the notes print; ``weights_picture`` draws a ``(T, S)`` map of attention weights inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console

from parity_tests.lesson.panel import shown_panel
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.maps import draw_weights
from parity_tests.png import pyplot
from parity_tests.walkthrough import Shown

__all__ = ["show", "weights_picture"]


def show(label: str, *, torch: Any, numpy: Any, jax: Any, printed: str | None = None, note: str = "",
         by_design: str = "") -> Shown:  # fmt: skip
    """Print the step's panel (100 columns) and return it; ``printed`` names an entry of ``PRINTED``."""
    step = shown(label, {}, {"torch": torch, "numpy": numpy, "jax": jax},
                 PRINTED[printed] if printed else None, note, by_design)  # fmt: skip
    Console(width=100, highlight=False).print(shown_panel(step))
    return step


def weights_picture(weights: Any, tokens: Sequence[str], title: str, hidden: Any = None) -> Any:
    """A figure of attention weights ``(T, S)`` (a NumPy array) on the fixed 0-1 scale, hidden keys grey."""
    figure, axis = pyplot().subplots(figsize=(4.5, 4), layout="constrained")
    image = draw_weights(axis, weights, hidden, tokens, title)
    figure.colorbar(image, ax=axis, label="weight (0 to 1)")
    return figure
