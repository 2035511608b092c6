"""Note 003's classes: one fused ``Wqkv`` projection cut into queries, keys and values, and an
output projection ``Wo``."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jax_attn.ops import (
    causal_mask,
    dropout,
    linear,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)
from numpy_attn.steps import Steps


def fused_single_head_attention(params: Mapping[str, jax.Array], x: jax.Array) -> tuple[jax.Array, Steps]:
    """``FusedSingleHeadAttention`` (note 003's ``SingleHeadAttention``): one bidirectional head of
    size E = D // 4. As ``numpy_attn.fused_single_head_attention``."""
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, T, 3E)
    queries, keys, values = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, E): the notes' unbind
    context_vec, steps = scaled_dot_product_attention(queries, keys, values)  # (B, T, E)
    output = linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    steps = Steps(queries=queries, keys=keys, values=values, **steps, context_vec=context_vec)
    return output, Steps(**steps, output=output)


def fused_multi_head_attention(
    params: Mapping[str, jax.Array], x: jax.Array, *, num_heads: int
) -> tuple[jax.Array, Steps]:
    """``FusedMultiHeadAttention`` (note 003's ``MultiHeadAttention``): bidirectional heads. As
    ``numpy_attn.fused_multi_head_attention``."""
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, T, 3D)
    queries, keys, values = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
    steps = Steps(queries=queries, keys=keys, values=values)
    context_vec, attention_steps = scaled_dot_product_attention(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads)
    )  # (B, N, T, H)
    context_vec = merge_heads(context_vec)  # (B, T, D)
    output = linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    return output, Steps(**steps, **attention_steps, context_vec=context_vec, output=output)


def fused_causal_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    padding_mask: jax.Array | None = None,
    *,
    num_heads: int,
    context_size: int,
    attn_drop: float = 0.1,
    out_drop: float = 0.1,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    out_keep_mask: jax.Array | None = None,
) -> tuple[jax.Array, Steps]:
    """``FusedCausalAttention`` (note 003's ``CausalAttention``): causal heads, a padding mask, and dropout on
    the attention weights and on the output. As ``numpy_attn.fused_causal_attention``; ``key`` (a
    ``jax.random`` key) in place of ``rng`` (split in two: weights, output)."""
    b, num_tokens, d_in = x.shape
    attn_key, out_key = (None, None) if key is None else jax.random.split(key)  # weights, output
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, T, 3D)
    queries, keys, values = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
    steps = Steps(queries=queries, keys=keys, values=values)
    mask = causal_mask(num_tokens)  # (T, S), True = hidden
    if padding_mask is not None:
        mask = mask | padding_mask[:, None, None, :]  # (B, 1, T, S): the notes' mask.view(B, 1, 1, S)
    context_vec, attention_steps = scaled_dot_product_attention(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads),
        mask, dropout=attn_drop, key=attn_key, attn_keep_mask=attn_keep_mask,
    )  # fmt: skip  # (B, N, T, H)
    context_vec = merge_heads(context_vec)  # (B, T, D)
    projected = linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    output = dropout(projected, out_drop, key=out_key, keep_mask=out_keep_mask)  # (B, T, D)
    steps = Steps(**steps, **attention_steps, context_vec=context_vec, projected=projected)
    return output, Steps(**steps, output=output)
