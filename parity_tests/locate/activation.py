"""Which activation a line computes, against the reference's: GELU's exact (erf) form against its
tanh approximation, ReLU, SiLU, or none.

The blamed line's values are tried as each known activation of a value the line takes (one that
holds a reference value); the reference's values computed soon after the value it holds, as each
activation of that one. Two different activations are a cause the numbers show.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from parity_tests.arrays import erf
from parity_tests.locate.align import Alignment, close, line_records, tolerance_of
from parity_tests.locate.trace import Record

__all__ = ["activation_cause", "which_activation"]


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "the exact GELU (erf)": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
    "GELU's tanh approximation": _gelu_tanh,
    "ReLU": lambda x: np.maximum(x, 0),
    "SiLU": lambda x: x / (1 + np.exp(-x)),
}
_FIX = {
    "the exact GELU (erf)": ("use the exact GELU (jax.nn.gelu(x, approximate=False), F.gelu(x))"),
    "GELU's tanh approximation": (
        "use GELU's tanh form (jax.nn.gelu(x, approximate=True), nnx.gelu(x, approximate=True), "
        "F.gelu(x, approximate='tanh'), GPT-2's gelu_new)"
    ),
}
_NEAR = 12  # the reference's activation is among the values computed this soon after its input


def which_activation(value: np.ndarray, of: np.ndarray, record: Record) -> str | None:
    """The activation ``value`` is of ``of`` (elementwise, same shape), if one of ``ACTIVATIONS``."""
    if value.shape != of.shape or value.dtype.kind != "f" or of.dtype.kind != "f" or value.size < 2:
        return None
    rtol, atol = tolerance_of(record, record)
    x = of.astype(np.float64)
    if np.allclose(x, np.maximum(x, 0)) or np.abs(x).max() < 0.5:
        return None  # no negative inputs, or too small to tell the activations apart
    with np.errstate(all="ignore"):
        found = [name for name, f in ACTIVATIONS.items() if close(f(x), value, rtol, atol)]
    return found[0] if len(found) == 1 else None


def activation_cause(alignment: Alignment) -> str | None:
    """The cause where the blamed line computes one activation of a value it takes and the
    reference another of the value that one holds; None where the numbers show none."""
    candidate, reference = alignment.candidate, alignment.reference
    line = line_records(candidate, alignment.shown)
    taken = {s for r in line for s in r.inputs} | {r.index for r in line}
    for record in line:
        for source in sorted(taken):
            if source >= record.index:
                continue
            held = [m.reference for m in alignment.matches.get(source, []) if m.kind == "exact"]
            held += [r for r, _, _ in alignment.parts.get(source, [])]
            mine = which_activation(record.value, candidate.records[source].value, record) if held else None
            if mine is None:
                continue
            for r in held:
                origin = reference.records[r]
                for later in reference.records[r + 1 : r + 1 + _NEAR]:
                    theirs = which_activation(later.value, origin.value, later)
                    if theirs is not None and theirs != mine:
                        fix = _FIX.get(theirs, f"use {theirs}")
                        return (
                            f"activation: yours computes {mine} of its input, the reference {theirs} "
                            f"({later.location}): {fix}"
                        )
    return None
