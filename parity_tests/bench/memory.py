"""Extra memory of one call, measured in a fresh process that imports one framework.

    python -m parity_tests.bench.memory IMPLEMENTATION SHAPE

prints a JSON object with ``extra_bytes``: the process's peak resident memory during the first
call (JIT compilation included) minus its resident memory just before it. The peak is reset
first (``/proc/self/clear_refs``), so imports and set-up do not count.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from parity_tests.bench.implementations import SHAPES, make_call, make_inputs

__all__ = ["extra_memory", "peak_extra_bytes"]


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(call: Callable[[], Any]) -> tuple[Any, int]:
    """``call()``'s result and the process's peak resident memory during it minus its resident
    memory just before it (Linux: the peak is reset first through ``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset the peak resident set size (VmHWM) to the current one
    before = _status("VmRSS")
    result = call()
    return result, _status("VmHWM") - before


def extra_memory(name: str, shape_name: str) -> int:
    shape = SHAPES[shape_name]
    params, x = make_inputs(shape)
    return peak_extra_bytes(make_call(name, shape, params, x))[1]


if __name__ == "__main__":
    implementation, shape = sys.argv[1:3]
    print(
        json.dumps(
            {
                "implementation": implementation,
                "shape": shape,
                "extra_bytes": extra_memory(implementation, shape),
            }
        )
    )
