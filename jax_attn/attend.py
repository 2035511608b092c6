"""The attention core of every layer, by implementation: the notes' math or the blockwise path."""

from __future__ import annotations

import jax

from jax_attn.attention import scaled_dot_product_attention
from jax_attn.blockwise import DEFAULT_BLOCK_SIZE, blockwise_attention
from jax_attn.masks import causal_mask
from numpy_attn.steps import Steps
from numpy_attn.validation import uses_blockwise

__all__ = ["attend"]


def attend(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    *,
    causal: bool = False,
    padding_mask: jax.Array | None = None,
    dropout: float | None = None,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> tuple[jax.Array, Steps]:
    """``(context_vec, steps)`` of ``(..., T, H)`` queries against ``(..., S, H)`` keys/values.

    ``implementation="reference"`` builds the mask (causal, OR the ``(B, S)`` padding mask,
    True = hidden) and runs ``scaled_dot_product_attention``; ``"blockwise"`` runs
    ``blockwise_attention`` in O(T) memory; ``"auto"`` picks blockwise from
    ``validation.AUTO_BLOCKWISE_TOKENS`` query tokens on. The (T, S) steps are materialised only
    with ``return_steps`` (then by the reference math; the context still comes from the chosen
    path, and random dropout draws one keep-mask from ``key`` that both use).
    """
    blockwise = uses_blockwise(implementation, queries.shape[-2])
    if blockwise and return_steps and key is not None and dropout:
        shape = queries.shape[:-1] + keys.shape[-2:-1]
        attn_keep_mask = jax.random.bernoulli(key, 1 - dropout, shape)
        key = None
    steps = Steps()
    if not blockwise or return_steps:
        mask = causal_mask(queries.shape[-2], keys.shape[-2]) if causal else None  # (T, S)
        if padding_mask is not None:
            hidden_keys = padding_mask[:, None, None, :]  # (B, 1, 1, S)
            mask = hidden_keys if mask is None else mask | hidden_keys  # (B, 1, T, S)
        context_vec, steps = scaled_dot_product_attention(
            queries, keys, values, mask,
            dropout=dropout, key=key, attn_keep_mask=attn_keep_mask, return_steps=True,
        )  # fmt: skip
        if not blockwise:
            return context_vec, steps
    context_vec = blockwise_attention(
        queries, keys, values, causal=causal, padding_mask=padding_mask, dropout=dropout,
        key=key, attn_keep_mask=attn_keep_mask, block_size=block_size,
    )  # fmt: skip
    return context_vec, steps
