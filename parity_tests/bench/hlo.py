"""The kernels of a compiled XLA program, to compare two programs that should do the same work.

``kernels(compiled_text)`` reads the entry computation of the optimised HLO
(``jax.jit(f).lower(...).compile().as_text()``) and counts its kernels by kind and output shape:
a fusion by its kind (``kLoop``, ``kOutput``...) and, for a custom fusion, the library that runs it
(``__ynn_fusion``: YNNPACK), any other instruction by its opcode (a ``dot`` outside a fusion is
XLA:CPU's generic matrix product). Parameters, constants and bitcasts (free) are left out, so two
programs whose weights differ only in layout (torch's ``(out, in)`` against Flax's ``(in, out)``)
have the same kernels when XLA runs the same kinds of kernel on the same shapes.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["kernel_difference", "kernels"]

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = (\S+?)(?:\{[^}]*\})? ([\w-]+)\(")
_FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple"}


def kernels(compiled_text: str) -> Counter[str]:
    """``"<kind> <shape>"`` -> count, over the entry computation of an optimised HLO module."""
    entry = compiled_text[compiled_text.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    counts: Counter[str] = Counter()
    for line in entry.splitlines()[1:]:
        match = _INSTRUCTION.match(line)
        if match is None or match.group(2) in _FREE:
            continue
        shape, kind = match.groups()
        if kind == "fusion":
            library = re.search(r'"kind":"(\w+)"', line)
            kind = library.group(1) if library else re.search(r"kind=(\w+)", line).group(1)
        counts[f"{kind} {shape}"] += 1
    return counts


def kernel_difference(expected: Counter[str], actual: Counter[str]) -> str:
    """``"same"``, or the kernels only one side runs: ``"+k"`` only in ``actual``, ``"-k"`` only in
    ``expected``."""
    extra, missing = actual - expected, expected - actual
    if not extra and not missing:
        return "same"
    only_actual = [f"+{n}x {k}" for k, n in sorted(extra.items())]
    return "; ".join(only_actual + [f"-{n}x {k}" for k, n in sorted(missing.items())])
