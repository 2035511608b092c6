"""``attn-parity trace``: one class, every step, torch_ref beside each other framework."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parity_tests.cases import SHAPES, Case
from parity_tests.compare import StepReport, compare_steps
from parity_tests.frameworks import jax_context, run_case, run_flax, run_jax, run_torch
from torch_ref import to_params

__all__ = ["TRACE_FRAMEWORKS", "Trace", "parse_shape", "trace_case"]

TRACE_FRAMEWORKS = ("numpy", "jax", "flax")


@dataclass(frozen=True)
class Trace:
    case: Case
    expected: Mapping[str, Any]  # torch_ref's steps
    reports: dict[str, StepReport]  # framework -> comparison with torch_ref

    @property
    def ok(self) -> bool:
        return all(report.ok for report in self.reports.values())


def parse_shape(layer: str, shape: str, dtype: str) -> Case:
    """A named shape of the parity table (``full_context``, ...) or ``B,T,D_IN,D_OUT,N``."""
    if shape in SHAPES:
        batch, tokens, ctx, d_in, d_out, heads = SHAPES[shape]
    else:
        try:
            batch, tokens, d_in, d_out, heads = (int(n) for n in shape.split(","))
        except ValueError:
            raise ValueError(
                f"--shape must be one of {list(SHAPES)} or B,T,D_IN,D_OUT,N (five integers), got {shape!r}"
            ) from None
        ctx = tokens
    return Case(layer, batch, tokens, d_in, d_out, heads, True, True, ctx, dtype)


def trace_case(case: Case, frameworks: tuple[str, ...] = TRACE_FRAMEWORKS) -> Trace:
    """Run the case in torch_ref and in each framework; compare every step."""
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = run_torch(module, x)[1]
    runners = {
        "numpy": lambda: run_case("numpy", case, params, x)[1],
        "jax": lambda: run_jax(case, params, x)[1],
        "jax-jit": lambda: run_jax(case, params, x, jit=True)[1],
        "flax": lambda: run_flax(case, params, x)[1],
    }
    reports = {}
    for framework in frameworks:
        with jax_context(case.dtype):
            reports[framework] = compare_steps(expected, runners[framework]())
    return Trace(case, expected, reports)
