"""The book's ``MultiHeadAttention`` (section 3.6.2): causal attention with the heads as one more axis."""

from __future__ import annotations

from collections.abc import Mapping

import jax

from jax_attn.ops import causal_mask, linear, merge_heads, scaled_dot_product_attention, split_heads
from numpy_attn.steps import Steps


def multi_head_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    context_length: int,
    dropout: float = 0.0,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
) -> tuple[jax.Array, Steps]:
    """``MultiHeadAttention``: the projections split into ``num_heads`` causal heads, merged, projected. As
    ``numpy_attn.multi_head_attention``; ``key`` (a ``jax.random`` key) in place of ``rng``."""
    b, num_tokens, d_in = x.shape
    queries = linear(x, params["W_query.weight"], params.get("W_query.bias"))  # (B, T, E)
    keys = linear(x, params["W_key.weight"], params.get("W_key.bias"))  # (B, T, E)
    values = linear(x, params["W_value.weight"], params.get("W_value.bias"))  # (B, T, E)
    steps = Steps(queries=queries, keys=keys, values=values)

    queries = split_heads(queries, num_heads)  # (B, N, T, H)
    keys = split_heads(keys, num_heads)  # (B, N, S, H)
    values = split_heads(values, num_heads)  # (B, N, S, H)
    mask = causal_mask(num_tokens)  # (T, S), True = hidden
    context_vec, attention_steps = scaled_dot_product_attention(
        queries, keys, values, mask, dropout=dropout, key=key, attn_keep_mask=attn_keep_mask
    )  # (B, N, T, H)
    context_vec = merge_heads(context_vec)  # (B, T, E)
    output = linear(context_vec, params["out_proj.weight"], params.get("out_proj.bias"))  # (B, T, E)
    return output, Steps(**steps, **attention_steps, context_vec=context_vec, output=output)
