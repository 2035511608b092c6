"""A step of the lesson drawn with rich: the code in each framework, the values once, the checks.

Everything that comes from the data (arrays, source lines, labels) is a ``rich.text.Text``, never
markup: ``[nan nan nan]`` or ``x[:, None]`` is printed as it is.
"""

from __future__ import annotations

import numpy as np
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from parity_tests.walkthrough import FRAMEWORKS, Shown

__all__ = ["NAMES", "array_text", "shown_panel", "verdict"]

NAMES = {"torch": "torch_ref", "numpy": "numpy_attn", "jax": "jax_attn"}
MAX_ENTRIES = 96  # more is shown by its corners (numpy's summarisation)


def array_text(values: np.ndarray) -> str:
    """``values`` as the notes print them: four decimals (a mask as 0/1, integers as they are)."""
    if values.dtype == np.bool_:
        values = values.astype(np.int64)
    options = {"precision": 4, "suppress": True, "floatmode": "fixed", "linewidth": 92, "edgeitems": 3}
    with np.printoptions(threshold=MAX_ENTRIES, **options):
        return np.array2string(values)


def verdict(shown: Shown, framework: str) -> Text:
    """torch_ref is the reference; another framework gets a tick (or a cross) and its largest
    difference from torch_ref, or the reason it differs by design."""
    if framework == "torch":
        return Text("the reference", style="dim")
    row = shown.rows[framework]
    if shown.by_design:
        return Text(f"differs by design: {row.note or f'max|diff| {row.max_abs_err:.1e}'}", style="yellow")
    mark, style = ("✓", "green") if row.ok else ("✗", "bold red")
    detail = row.note or f"max|diff| {row.max_abs_err:.1e}"
    return Text(f"{mark} {detail}", style=style)


def _printed_line(shown: Shown) -> Text | None:
    agrees = shown.printed_agrees()
    if agrees is None:
        return None
    mark, style = ("✓", "green") if agrees else ("✗ differs", "bold red")
    line = Text(f"{shown.printed.where} {shown.printed.text()} ")
    line.append(mark, style=style)
    line.append(f"  ({shown.printed.source})", style="dim")
    return line


def shown_panel(shown: Shown) -> Panel:
    """The step's panel: per framework its file, verdict and source lines (where ``code`` has them);
    then the value (torch_ref's) with its shape, the note and what the notes print."""
    parts: list[RenderableType] = []
    for framework in FRAMEWORKS:
        code = shown.code.get(framework)  # none in a notebook: its cells are the code
        header = Text(NAMES[framework], style="bold")
        header.append(f"  {code.path}  " if code else "  ", style="dim")
        header.append_text(verdict(shown, framework))
        parts.append(header)
        if code:
            syntax = Syntax(
                code.text, "python", theme="ansi_dark", background_color="default", word_wrap=True
            )
            parts.append(Padding(syntax, (0, 0, 0, 2)))
    value = shown.values["torch"]
    parts.append(Text(""))
    parts.append(Text(array_text(value)))
    parts.append(Text(f"shape {tuple(value.shape)}" + (f"; {shown.note}" if shown.note else ""), style="dim"))
    if shown.by_design:
        parts.append(Text(shown.by_design, style="yellow"))
    printed = _printed_line(shown)
    if printed is not None:
        parts.append(printed)
    return Panel(Group(*parts), title=Text(shown.label), title_align="left")
