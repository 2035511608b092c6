"""What a call may allocate, checked before it allocates: an array's element count and the bytes
this process may hold. A refusal names the thing, its size and the bound."""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Sequence

# The most elements an array built from sizes may have: past 2**59, XLA's int64 byte counts of
# 16-byte elements overflow and abort the process; no machine holds such an array anyway.
MAX_ELEMENTS = (2**63 - 1) // 16


def check_array_size(what: str, shape: Sequence[int]) -> None:
    """ValueError before an array of more than ``MAX_ELEMENTS`` elements is built from sizes."""
    shape = tuple(int(size) for size in shape)  # Python ints: a NumPy int product would wrap
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise ValueError(
            f"{what} of shape {shape} would have {count} elements, more than an array may hold "
            f"({MAX_ELEMENTS} = 2**59 - 1)"
        )


def memory_bytes() -> int:
    """The bytes this process may hold: the machine's memory, or its address-space limit if lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    return physical if limit == resource.RLIM_INFINITY else min(physical, limit)


def check_memory(what: str, nbytes: int, limit: int | None = None, hint: str = "") -> None:
    """ValueError, before anything is allocated, when ``what`` would take more than ``limit`` bytes
    (this process's ``memory_bytes()``): an allocator's own failure would come later, or kill it."""
    limit = memory_bytes() if limit is None else limit
    if nbytes > limit:
        raise ValueError(
            f"{what} would take {_size(nbytes)}, more than the {_size(limit)} of memory here{hint}"
        )


def _size(nbytes: int) -> str:
    """``3.2 GiB``: bytes in the largest binary unit below them."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    power = min(max(nbytes, 1).bit_length() - 1, 10 * (len(units) - 1)) // 10
    return f"{nbytes} bytes" if power == 0 else f"{nbytes / 1024**power:.1f} {units[power]}"
