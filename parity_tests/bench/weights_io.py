"""Time and memory of ``save_weights`` and ``load_weights`` on large weights, each call in a
fresh process.

    python -m parity_tests.bench.weights_io [--gib 4] [--suffix .safetensors .npz] [--dir /tmp]

The weights are four float32 tensors of ``gib / 4`` GiB each. For each suffix, one process
builds them and saves them, one loads the file; each prints the call's seconds and the
process's peak resident memory during the call above what it held before (``peak_extra_bytes``).
For loading, that includes the weights it returns; the table also gives what is left after
subtracting them: the copies the call made.

The files are written in a new folder inside ``--dir``, removed afterwards: no file of the user's
is written or removed. A missing ``--dir``, or weights that the machine's available memory or the
folder's free space cannot hold, are refused before anything starts (one line, exit code 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from numpy_attn import load_weights, save_weights
from parity_tests.bench.memory import peak_extra_bytes
from parity_tests.usage import OneLineParser, number

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
    """Each suffix's save and load of ``gib`` GiB, in a new folder inside ``directory`` (removed after:
    nothing of the user's is touched). RuntimeError, one line, where a child process fails."""
    rows = []
    folder = tempfile.mkdtemp(prefix="weights_io-", dir=directory)
    try:
        for suffix in suffixes:
            path = os.path.join(folder, f"weights{suffix}")
            for operation in ("save", "load"):
                command = [sys.executable, "-m", "parity_tests.bench.weights_io", "--child", operation, path]
                output = subprocess.run([*command, "--gib", str(gib)], capture_output=True, text=True)
                if output.returncode != 0:
                    last = (output.stderr.strip().splitlines() or [f"exit code {output.returncode}"])[-1]
                    raise RuntimeError(f"{operation} of {gib} GiB as {suffix} failed: {last}")
                measured = json.loads(output.stdout)
                rows.append(WeightsIo(suffix, operation, weights_bytes=int(gib * 2**30), **measured))
            os.remove(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def available_memory() -> int:
    """Bytes of memory the machine can give a new process now (``MemAvailable``; all of it where
    the kernel does not say)."""
    try:
        with open("/proc/meminfo") as file:
            fields = dict(line.split(":", 1) for line in file)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_room(gib: float, directory: str) -> None:
    """ValueError, before anything starts, where ``directory`` is not a folder, or where the weights
    (held once by each child: the formats' writers and readers copy nothing of that size) do not
    fit in the available memory or the folder's free space."""
    if not os.path.isdir(directory):
        raise ValueError(f"--dir {directory}: no such folder")
    size = int(gib * 2**30)
    memory, free = available_memory(), shutil.disk_usage(directory).free
    if size > memory:
        raise ValueError(
            f"--gib {gib}: {size} bytes of weights, more than the {memory} bytes of memory available"
        )
    if size > free:
        raise ValueError(
            f"--gib {gib}: {size} bytes of weights, more than the {free} bytes free in {directory}"
        )


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
    parser = OneLineParser(prog="python -m parity_tests.bench.weights_io", description=__doc__)
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
    try:
        check_room(args.gib, args.dir)
        rows = measure_weights_io(args.gib, tuple(args.suffix), args.dir)
    except (ValueError, RuntimeError, OSError) as error:
        parser.error(str(error))
    print(markdown_weights_io(rows))


if __name__ == "__main__":
    main()
