"""Decoding with a key/value cache: prefill once, then one token at a time, for the causal classes.

A ``KVCache`` holds the keys and values of every token seen so far, per head, in fixed-size
``(B, N, L, H)`` arrays (``L`` = the layer's context length), which padding keys it must hide,
and how many tokens it holds (a JAX scalar). Each call projects only the new tokens, writes
their keys and values with ``lax.dynamic_update_slice`` and attends the new queries to the whole
cache, the unwritten slots hidden by the causal mask: shapes never change, so under ``jax.jit``
decoding compiles once for the prefill length and once for single tokens, not once per token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_attn.attention import unchecked_scaled_dot_product_attention
from jax_attn.checks import check_dtype, check_layer
from jax_attn.heads import unchecked_merge_heads, unchecked_split_heads
from jax_attn.linear import unchecked_linear, unchecked_qkv_projections
from jax_attn.masks import unchecked_causal_mask
from numpy_attn.validation import (
    check_decode_room,
    check_kv_cache,
    check_kv_cache_sizes,
    check_padding_mask,
)

__all__ = [
    "KVCache",
    "cache_length",
    "fused_causal_attention_decode",
    "init_kv_cache",
    "multi_head_attention_decode",
    "unchecked_multi_head_attention_decode",
]


class KVCache(NamedTuple):
    keys: jax.Array  # (B, N, L, H)
    values: jax.Array  # (B, N, L, H)
    padding: jax.Array  # (B, L) bool, True = a padding token (hidden from every query)
    length: jax.Array  # () int32: tokens cached so far


def init_kv_cache(batch: int, num_heads: int, max_length: int, head_dim: int, dtype=jnp.float32) -> KVCache:
    """An empty cache for ``max_length`` tokens (the layer's ``context_length``/``context_size``),
    in the dtype of the x and weights it will be used with (the decode functions check it)."""
    check_kv_cache_sizes(batch, num_heads, max_length, head_dim)
    check_dtype(dtype)  # float64 only in 64-bit mode, as the layers' x
    shape = (batch, num_heads, max_length, head_dim)
    return KVCache(
        jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, max_length), bool),
        jnp.zeros((), jnp.int32),
    )  # fmt: skip


def cache_length(cache: KVCache) -> int | None:
    """The tokens a (checked) cache holds, as an int; None under jax.jit, where it is not known."""
    return None if isinstance(cache.length, jax.core.Tracer) else int(cache.length)


def _check_cache(
    cache: KVCache, x: jax.Array, num_heads: int, head_dim: int, context_length: int, context_name: str
) -> None:
    """A decode function's ``cache`` for new tokens ``x``: ``check_kv_cache``, then, where the
    length is concrete (under jax.jit the caller keeps within the cache and the context), room
    for x's tokens in the cache and within the layer's ``context_length`` (``context_name``)."""
    check_kv_cache(cache, KVCache, jax.Array, x, num_heads, head_dim)
    check_decode_room(cache_length(cache), cache.keys.shape[-2], x.shape, context_length, context_name)


def _decode(
    queries: jax.Array, keys: jax.Array, values: jax.Array, cache: KVCache, padding_mask: jax.Array | None
) -> tuple[jax.Array, KVCache]:
    """Append the new keys/values (B, N, t, H) and attend the new queries to the whole cache."""
    # int32, as init_kv_cache's: a hand-built cache's int too, and a narrow one (uint8) would wrap
    start, num_tokens = jnp.asarray(cache.length, jnp.int32), queries.shape[-2]
    zero = jnp.zeros((), start.dtype)  # update indices share one integer type
    new_padding = jnp.zeros((*queries.shape[:1], num_tokens), bool) if padding_mask is None else padding_mask
    cache = KVCache(
        jax.lax.dynamic_update_slice(cache.keys, keys.astype(cache.keys.dtype), (zero, zero, start, zero)),
        jax.lax.dynamic_update_slice(
            cache.values, values.astype(cache.values.dtype), (zero, zero, start, zero)
        ),
        jax.lax.dynamic_update_slice(cache.padding, new_padding, (zero, start)),
        start + num_tokens,
    )
    max_length = cache.keys.shape[-2]
    mask = (
        unchecked_causal_mask(num_tokens, max_length, offset=start) | cache.padding[:, None, None, :]
    )  # (B, 1, t, L)
    context_vec = unchecked_scaled_dot_product_attention(
        queries, cache.keys, cache.values, mask
    )  # (B, N, t, H)
    return unchecked_merge_heads(context_vec), cache


def multi_head_attention_decode(
    params: Mapping[str, jax.Array], x: jax.Array, cache: KVCache, *, num_heads: int, context_length: int
) -> tuple[jax.Array, KVCache]:
    """``MultiHeadAttention`` on new tokens ``x`` (B, t, D) given the cache of the earlier ones.

    Returns ``(output (B, t, E), new_cache)`` (the given cache is unchanged): the outputs the
    full causal pass gives at those positions (evaluation mode: no dropout). Prefill with the
    prompt, then call with one token. ``context_length`` is the layer's: the tokens the cache
    holds plus x's may exceed neither it (the full causal pass refuses that many) nor the cache's
    size, ValueError otherwise (checked where the cache's length is concrete: under jax.jit it is
    traced, and the caller keeps within the cache and the context).
    """
    check_layer("MultiHeadAttention", params, x, num_heads=num_heads, context_length=context_length)
    _check_cache(
        cache, x, num_heads, params["out_proj.weight"].shape[1] // num_heads, context_length, "context_length"
    )
    return unchecked_multi_head_attention_decode(params, x, cache, num_heads=num_heads)


def unchecked_multi_head_attention_decode(
    params: Mapping[str, jax.Array], x: jax.Array, cache: KVCache, *, num_heads: int
) -> tuple[jax.Array, KVCache]:
    """``multi_head_attention_decode`` without its checks, for a caller that has made them (the
    GPT's decode, once per call rather than once per block and token)."""
    x = jnp.asarray(x)  # arrays from any framework compute here
    queries, keys, values = unchecked_qkv_projections(x, params, fused=True)  # 3 x (B, t, E)
    context_vec, cache = _decode(
        unchecked_split_heads(queries, num_heads),
        unchecked_split_heads(keys, num_heads),
        unchecked_split_heads(values, num_heads),
        cache, None,
    )  # fmt: skip  # (B, t, E)
    return unchecked_linear(context_vec, params["out_proj.weight"], params.get("out_proj.bias")), cache


def fused_causal_attention_decode(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    cache: KVCache,
    padding_mask: jax.Array | None = None,
    *,
    num_heads: int,
    context_size: int,
) -> tuple[jax.Array, KVCache]:
    """``FusedCausalAttention`` on new tokens ``x`` (B, t, D) given the cache of the earlier ones;
    ``padding_mask`` (bool ``(B, t)``, True = padding) marks new padding tokens, which stay
    hidden from every later query. Returns ``(output (B, t, D), new_cache)``, evaluation mode;
    the given cache is unchanged. ``context_size`` is the layer's: the tokens the cache holds
    plus x's may exceed neither it (the full causal pass refuses that many) nor the cache's size,
    ValueError otherwise (checked where the cache's length is concrete: under jax.jit it is
    traced, and the caller keeps within the cache and the context)."""
    check_layer("FusedCausalAttention", params, x, num_heads=num_heads, context_length=context_size,
                context_name="context_size")  # fmt: skip
    if padding_mask is not None:
        check_padding_mask(padding_mask, x.shape[0], x.shape[1])
    _check_cache(cache, x, num_heads, params["Wo.weight"].shape[1] // num_heads, context_size, "context_size")
    x = jnp.asarray(x)  # arrays from any framework compute here
    qkv = unchecked_linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, t, 3 * D)
    queries, keys, values = jnp.split(qkv, 3, axis=-1)  # 3 x (B, t, D)
    context_vec, cache = _decode(
        unchecked_split_heads(queries, num_heads),
        unchecked_split_heads(keys, num_heads),
        unchecked_split_heads(values, num_heads),
        cache, padding_mask,
    )  # fmt: skip  # (B, t, D)
    return unchecked_linear(context_vec, params["Wo.weight"], params.get("Wo.bias")), cache
