"""Decoding with a key/value cache (the causal classes): prefill once, then one token at a time.

A ``KVCache`` holds the keys and values of every token seen so far, per head, in fixed-size
``(B, N, L, H)`` arrays (L = the layer's context length), which of them are padding, and how many
tokens it holds. Each call projects only the new tokens, attends their queries to the cached keys
and to their own, and writes their keys and values after the cached ones: outputs equal the full
causal pass's at O(L) work per token. Caches are values: a call returns a new cache, the one given
is unchanged; ``length`` is a JAX scalar, so that jitted decoding compiles once.

Where numpy_attn writes the new keys first and attends to the cache's filled part, this file reads
the cache as it was and writes after: XLA then updates a donated cache (or a loop's) in place. A
program that read the cache it had just written would copy all of it at every token (two or three
copies in ``jax_attn.generate``'s optimised HLO; ``python -m parity_tests.bench.gpt`` counts them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_attn.ops import causal_mask, linear, merge_heads, softmax, split_heads
from numpy_attn.ops import compute_dtype


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


def token_positions(cache: KVCache, padding_mask: jax.Array | None, num_tokens: int) -> jax.Array:
    """The positions ``(B, t)`` of t new tokens: the tokens before each that are not padding, in the
    cache and among the new ones (a padding token's, 0 at least, is never seen). The GPT's position
    embeddings and the decoders' RoPE read them: a left-padded row decodes as it would alone."""
    start = jnp.asarray(cache.length, jnp.int32)  # a uint8 length would wrap
    filled = jnp.arange(cache.padding.shape[1]) < start  # (L,)
    cached = jnp.count_nonzero(~cache.padding & filled, axis=1)  # (B,) tokens cached, padding left out
    if padding_mask is None:
        return cached[:, None] + jnp.arange(num_tokens)  # (B, t)
    return jnp.maximum(cached[:, None] + jnp.cumsum(~padding_mask, axis=1) - 1, 0)  # (B, t)


def attend_cached(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    cache: KVCache,
    padding_mask: jax.Array | None,
    *,
    empty: bool = False,
) -> tuple[jax.Array, KVCache]:
    """The new tokens' queries ``(B, N, t, H)`` attended to the cached tokens and to the new ones up
    to their own (one softmax over both), then the new keys and values ``(B, G, t, H)`` written after
    the cache's (shapes never change: under ``jax.jit`` decoding compiles once per input length).
    Query head n reads key/value head ``n // (N/G)`` (G = N: multi-head attention; G < N: grouped-
    query attention, whose cache holds the G key/value heads alone). The cache's unwritten slots and
    padding are hidden, and the new tokens ``padding_mask`` marks. ``empty``: the cache is known to
    hold no token (a prompt's pass): its keys are not read.
    Returns: ``(context_vec (B, t, N*H), new cache)``."""
    start, num_tokens = jnp.asarray(cache.length, jnp.int32), queries.shape[-2]  # a uint8 length would wrap
    padding = jnp.zeros((queries.shape[0], num_tokens), bool) if padding_mask is None else padding_mask
    max_length = cache.keys.shape[-2]
    hidden_cached = (jnp.arange(max_length) >= start) | cache.padding  # (B, L): unwritten or padding
    hidden_new = causal_mask(num_tokens) | padding[:, None, :]  # (B, t, t)
    dtype, compute = queries.dtype, compute_dtype(queries.dtype)
    b, num_heads, _, head_size = queries.shape
    num_kv_groups = keys.shape[1]
    grouped = (b, num_kv_groups, num_heads // num_kv_groups, num_tokens)  # (B, G, N/G, t)
    # a group's rows: its N/G query heads' t tokens, (B, G, N/G·t, H), against its key/value head
    rows = queries.reshape(b, num_kv_groups, -1, head_size).astype(compute)
    new_scores = jnp.einsum("bgqh,bgsh->bgqs", rows, keys.astype(compute)).reshape(*grouped, -1)
    attn_scores = jnp.where(hidden_new[:, None, None], -jnp.inf, new_scores)  # (B, G, N/G, t, t)
    if not empty:
        cached_scores = jnp.einsum("bgqh,bgsh->bgqs", rows, cache.keys.astype(compute)).reshape(*grouped, -1)
        cached_scores = jnp.where(hidden_cached[:, None, None, None], -jnp.inf, cached_scores)
        attn_scores = jnp.concatenate([cached_scores, attn_scores], axis=-1)  # (B, G, N/G, t, L + t)
    attn_weights = softmax(attn_scores / head_size**0.5, axis=-1).astype(dtype)  # (B, G, N/G, t, L + t)
    attn_weights = attn_weights.reshape(b, num_kv_groups, -1, attn_weights.shape[-1])  # (B, G, N/G·t, L + t)
    context_vec = attn_weights[..., -num_tokens:] @ values  # (B, G, N/G·t, H)
    if not empty:
        # rounded to the model's dtype as a 16-bit cache's product is (a float32 cache of 16-bit values)
        context_vec = (attn_weights[..., :max_length] @ cache.values).astype(dtype) + context_vec
    context_vec = context_vec.reshape(queries.shape)  # (B, N, t, H)
    zero = jnp.zeros((), jnp.int32)
    cache = KVCache(
        write_tokens(cache.keys, keys, start),
        write_tokens(cache.values, values, start),
        jax.lax.dynamic_update_slice(cache.padding, padding, (zero, start)),
        start + num_tokens,
    )
    return merge_heads(context_vec), cache


def write_tokens(cached: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """``cached`` ``(B, G, L, H)`` with ``new`` ``(B, G, t, H)`` written at token ``start``; a 16-bit
    cache as the unsigned integers of its bits (XLA:CPU computes a 16-bit dynamic-update-slice in
    float32: the whole cache converted there and back at every token; the integers' is a copy of
    it, a third of that time)."""
    new = new.astype(cached.dtype)
    zero = jnp.zeros((), jnp.int32)
    if cached.dtype.itemsize != 2:
        return jax.lax.dynamic_update_slice(cached, new, (zero, zero, start, zero))
    bits = jax.lax.dynamic_update_slice(
        jax.lax.bitcast_convert_type(cached, jnp.uint16),
        jax.lax.bitcast_convert_type(new, jnp.uint16),
        (zero, zero, start, zero),
    )
    return jax.lax.bitcast_convert_type(bits, cached.dtype)


def multi_head_attention_decode(
    params: Mapping[str, jax.Array], x: jax.Array, cache: KVCache, *, num_heads: int, context_length: int
) -> tuple[jax.Array, KVCache]:
    """``MultiHeadAttention`` on new tokens given the cache of the earlier ones (evaluation mode). As
    ``numpy_attn.multi_head_attention_decode``."""
    return attention_decode(params, x, cache, None, num_heads=num_heads)


def attention_decode(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    cache: KVCache,
    padding_mask: jax.Array | None,
    *,
    num_heads: int,
    empty: bool = False,
    linear: Callable[..., jax.Array] = linear,
) -> tuple[jax.Array, KVCache]:
    """``multi_head_attention_decode`` with a ``padding_mask`` (bool ``(B, t)``, True = padding: the
    new tokens hidden from every later query), as the GPT's blocks decode; ``empty``: the cache is
    known to hold no token (``attend_cached``); ``linear``: the product of each weight
    (``ops.linear``'s arguments; ``jax_attn.generate``'s accumulates 16-bit ones in float32)."""
    b, num_tokens, _ = x.shape
    rows = x.reshape(b * num_tokens, x.shape[-1])  # (B·t, D): one product per weight, a GEMV at t = 1
    queries = linear(rows, params["W_query.weight"], params.get("W_query.bias")).reshape(b, num_tokens, -1)
    keys = linear(rows, params["W_key.weight"], params.get("W_key.bias")).reshape(b, num_tokens, -1)
    values = linear(rows, params["W_value.weight"], params.get("W_value.bias")).reshape(b, num_tokens, -1)
    context_vec, cache = attend_cached(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads),
        cache, padding_mask, empty=empty,
    )  # fmt: skip  # (B, t, E)
    output = linear(
        context_vec.reshape(b * num_tokens, -1), params["out_proj.weight"], params.get("out_proj.bias")
    )
    return output.reshape(b, num_tokens, -1), cache  # (B, t, E)


def fused_causal_attention_decode(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    cache: KVCache,
    padding_mask: jax.Array | None = None,
    *,
    num_heads: int,
    context_size: int,
) -> tuple[jax.Array, KVCache]:
    """``FusedCausalAttention`` on new tokens given the cache of the earlier ones (evaluation mode). As
    ``numpy_attn.fused_causal_attention_decode``."""
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, t, 3D)
    queries, keys, values = jnp.split(qkv, 3, axis=-1)  # 3 x (B, t, D)
    context_vec, cache = attend_cached(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads),
        cache, padding_mask,
    )  # fmt: skip  # (B, t, D)
    return linear(context_vec, params["Wo.weight"], params.get("Wo.bias")), cache
