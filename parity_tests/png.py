"""PNG figures: matplotlib without a display, and the one way every command writes a figure."""

from __future__ import annotations

import os
from typing import Any

from numpy_attn.files import atomic_write

__all__ = ["pyplot", "save_png"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed), or a notebook's inline backend
    where one is in use (its figures show in the notebook)."""
    import matplotlib

    if "inline" not in matplotlib.get_backend():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(figure: Any, path: str | os.PathLike) -> None:
    """Write ``figure`` to ``path`` as a PNG at 100 dpi, then close it. The file is replaced
    atomically (``atomic_write``: a failed save leaves the old file); an existing entry that is not
    a regular file (a FIFO, a device) is a ValueError, never an open that blocks; OSError where the
    file cannot be written."""
    try:
        with atomic_write(path) as file:
            figure.savefig(file, format="png", dpi=100)
    finally:
        pyplot().close(figure)
