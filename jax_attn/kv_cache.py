"""Decoding with a key/value cache (the causal classes): prefill once, then one token at a time.

A ``KVCache`` holds the keys and values of every token seen so far, per head, in fixed-size
``(B, N, L, H)`` arrays (L = the layer's context length), which of them are padding, and how many
tokens it holds. Each call projects only the new tokens, writes their keys and values after the
cached ones and attends the new queries to the cache: outputs equal the full causal pass's at
O(L) work per token. Caches are values: a call returns a new cache, the one given is unchanged;
``length`` is a JAX scalar, so that jitted decoding compiles once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_attn.ops import causal_mask, linear, merge_heads, scaled_dot_product_attention, split_heads

__all__ = ["KVCache", "fused_causal_attention_decode", "init_kv_cache", "multi_head_attention_decode"]


class KVCache(NamedTuple):
    keys: jax.Array  # (B, N, L, H)
    values: jax.Array  # (B, N, L, H)
    padding: jax.Array  # (B, L) bool, True = a padding token (hidden from every query)
    length: jax.Array  # () int32: tokens cached so far


def init_kv_cache(batch: int, num_heads: int, max_length: int, head_dim: int, dtype=jnp.float32) -> KVCache:
    """An empty cache for ``max_length`` tokens (the layer's ``context_length``/``context_size``), in
    the dtype of the x and weights it will be used with."""
    shape = (batch, num_heads, max_length, head_dim)
    zeros = jnp.zeros(shape, dtype)
    return KVCache(zeros, zeros, jnp.zeros((batch, max_length), bool), jnp.zeros((), jnp.int32))


def attend_cached(
    queries: jax.Array, keys: jax.Array, values: jax.Array, cache: KVCache, padding_mask: jax.Array | None
) -> tuple[jax.Array, KVCache]:
    """The new tokens' keys and values ``(B, N, t, H)`` written after the cache's, and their queries
    attended to the whole cache, its unwritten slots hidden by the causal mask (shapes never
    change: under ``jax.jit`` decoding compiles once per input length): ``(context_vec (B, t, E),
    new cache)``."""
    start, num_tokens = jnp.asarray(cache.length, jnp.int32), queries.shape[-2]  # a uint8 length would wrap
    zero = jnp.zeros((), jnp.int32)
    padding = jnp.zeros((queries.shape[0], num_tokens), bool) if padding_mask is None else padding_mask
    cache = KVCache(
        jax.lax.dynamic_update_slice(cache.keys, keys.astype(cache.keys.dtype), (zero, zero, start, zero)),
        jax.lax.dynamic_update_slice(
            cache.values, values.astype(cache.values.dtype), (zero, zero, start, zero)
        ),
        jax.lax.dynamic_update_slice(cache.padding, padding, (zero, start)),
        start + num_tokens,
    )
    mask = (
        causal_mask(num_tokens, cache.keys.shape[-2], offset=start) | cache.padding[:, None, None, :]
    )  # (B, 1, t, L)
    context_vec, _ = scaled_dot_product_attention(queries, cache.keys, cache.values, mask)  # (B, N, t, H)
    return merge_heads(context_vec), cache


def multi_head_attention_decode(
    params: Mapping[str, jax.Array], x: jax.Array, cache: KVCache, *, num_heads: int, context_length: int
) -> tuple[jax.Array, KVCache]:
    """``MultiHeadAttention`` on new tokens given the cache of the earlier ones (evaluation mode).

    Args: params as ``multi_head_attention``'s; x ``(B, t, D)``; the cache's tokens plus t within
    the cache and ``context_length``.
    Returns: ``(output (B, t, E), new_cache)``: the full causal pass's outputs at those positions.
    """
    queries = linear(x, params["W_query.weight"], params.get("W_query.bias"))  # (B, t, E)
    keys = linear(x, params["W_key.weight"], params.get("W_key.bias"))  # (B, t, E)
    values = linear(x, params["W_value.weight"], params.get("W_value.bias"))  # (B, t, E)
    context_vec, cache = attend_cached(
        split_heads(queries, num_heads),
        split_heads(keys, num_heads),
        split_heads(values, num_heads),
        cache,
        None,
    )  # (B, t, E)
    return linear(context_vec, params["out_proj.weight"], params.get("out_proj.bias")), cache


def fused_causal_attention_decode(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    cache: KVCache,
    padding_mask: jax.Array | None = None,
    *,
    num_heads: int,
    context_size: int,
) -> tuple[jax.Array, KVCache]:
    """``FusedCausalAttention`` on new tokens given the cache of the earlier ones (evaluation mode).

    Args: params as ``fused_causal_attention``'s; x ``(B, t, D)``; padding_mask bool ``(B, t)``,
    True = padding: the new tokens hidden from every later query.
    Returns: ``(output (B, t, D), new_cache)``.
    """
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, t, 3D)
    queries, keys, values = jnp.split(qkv, 3, axis=-1)  # 3 x (B, t, D)
    context_vec, cache = attend_cached(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads),
        cache, padding_mask,
    )  # fmt: skip  # (B, t, D)
    return linear(context_vec, params["Wo.weight"], params.get("Wo.bias")), cache
