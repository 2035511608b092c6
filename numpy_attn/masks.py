"""Boolean attention masks, built from shapes. True = hidden, as in the notes."""

from __future__ import annotations

import numpy as np

__all__ = ["causal_mask"]


def causal_mask(num_queries: int, num_keys: int | None = None) -> np.ndarray:
    """``(T, S)`` bool mask, True = hidden: query t may not see key s when s > t.

    This is the notes' ``torch.triu(torch.ones(T, S), diagonal=1).bool()``, built from the
    shapes instead of sliced from a ``(context_length, context_length)`` buffer.

    >>> causal_mask(3).astype(int)
    array([[0, 1, 1],
           [0, 0, 1],
           [0, 0, 0]])
    """
    num_keys = num_queries if num_keys is None else num_keys
    return np.triu(np.ones((num_queries, num_keys), dtype=bool), k=1)
