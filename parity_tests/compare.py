"""Step-by-step comparison of two traces: where, if anywhere, do two implementations part?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_tests.arrays import dtype_name, to_float64
from parity_tests.tolerances import tolerance_for

if TYPE_CHECKING:
    from parity_tests.locate.report import LocateReport

__all__ = ["StepReport", "StepRow", "compare_arrays", "compare_steps"]


@dataclass(frozen=True)
class StepRow:
    """One step of a comparison.

    ``max_rel_err`` is ``max|actual - expected| / max|expected|`` over the finite entries (a
    norm-wise relative error that stays meaningful where entries are near zero). ``note`` says
    why a row failed other than by tolerance (missing step, shape or NaN/inf mismatch).
    """

    step: str
    expected_shape: tuple[int, ...] | None
    actual_shape: tuple[int, ...] | None
    max_abs_err: float
    max_rel_err: float
    rtol: float
    atol: float
    ok: bool
    note: str = ""


def compare_arrays(
    step: str, expected: Any, actual: Any, *, rtol: float | None = None, atol: float | None = None
) -> StepRow:
    """Compare two arrays from any frameworks in float64, with the dtype table's tolerance
    unless ``rtol``/``atol`` are given.

    The step matches when NaN and inf sit at the same places in both and every finite entry
    satisfies ``|actual - expected| <= atol + rtol * max|expected|``: the bound is relative to
    the step's largest magnitude because rounding differences between two correct
    implementations (another summation order in a dot product) scale with the summands, not
    with the result, so an entrywise relative bound fails on results that cancel to near zero.
    """
    table_rtol, table_atol = tolerance_for(dtype_name(expected), dtype_name(actual))
    rtol = table_rtol if rtol is None else rtol
    atol = table_atol if atol is None else atol
    e, a = to_float64(expected), to_float64(actual)
    if e.shape != a.shape:
        return StepRow(step, e.shape, a.shape, np.inf, np.inf, rtol, atol, False, "shape mismatch")
    same_special = bool((np.isnan(e) == np.isnan(a)).all()) and bool(
        ((e == a) | ~(np.isinf(e) | np.isinf(a))).all()
    )
    both_finite = np.isfinite(e) & np.isfinite(a)
    diff = np.abs(a[both_finite] - e[both_finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(e[both_finite]).max()) if diff.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else np.inf)
    close = max_abs <= atol + rtol * scale
    note = "" if same_special else "NaN/inf at different places"
    return StepRow(step, e.shape, a.shape, max_abs, max_rel, rtol, atol, close and same_special, note)


@dataclass(frozen=True)
class StepReport:
    """The result of ``compare_steps``: ``rows`` in the expected trace's order, and, from
    ``check_port``, ``causes``: likely reasons for the first divergence, and ``located``:
    ``locate``'s report where the steps do not pinpoint the divergence (a side recording no
    steps, a candidate that raised: then there are no rows), naming the candidate's first
    diverging line, or ``locate_gradients``' where the gradients are compared; its causes are then
    ``causes``."""

    rows: tuple[StepRow, ...]
    causes: tuple[str, ...] = ()
    located: LocateReport | None = None

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows) and (self.located is None or self.located.ok)

    @property
    def first_divergence(self) -> str | None:
        """The first step (in order) that does not match, or ``located``'s first divergence (its
        step name where the reference records steps, else its operation; ``the candidate raised
        ...`` for a candidate that raised); None if all match."""
        if self.located is not None and not self.located.ok:
            return self.located.first_divergence
        return next((row.step for row in self.rows if not row.ok), None)

    def __str__(self) -> str:
        """The step table, then ``located``'s report (the lines verified, the first diverging
        line, the worst entry and the causes) or the first diverging step and its causes."""
        lines = self._table() if self.rows else []
        if self.located is not None:
            return "\n".join([*lines, str(self.located)])
        lines.append("all steps match" if self.ok else f"first divergence: {self.first_divergence}")
        lines.extend(f"  likely cause: {cause}" for cause in self.causes)
        return "\n".join(lines)

    def __rich__(self) -> Any:
        """The report for a terminal (``attn-parity diff``): the step table where both sides record a
        step besides the output (a side recording none compares the output alone: no table), then
        ``located``'s panel, or a panel with the first diverging step and its causes."""
        from rich.console import Group
        from rich.markup import escape
        from rich.panel import Panel
        from rich.table import Table

        parts: list[Any] = []
        if any(row.note == "" and row.step != "output" for row in self.rows):
            table = Table(*_COLUMNS, title="steps")
            for row in self.rows:
                table.add_row(*map(escape, self._cells(row)), style=None if row.ok else "red")
            parts.append(table)
        if self.located is not None:
            parts.append(self.located)
        else:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold")
            grid.add_column()
            if self.ok:
                grid.add_row("result", f"[green]ok: {'all steps' if parts else 'the outputs'} match[/green]")
            else:
                grid.add_row("first divergence", f"[red]{escape(str(self.first_divergence))}[/red]")
            for cause in self.causes:
                grid.add_row("likely cause", escape(cause))
            parts.append(Panel(grid, title="check_port", border_style="green" if self.ok else "red"))
        return Group(*parts)

    def _cells(self, row: StepRow) -> tuple[str, ...]:
        """One row of the step table, a string per column of ``_COLUMNS``."""
        mark = ("-" if row.note.startswith("missing") else "yes") if row.ok else "NO"
        if row.step == self.first_divergence:
            mark += "  <- first divergence"
        return (
            row.step,
            _shape(row.expected_shape),
            _shape(row.actual_shape),
            f"{row.max_abs_err:.3g}",
            f"{row.max_rel_err:.3g}",
            f"{row.rtol:.0e}",
            f"{row.atol:.0e}",
            f"{mark}{'  (' + row.note + ')' if row.note else ''}",
        )

    def _table(self) -> list[str]:
        header = _LINE.format(*_COLUMNS)
        return [header, "-" * len(header), *(_LINE.format(*self._cells(row)) for row in self.rows)]


# the step table's columns, and a line of its text (the widths of the names and numbers it holds)
_COLUMNS = ("step", "expected", "actual", "max abs", "max rel", "rtol", "atol", "ok")
_LINE = "{:<28} {:<16} {:<16} {:>10} {:>10} {:>7} {:>7}  {}"


def _shape(shape: tuple[int, ...] | None) -> str:
    return "-" if shape is None else str(tuple(shape))


def compare_steps(
    expected: Mapping[str, Any],
    actual: Mapping[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    missing_ok: bool = False,
) -> StepReport:
    """Compare two step traces in ``expected``'s order; steps only in ``actual`` come last.

    A step missing on either side, or of another shape, is a failed row, never an exception;
    with ``missing_ok`` a step that only one side records is listed but does not fail.
    Tolerances come from ``parity_tests.tolerances`` unless given.
    """
    rows = []
    for step, value in expected.items():
        if step in actual:
            rows.append(compare_arrays(step, value, actual[step], rtol=rtol, atol=atol))
        else:
            rows.append(_one_sided(step, value, None, "missing in actual", missing_ok))
    for step, value in actual.items():
        if step not in expected:
            rows.append(_one_sided(step, None, value, "missing in expected", missing_ok))
    return StepReport(tuple(rows))


def _one_sided(step: str, expected: Any, actual: Any, note: str, ok: bool) -> StepRow:
    shape_of = lambda v: None if v is None else tuple(v.shape)  # noqa: E731
    rtol, atol = tolerance_for(dtype_name(expected if actual is None else actual))
    return StepRow(step, shape_of(expected), shape_of(actual), np.nan, np.nan, rtol, atol, ok, note)
