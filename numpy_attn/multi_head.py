"""The book's ``MultiHeadAttention`` (section 3.6.2): causal attention with the heads as one more axis."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from numpy_attn.ops import causal_mask, linear, merge_heads, scaled_dot_product_attention, split_heads
from numpy_attn.steps import Steps


def multi_head_attention(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    num_heads: int,
    context_length: int,
    dropout: float = 0.0,
    rng: np.random.Generator | None = None,
    attn_keep_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, Steps]:
    """``MultiHeadAttention``: the projections split into ``num_heads`` causal heads, merged, projected.

    Args:
        params: ``W_query``, ``W_key``, ``W_value`` (``.weight`` ``(E, D)``, ``.bias`` ``(E,)`` with
            ``qkv_bias``) and ``out_proj`` (``.weight`` ``(E, E)``, ``.bias`` ``(E,)``: always in
            the book's class, with ``qkv_bias`` in note 004's).
        x: ``(B, T, D)``, T <= context_length.
        dropout, rng, attn_keep_mask: as ``causal_attention``'s; the keep-mask is ``(B, N, T, S)``.
    Returns: ``(output (B, T, E), steps)``.
    """
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
        queries, keys, values, mask, dropout=dropout, rng=rng, attn_keep_mask=attn_keep_mask
    )  # (B, N, T, H)
    context_vec = merge_heads(context_vec)  # (B, T, E)
    output = linear(context_vec, params["out_proj.weight"], params.get("out_proj.bias"))  # (B, T, E)
    return output, Steps(**steps, **attention_steps, context_vec=context_vec, output=output)
