"""``attn-parity trace``: one class, every step, torch_ref beside each other framework."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numpy_attn import spec
from parity_tests.cases import SHAPES, Case
from parity_tests.compare import StepReport, compare_steps
from parity_tests.frameworks import DTYPES, RUNNERS, run_torch
from parity_tests.usage import check_sizes

__all__ = ["Trace", "parse_shape", "trace_case"]


@dataclass(frozen=True)
class Trace:
    case: Case
    expected: Mapping[str, Any]  # torch_ref's steps
    reports: dict[str, StepReport]  # framework -> comparison with torch_ref

    @property
    def ok(self) -> bool:
        return all(report.ok for report in self.reports.values())


def parse_shape(layer: str, shape: str, dtype: str) -> Case:
    """A named shape of the parity table (``full_context``, ...) or ``B,T,D_IN,D_OUT,N``;
    ValueError for a size below 1, an array past ``MAX_ENTRIES`` entries (the input, a weight, the
    scores) and sizes the class refuses (heads that do not divide the width)."""
    if shape in SHAPES:
        batch, tokens, ctx, d_in, d_out, heads = SHAPES[shape]
    else:
        try:
            batch, tokens, d_in, d_out, heads = (int(n) for n in shape.split(","))
        except ValueError:
            raise ValueError(
                f"--shape must be one of {list(SHAPES)} or B,T,D_IN,D_OUT,N (five integers), got {shape!r}"
            ) from None
        arrays = [(batch, tokens, d_in), (d_in, d_out), (batch, heads, tokens, tokens)]  # x, W, scores
        check_sizes("--shape", shape, (batch, tokens, d_in, d_out, heads), arrays)
        ctx = tokens
    case = Case(layer, batch, tokens, d_in, d_out, heads, True, True, ctx, dtype)
    spec.check_sizes(spec.SPECS[layer], case.constructor_arguments())
    return case


def trace_case(case: Case, frameworks: tuple[str, ...] | None = None) -> Trace:
    """Run the case in torch_ref and in each framework (default: every one of ``RUNNERS`` that
    computes in the case's dtype); compare every step."""
    from torch_ref import to_params

    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = run_torch(module, x)[1]
    if frameworks is None:
        frameworks = tuple(f for f in RUNNERS if case.dtype in DTYPES[f])
    reports = {f: compare_steps(expected, RUNNERS[f](case, params, x)) for f in frameworks}
    return Trace(case, expected, reports)
