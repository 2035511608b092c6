"""``SelfAttentionV1`` and ``SelfAttentionV2`` (the book's section 3.4): one trainable head, every
token sees every token, input ``(T, D)``."""

from __future__ import annotations

from collections.abc import Mapping

import jax

from jax_attn.ops import linear, scaled_dot_product_attention
from numpy_attn.steps import Steps


def self_attention_v1(params: Mapping[str, jax.Array], x: jax.Array) -> tuple[jax.Array, Steps]:
    """``SelfAttentionV1``: raw ``(D, E)`` matrices used as ``x @ W``. As ``numpy_attn.self_attention_v1``."""
    queries = x @ params["W_query"]  # (T, E)
    keys = x @ params["W_key"]  # (T, E)
    values = x @ params["W_value"]  # (T, E)
    context_vec, steps = scaled_dot_product_attention(queries, keys, values)  # (T, E)
    steps = Steps(queries=queries, keys=keys, values=values, **steps, context_vec=context_vec)
    return context_vec, Steps(**steps, output=context_vec)


def self_attention_v2(params: Mapping[str, jax.Array], x: jax.Array) -> tuple[jax.Array, Steps]:
    """``SelfAttentionV2``: the projections are ``nn.Linear`` layers (with ``qkv_bias``, biased). As
    ``numpy_attn.self_attention_v2``."""
    queries = linear(x, params["W_query.weight"], params.get("W_query.bias"))  # (T, E)
    keys = linear(x, params["W_key.weight"], params.get("W_key.bias"))  # (T, E)
    values = linear(x, params["W_value.weight"], params.get("W_value.bias"))  # (T, E)
    context_vec, steps = scaled_dot_product_attention(queries, keys, values)  # (T, E)
    steps = Steps(queries=queries, keys=keys, values=values, **steps, context_vec=context_vec)
    return context_vec, Steps(**steps, output=context_vec)
