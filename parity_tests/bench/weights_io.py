"""Time and memory of ``save_weights`` and ``load_weights`` on large weights, each call in a
fresh process.

    python -m parity_tests.bench.weights_io [--gib 4] [--suffix .safetensors .npz] [--dir /tmp]

The weights are four float32 tensors of ``gib / 4`` GiB each. For each suffix, one process
builds them and saves them, one loads the file; each prints the call's seconds and the
process's peak resident memory during the call above what it held before (``peak_extra_bytes``).
For loading, that includes the weights it returns; the table also gives what is left after
subtracting them: the copies the call made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from numpy_attn import load_weights, save_weights
from parity_tests.bench.memory import peak_extra_bytes
from parity_tests.usage import number

__all__ = ["WeightsIo", "markdown_weights_io", "measure_weights_io"]

SUFFIXES = (".safetensors", ".npz")
TENSORS = 4


def _weights(gib: float) -> dict[str, np.ndarray]:
    count = int(gib * 2**30) // (4 * TENSORS)
    return {f"h.{i}.weight": np.full(count, 0.5, np.float32) for i in range(TENSORS)}


def _child(operation: str, path: str, gib: float) -> dict[str, float | int]:
    """One call in this process: its seconds and peak extra bytes."""
    params = _weights(gib) if operation == "save" else None
    start = time.perf_counter()
    _, extra = peak_extra_bytes(lambda: save_weights(path, params) if params else load_weights(path))
    return {"seconds": time.perf_counter() - start, "extra_bytes": extra}


@dataclass(frozen=True)
class WeightsIo:
    """One measured call: ``save`` or ``load`` of a ``suffix`` file holding ``weights_bytes``."""

    suffix: str
    operation: str
    seconds: float
    extra_bytes: int
    weights_bytes: int

    @property
    def copies_bytes(self) -> int:
        """The peak above what the call must hold: the loaded weights, for a load."""
        return self.extra_bytes - (self.weights_bytes if self.operation == "load" else 0)


def measure_weights_io(gib: float, suffixes: tuple[str, ...], directory: str) -> list[WeightsIo]:
    rows = []
    for suffix in suffixes:
        path = os.path.join(directory, f"weights_io{suffix}")
        try:
            for operation in ("save", "load"):
                command = [sys.executable, "-m", "parity_tests.bench.weights_io", "--child", operation, path]
                command += ["--gib", str(gib)]
                output = subprocess.run(command, check=True, capture_output=True, text=True)
                measured = json.loads(output.stdout)
                rows.append(WeightsIo(suffix, operation, weights_bytes=int(gib * 2**30), **measured))
        finally:
            if os.path.exists(path):
                os.remove(path)
    return rows


def markdown_weights_io(rows: list[WeightsIo]) -> str:
    lines = [
        "| file | call | time | memory peak above the start | of it, copies (load: less the weights) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row.suffix} | {row.operation} | {row.seconds:.1f} s | {row.extra_bytes / 2**30:.2f} GiB "
            f"| {row.copies_bytes / 2**30:.2f} GiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m parity_tests.bench.weights_io", description=__doc__)
    parser.add_argument(
        "--gib",
        type=number("--gib", 0.001, 64.0),
        default=4.0,
        help="size of the weights in GiB, from 0.001 (about 1 MiB) to 64 (default 4)",
    )
    parser.add_argument("--suffix", nargs="+", choices=SUFFIXES, default=list(SUFFIXES))
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the file is written")
    parser.add_argument("--child", nargs=2, metavar=("OPERATION", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child, args.gib)))
        return
    print(markdown_weights_io(measure_weights_io(args.gib, tuple(args.suffix), args.dir)))


if __name__ == "__main__":
    main()
