"""The report of ``locate``: where a port first diverges from its reference, and why."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parity_tests.png import save_png

__all__ = ["NO_HEATMAP", "LocateReport"]

# why a report that does not match may have no heatmap
NO_HEATMAP = "the first diverging value has no layout of the reference's value: there is no error to draw"


@dataclass
class LocateReport:
    """``ok``: the outputs match. Otherwise ``first_divergence`` names the first reference value no
    candidate value reproduces (its step name where the reference records steps, else its op);
    ``candidate_location`` and ``reference_location`` are the ``"path:line"`` of the operations
    where the two sides first disagree; ``worst_index`` (with ``axes``) is the worst entry of the
    first diverging candidate value against the reference value it should equal, ``expected`` and
    ``actual`` its two values, ``expected_dtype`` and ``actual_dtype`` the two dtypes; ``verified``
    the candidate lines whose values were found equal to reference values before it; ``causes``
    what the numbers show. ``expected_value``/``actual_value`` hold the two diverging tensors (in
    the reference's layout when the candidate's can be laid out so) for ``write_heatmap``.
    ``raised`` (``type: message``): the candidate raised, at ``candidate_location`` (whose source
    text is ``candidate_op``); then there is no reference location, worst entry nor heatmap.
    ``candidate_loops``: the loop iterations the candidate's line ran in when it went wrong, part of
    its location (``h = 1 (line 12)``: the head; ``ids #1 (line 30)``: the second sequence of a
    comprehension; ``scan #2 (line 40)``: a ``jax.lax.scan``'s third step), empty outside loops;
    ``reference_module``: the torch module computing the reference value, where known."""

    ok: bool
    first_divergence: str | None = None
    candidate_location: str | None = None
    reference_location: str | None = None
    candidate_op: str | None = None
    reference_op: str | None = None
    worst_index: tuple[int, ...] | None = None
    axes: tuple[str, ...] = ()
    expected: float | None = None
    actual: float | None = None
    expected_dtype: str | None = None
    actual_dtype: str | None = None
    verified: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    rtol: float = 0.0
    atol: float = 0.0
    expected_value: Any = None
    actual_value: Any = None
    raised: str | None = None
    candidate_loops: str = ""
    reference_module: str | None = None

    def __str__(self) -> str:
        lines = [f"verified equal: {len(self.verified)} lines"]
        lines += [f"  {line}" for line in self.verified[-8:]]
        if self.ok:
            return "\n".join([*lines, "ok: the outputs match"])
        lines.append(f"first divergence: {self.first_divergence}")
        lines.append(f"  candidate: {self.candidate_location}  ({self.candidate_op})")
        if self.candidate_loops:
            lines.append(f"    in loop: {self.candidate_loops}")
        if self.raised is None:
            module = f" in {self.reference_module}" if self.reference_module else ""
            lines.append(f"  reference: {self.reference_location}  ({self.reference_op}{module})")
        if self.worst_index is not None:
            where = ", ".join(f"{a}={i}" for a, i in zip(self.axes, self.worst_index, strict=False))
            lines.append(
                f"  worst entry [{where}]: expected {self.expected:.6g} ({self.expected_dtype}), "
                f"got {self.actual:.6g} ({self.actual_dtype})"
            )
        lines += [f"  likely cause: {cause}" for cause in self.causes]
        return "\n".join(lines)

    def __rich__(self) -> Any:
        """The report as a rich panel; the lines, ops and causes escaped (``x[b]`` is not markup)."""
        from rich.markup import escape
        from rich.panel import Panel
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row(
            "verified",
            f"{len(self.verified)} lines equal to the reference"
            + ("" if self.ok else " before the divergence"),
        )
        if self.ok:
            table.add_row("result", "[green]ok: the outputs match[/green]")
            return Panel(table, title="locate", border_style="green")
        table.add_row("first divergence", f"[red]{escape(str(self.first_divergence))}[/red]")
        table.add_row(
            "candidate",
            f"{escape(str(self.candidate_location))}  [dim]{escape(str(self.candidate_op))}[/dim]",
        )
        if self.candidate_loops:
            table.add_row("in loop", escape(self.candidate_loops))
        if self.raised is None:
            module = f" in {self.reference_module}" if self.reference_module else ""
            op = escape(f"{self.reference_op}{module}")
            table.add_row("reference", f"{escape(str(self.reference_location))}  [dim]{op}[/dim]")
        if self.worst_index is not None:
            where = ", ".join(f"{a}={i}" for a, i in zip(self.axes, self.worst_index, strict=False))
            table.add_row(
                "worst entry",
                f"{escape(f'[{where}]')} expected {self.expected:.6g} ({self.expected_dtype}), "
                f"got {self.actual:.6g} ({self.actual_dtype})",
            )
        for cause in self.causes:
            table.add_row("likely cause", escape(cause))
        return Panel(table, title="locate", border_style="red")

    def write_heatmap(self, path: str | os.PathLike) -> np.ndarray:
        """Draw the first diverging tensor's error after the alignment the text uses (entries equal in
        both, the same -inf included, differ by 0), in units of the tolerance on a fixed log scale
        (within tolerance is dark, 100x the tolerance and beyond is hot: rounding noise never looks
        hot); the last two axes of the slice holding the worst entry, that slice named on the
        picture. Returns log10 of the plotted units, clipped to [-2, 2]."""
        from parity_tests.heatmap import difference_figure
        from parity_tests.maps import UNITS_RANGE, difference_units

        if self.ok:
            raise ValueError("write_heatmap: the outputs match, there is no diverging tensor to draw")
        if self.expected_value is None:
            raise ValueError(f"write_heatmap: {NO_HEATMAP}")
        expected, actual = np.asarray(self.expected_value), np.asarray(self.actual_value)
        names = self.axes or tuple(f"axis{i}" for i in range(expected.ndim))
        lead = tuple(self.worst_index[:-2]) if expected.ndim > 2 else ()
        where = ", ".join(f"{name} {index}" for name, index in zip(names, lead, strict=False))
        slice_label = f"slice [{where}], the worst entry's" if where else "the whole tensor"
        axis_names = (names[-2] if len(names) > 1 else "", names[-1] if names else "")
        units = np.atleast_2d(difference_units(expected, actual, self.rtol, self.atol)[lead])
        tolerance = f"{self.atol:g} + {self.rtol:g} x max|expected|"
        title = f"{self.first_divergence}: {self.candidate_location}"
        save_png(difference_figure(units, axis_names, slice_label, title, tolerance), path)
        return np.log10(np.clip(units, *UNITS_RANGE))
