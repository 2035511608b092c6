"""``CausalAttention`` and ``MultiHeadAttentionWrapper`` (the book's sections 3.5 and 3.6.1): one
causal head, and a stack of them whose outputs are concatenated."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jax_attn.ops import causal_mask, linear, scaled_dot_product_attention
from numpy_attn.steps import Steps


def causal_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    context_length: int,
    dropout: float = 0.0,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
) -> tuple[jax.Array, Steps]:
    """``CausalAttention``: one head; token t sees tokens 0..t; dropout on the attention weights.

    Args:
        params: ``W_query``, ``W_key``, ``W_value`` (``nn.Linear``: ``.weight`` ``(E, D)``,
            ``.bias`` ``(E,)`` with ``qkv_bias``).
        x: ``(B, T, D)``, T <= context_length (the length of the class's mask buffer).
        dropout, key, attn_keep_mask: dropout happens with a ``key`` (a ``jax.random`` key)
            or ``attn_keep_mask`` (bool ``(B, T, S)``, True = keep); otherwise eval mode.
    Returns: ``(output (B, T, E), steps)``.
    """
    b, num_tokens, d_in = x.shape
    queries = linear(x, params["W_query.weight"], params.get("W_query.bias"))  # (B, T, E)
    keys = linear(x, params["W_key.weight"], params.get("W_key.bias"))  # (B, T, E)
    values = linear(x, params["W_value.weight"], params.get("W_value.bias"))  # (B, T, E)
    mask = causal_mask(num_tokens)  # (T, S), True = hidden: the buffer's [:T, :T]
    context_vec, steps = scaled_dot_product_attention(
        queries, keys, values, mask, dropout=dropout, key=key, attn_keep_mask=attn_keep_mask
    )  # (B, T, E)
    steps = Steps(queries=queries, keys=keys, values=values, **steps, context_vec=context_vec)
    return context_vec, Steps(**steps, output=context_vec)


def multi_head_attention_wrapper(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    context_length: int,
    dropout: float = 0.0,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
) -> tuple[jax.Array, Steps]:
    """``MultiHeadAttentionWrapper``: ``num_heads`` independent ``CausalAttention`` heads, concatenated. As
    ``numpy_attn.multi_head_attention_wrapper``; ``key`` (a ``jax.random`` key) in place of ``rng``."""
    head_outputs, steps = [], Steps()
    for i in range(num_heads):
        prefix = f"heads.{i}."
        head_params = {name.removeprefix(prefix): w for name, w in params.items() if name.startswith(prefix)}
        head_keep_mask = None if attn_keep_mask is None else attn_keep_mask[:, i]  # (B, T, S)
        head_key = None if key is None else jax.random.fold_in(key, i)  # each head its own draws
        head_output, head_steps = causal_attention(
            head_params,
            x,
            context_length=context_length,
            dropout=dropout,
            key=head_key,
            attn_keep_mask=head_keep_mask,
        )  # (B, T, E)
        head_outputs.append(head_output)
        steps.update((prefix + name, value) for name, value in head_steps.items())
    context_vec = jnp.concatenate(head_outputs, axis=-1)  # (B, T, N * E)
    return context_vec, Steps(**steps, context_vec=context_vec, output=context_vec)
