"""How numpy_attn's blockwise loops use the cores: ``parallel_heads``.

NumPy runs every elementwise pass (the exp, the masks, the sums) on one core, and only its BLAS
spreads a matmul over the cores. Heads are independent, so the blockwise path can run them on
threads instead, each making all of its passes, matmuls included, on one core. That pays only
while BLAS runs one thread per call: heads whose matmuls each start a thread per core
oversubscribe the machine. numpy_attn imports NumPy alone, so it cannot set BLAS's threads
itself; the caller hands it a context manager that does (``threadpoolctl``'s), and numpy_attn
enters it around the threaded loop only, so that the projections and every other matmul
outside the loop keep all of BLAS's threads:

    from threadpoolctl import ThreadpoolController

    blas = ThreadpoolController()
    with numpy_attn.parallel_heads(2, lambda: blas.limit(limits=1, user_api="blas")):
        output = numpy_attn.multi_head_attention(params, x, ..., implementation="blockwise")

The result has the bits of one head after another under the same BLAS settings (OpenBLAS
itself may round a float64 matmul differently on one thread than on several: by 2.8e-16 in a
float64 layer at B2/T600, d 64, 4 heads). Measurements are in benchmarks/README.md. jax_attn has no
counterpart: XLA spreads every operation over the cores itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import NamedTuple

from numpy_attn.checks import check_count, check_size

__all__ = ["MIN_SCORES", "HeadThreads", "head_threads", "parallel_heads"]


# Below this many scores per head (B x T x S) the heads stay on one thread: on 2 cores, threads
# took 1.04-1.22 of the time at B1/T512-T1024 and B4/T512 (the two threads wait on each other
# for the GIL between their many small operations), 0.94-0.99 at B1/T2048 and 0.83-0.85 at
# B1/T4096 (benchmarks/README.md)
MIN_SCORES = 2**22


class HeadThreads(NamedTuple):
    """``workers``: how many heads the blockwise loops run at a time; ``one_thread_blas``:
    called for a context manager inside which BLAS runs one thread per call; ``min_scores``: the
    fewest scores per head, B x T x S, for which heads go on threads."""

    workers: int
    one_thread_blas: Callable[[], AbstractContextManager[object]]
    min_scores: int = MIN_SCORES


_HEAD_THREADS: ContextVar[HeadThreads] = ContextVar(
    "numpy_attn_head_threads", default=HeadThreads(1, nullcontext)
)


@contextmanager
def parallel_heads(
    workers: int,
    one_thread_blas: Callable[[], AbstractContextManager[object]],
    *,
    min_scores: int = MIN_SCORES,
) -> Iterator[None]:
    """Within the block, numpy_attn's blockwise path runs up to ``workers`` heads at a time on
    threads, inside ``one_thread_blas()``, when a head has at least ``min_scores`` scores.
    Outside the block, with ``workers=1``, or with random dropout (an ``rng``: the draws come from
    one generator, in order), heads run one after another. The setting belongs to the calling
    thread (and asyncio task): a ``contextvars.ContextVar``.

    Args:
        workers: heads at a time, a positive int.
        one_thread_blas: called for a context manager that keeps BLAS to one thread per call
            (``threadpoolctl``'s limit; ``contextlib.nullcontext`` where BLAS runs one thread).
        min_scores: the fewest scores per head, B x T x S, for which heads go on threads (fewer
            run faster on one thread, see ``MIN_SCORES``).

    TypeError or ValueError naming the argument for a bad setting.
    """
    check_size("workers", workers)
    check_count("min_scores", min_scores)
    if not callable(one_thread_blas):
        raise TypeError(f"one_thread_blas must be callable, got {type(one_thread_blas).__name__}")
    token = _HEAD_THREADS.set(HeadThreads(workers, one_thread_blas, min_scores))
    try:
        yield
    finally:
        _HEAD_THREADS.reset(token)


def head_threads() -> HeadThreads:
    """What ``parallel_heads`` set here (one worker and no BLAS limit outside it)."""
    return _HEAD_THREADS.get()
