"""Boolean attention masks, built from shapes. True = hidden, as in the notes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpy_attn.validation import check_causal_mask_args

__all__ = ["causal_mask", "unchecked_causal_mask"]


def causal_mask(num_queries: int, num_keys: int | None = None, offset: int = 0) -> jax.Array:
    """``(T, S)`` bool mask, True = hidden: query t, at position ``offset + t``, may not see key s
    when s > offset + t.

    With ``offset=0`` and T = S this is the notes' ``torch.triu(torch.ones(T, S), diagonal=1)``,
    built from the shapes instead of sliced from a ``(context_length, context_length)`` buffer;
    a KV cache's new queries sit at ``offset`` = the number of tokens already cached (which may
    be a traced value under ``jax.jit``).
    ``jax.nn.dot_product_attention`` and Flax take the opposite meaning (True = may attend).

    The sizes are positive ints (NumPy ints too; a float, a bool or another type is a
    TypeError, a size below 1 a ValueError, ``check_size``'s wording), ``offset`` an int of
    either sign with ``|offset| + max(T, S) <= 2**31 - 1`` or a 0-d integer JAX array
    (``check_causal_mask_args``), as in numpy_attn.
    """
    check_causal_mask_args(num_queries, num_keys, offset, jax.Array)
    return unchecked_causal_mask(num_queries, num_keys, offset)


def unchecked_causal_mask(num_queries: int, num_keys: int | None = None, offset: int = 0) -> jax.Array:
    """``causal_mask`` for sizes and an offset already checked (the layers' and the KV cache's)."""
    num_keys = num_queries if num_keys is None else num_keys
    query_positions = offset + jnp.arange(num_queries)[:, None]  # (T, 1)
    return jnp.arange(num_keys)[None, :] > query_positions  # (T, S)
