"""A bound on the CPU time of the calling thread, for the tests that a refusal is quick.

A hostile file must be refused in well under a second, not after seconds of parsing. Wall time
measures that only on an idle machine: on a loaded one (the other xdist worker, a subprocess
test) the same call may wait seconds for a core. The calling thread's CPU time counts the work the
refusal did and nothing else (the readers here run on the calling thread; blocking reads, which
cost no CPU time, have tests of their own with a watchdog thread)."""

import contextlib
import time


@contextlib.contextmanager
def within_cpu_seconds(limit: float):
    """Fail the test if the block's own work took ``limit`` seconds of the thread's CPU or more."""
    start = time.thread_time()
    yield
    elapsed = time.thread_time() - start
    assert elapsed < limit, f"{elapsed:.2f} s of CPU time, the bound is {limit} s"
