"""numpy_attn's blockwise heads on threads (``parallel_heads``). NumPy makes every elementwise pass
on one core and only BLAS spreads a matmul over the cores; heads are independent, so they can run
on threads, each on one core, while BLAS runs one thread per call. jax_attn has no counterpart:
XLA spreads every operation over the cores itself. Measurements: benchmarks/README.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import NamedTuple

from numpy_attn.checks import check_count, check_size

BlasLimit = Callable[[], AbstractContextManager[object]]  # called for a context manager limiting BLAS
MIN_SCORES = 2**22  # scores per head (B x T x S) below which threads are slower (benchmarks/README.md)


class HeadThreads(NamedTuple):
    """What ``parallel_heads`` set: ``workers``, heads at a time; ``one_thread_blas()``, a context
    manager inside which BLAS runs one thread per call; ``min_scores``, the fewest scores per head
    (B x T x S) for which heads go on threads."""

    workers: int
    one_thread_blas: BlasLimit
    min_scores: int = MIN_SCORES


_HEAD_THREADS = ContextVar("numpy_attn_head_threads", default=HeadThreads(1, nullcontext))


@contextmanager
def parallel_heads(
    workers: int, one_thread_blas: BlasLimit, *, min_scores: int = MIN_SCORES
) -> Iterator[None]:
    """Within the block, numpy_attn's blockwise path runs up to ``workers`` heads at a time on
    threads, inside ``one_thread_blas()``, when a head has at least ``min_scores`` scores; with
    random dropout (an ``rng``, drawn in order) heads run one after another. The result has the
    bits of one head after another under the same BLAS settings. The setting belongs to the
    calling thread and asyncio task (a ``ContextVar``). numpy_attn imports NumPy alone, so the
    caller limits BLAS, with ``threadpoolctl`` for instance; the limit is entered around the
    threaded loop only, the projections keep all of BLAS's threads::

        blas = threadpoolctl.ThreadpoolController()
        with numpy_attn.parallel_heads(2, lambda: blas.limit(limits=1, user_api="blas")):
            output = numpy_attn.multi_head_attention(params, x, ..., implementation="blockwise")

    Args: workers, heads at a time, a positive int; one_thread_blas, called for a context manager
        that keeps BLAS to one thread per call (``contextlib.nullcontext`` where BLAS runs one
        thread); min_scores, the fewest scores per head, B x T x S, for which heads go on threads.

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
