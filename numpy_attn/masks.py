"""Boolean attention masks, built from shapes. True = hidden, as in the notes."""

from __future__ import annotations

import functools

import numpy as np

from numpy_attn.validation import check_causal_mask_args

__all__ = ["causal_mask", "unchecked_causal_mask"]


def causal_mask(num_queries: int, num_keys: int | None = None, offset: int = 0) -> np.ndarray:
    """``(T, S)`` bool mask, True = hidden: query t, at position ``offset + t``, may not see key s
    when s > offset + t.

    With ``offset=0`` and T = S this is the notes' ``torch.triu(torch.ones(T, S), diagonal=1)``,
    built from the shapes instead of sliced from a ``(context_length, context_length)`` buffer;
    a KV cache's new queries sit at ``offset`` = the number of tokens already cached (which may
    be a traced value under ``jax.jit``).

    A pure function of its arguments, so built once per ``(T, S, offset)`` and returned
    read-only (a layer call would otherwise rebuild it every time); the last 32 are kept, T x S
    bytes each, where the reference math that uses one holds 4 x B x N times that in its scores.

    The sizes are positive ints (NumPy ints too; a float, a bool or another type is a
    TypeError, a size below 1 a ValueError, ``check_size``'s wording), ``offset`` an int of
    either sign with ``|offset| + max(T, S) <= 2**31 - 1`` (``check_causal_mask_args``),
    checked before the cache is looked up.

    >>> causal_mask(3).astype(int)
    array([[0, 1, 1],
           [0, 0, 1],
           [0, 0, 0]])
    """
    check_causal_mask_args(num_queries, num_keys, offset)
    return unchecked_causal_mask(num_queries, num_keys, offset)


@functools.lru_cache(maxsize=32)
def unchecked_causal_mask(num_queries: int, num_keys: int | None = None, offset: int = 0) -> np.ndarray:
    """``causal_mask`` for sizes and an offset already checked (the layers', the KV cache's and
    the blockwise tiles'): the cached mask, read-only."""
    num_keys = num_queries if num_keys is None else num_keys
    query_positions = offset + np.arange(num_queries)[:, None]  # (T, 1)
    mask = np.arange(num_keys)[None, :] > query_positions  # (T, S)
    mask.flags.writeable = False
    return mask
