"""Boolean attention masks, built from shapes. True = hidden, as in the notes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["causal_mask"]


def causal_mask(num_queries: int, num_keys: int | None = None) -> jax.Array:
    """``(T, S)`` bool mask, True = hidden: query t may not see key s when s > t.

    This is the notes' ``torch.triu(torch.ones(T, S), diagonal=1).bool()``, built from the
    shapes instead of sliced from a ``(context_length, context_length)`` buffer. Note that
    ``jax.nn.dot_product_attention`` and Flax take the opposite meaning (True = may attend).
    """
    num_keys = num_queries if num_keys is None else num_keys
    return jnp.triu(jnp.ones((num_queries, num_keys), dtype=bool), k=1)
