"""Building a ``Shown`` step from the values each framework computed."""

from __future__ import annotations

from typing import Any

import numpy as np

from parity_tests.arrays import to_float64
from parity_tests.compare import compare_arrays
from parity_tests.lesson.code import Code
from parity_tests.lesson.printed import Printed
from parity_tests.walkthrough import FRAMEWORKS, Shown

__all__ = ["as_numpy", "shown"]


def as_numpy(value: Any) -> np.ndarray:
    """A float64 copy of a NumPy/JAX array or torch tensor; a boolean or integer one (a mask,
    token ids) stays boolean or becomes int64."""
    kind = str(value.dtype).removeprefix("torch.")
    if kind == "bool" or kind.startswith(("int", "uint")):
        plain = np.asarray(value.detach() if hasattr(value, "detach") else value)
        return plain.astype(bool if kind == "bool" else np.int64)
    return to_float64(value)


def shown(
    label: str,
    code: dict[str, Code],
    values: dict[str, Any],
    printed: Printed | None = None,
    note: str = "",
    by_design: str = "",
    tokens: tuple[str, ...] = (),
) -> Shown:
    """``values`` (framework -> array in that framework's type) compared with torch_ref's by the
    tolerance table of their dtype (``compare_arrays``)."""
    rows = {f: compare_arrays(label, values["torch"], values[f]) for f in FRAMEWORKS[1:]}
    converted = {f: as_numpy(values[f]) for f in FRAMEWORKS}
    return Shown(label, code, converted, rows, printed, note, by_design, tokens)
