"""The parity report: every class x framework x dtype against torch_ref, over the shape table."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from numpy_attn.spec import SPECS
from parity_tests.cases import SHAPES, case_product
from parity_tests.compare import compare_steps
from parity_tests.frameworks import ALL_DTYPES, DTYPES, RUNNERS, run_torch

__all__ = ["ReportRow", "format_table", "parity_report", "to_json"]


@dataclass(frozen=True)
class ReportRow:
    """One class x framework x dtype, aggregated over every shape and bias flag."""

    layer: str
    framework: str
    dtype: str
    cases: int
    max_abs_err: float
    max_rel_err: float
    rtol: float
    atol: float
    ok: bool
    first_failure: str | None  # "<case id>: <first diverging step>"


def parity_report(
    frameworks: Iterable[str] | None = None,
    dtypes: Iterable[str] | None = None,
    layers: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[ReportRow]:
    """Compare every step of every case of the shape table (both bias settings) with torch_ref,
    for each class x framework x dtype that the framework computes in; ``progress`` is called
    with each case id."""
    from torch_ref import to_params

    all_frameworks = list(RUNNERS if frameworks is None else frameworks)
    rows = []
    for layer in layers or SPECS:
        for dtype in dtypes or ALL_DTYPES:
            frameworks = [f for f in all_frameworks if dtype in DTYPES[f]]
            if not frameworks:
                continue
            cases = list(case_product([layer], list(SHAPES), [False, True], [dtype]))
            traces = []
            for case in cases:
                if progress:
                    progress(case.id)
                module = case.build_torch()
                x = case.make_input()
                traces.append((case, to_params(module), x, run_torch(module, x)[1]))
            for framework in frameworks:
                reports = [
                    (case, compare_steps(expected, RUNNERS[framework](case, params, x)))
                    for case, params, x, expected in traces
                ]
                all_rows = [row for _, report in reports for row in report.rows]
                failure = next(
                    (f"{case.id}: {report.first_divergence}" for case, report in reports if not report.ok),
                    None,
                )
                rows.append(
                    ReportRow(
                        layer,
                        framework,
                        dtype,
                        len(reports),
                        max(row.max_abs_err for row in all_rows),
                        max(row.max_rel_err for row in all_rows),
                        all_rows[0].rtol,
                        all_rows[0].atol,
                        failure is None,
                        failure,
                    )
                )
    return rows


def format_table(rows: list[ReportRow]) -> str:
    header = (
        f"{'class':<27} {'framework':<10} {'dtype':<9} {'cases':>5} {'max abs err':>12} "
        f"{'max rel err':>12} {'rtol':>7} {'atol':>7}  result"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        result = "pass" if r.ok else f"FAIL ({r.first_failure})"
        lines.append(
            f"{r.layer:<27} {r.framework:<10} {r.dtype:<9} {r.cases:>5} {r.max_abs_err:>12.3g} "
            f"{r.max_rel_err:>12.3g} {r.rtol:>7.0e} {r.atol:>7.0e}  {result}"
        )
    passed = sum(r.ok for r in rows)
    lines.append(f"{passed} of {len(rows)} rows pass")
    return "\n".join(lines)


def to_json(rows: list[ReportRow]) -> str:
    return json.dumps({"ok": all(r.ok for r in rows), "rows": [asdict(r) for r in rows]}, indent=2)
