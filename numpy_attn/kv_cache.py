"""Decoding with a key/value cache (the causal classes): prefill once, then one token at a time.

A ``KVCache`` holds the keys and values of every token seen so far, per head, in fixed-size
``(B, N, L, H)`` arrays (L = the layer's context length), which of them are padding, and how many
tokens it holds. Each call projects only the new tokens, writes their keys and values after the
cached ones and attends the new queries to the cache's filled part: outputs equal the full causal
pass's at O(L) work per token. Caches are values: a call returns a new cache, the one given is
unchanged. ``generate`` writes its own caches in place (``attention_decode(..., in_place=True)``):
no cache is copied or allocated per token. jax_attn reads the cache before it writes (XLA's
in-place updates need it); here the filled part is a view, read after the write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from numpy_attn.ops import causal_mask, linear, merge_heads, scaled_dot_product_attention, split_heads


class KVCache(NamedTuple):
    keys: np.ndarray  # (B, N, L, H)
    values: np.ndarray  # (B, N, L, H)
    padding: np.ndarray  # (B, L) bool, True = a padding token (hidden from every query)
    length: int  # tokens cached so far


def init_kv_cache(batch: int, num_heads: int, max_length: int, head_dim: int, dtype=np.float32) -> KVCache:
    """An empty cache for ``max_length`` tokens (the layer's ``context_length``/``context_size``), in
    the dtype of the x and weights it will be used with."""
    shape = (batch, num_heads, max_length, head_dim)
    return KVCache(np.zeros(shape, dtype), np.zeros(shape, dtype), np.zeros((batch, max_length), bool), 0)


def token_positions(cache: KVCache, padding_mask: np.ndarray | None, num_tokens: int) -> np.ndarray:
    """The positions ``(B, t)`` of t new tokens: the tokens before each that are not padding, in the
    cache and among the new ones (a padding token's, 0 at least, is never seen). The GPT's position
    embeddings and the decoders' RoPE read them: a left-padded row decodes as it would alone."""
    start = int(cache.length)  # an int: a uint8 length would wrap
    cached = np.count_nonzero(~cache.padding[:, :start], axis=1)  # (B,) tokens cached, padding left out
    if padding_mask is None:
        return cached[:, None] + np.arange(num_tokens)  # (B, t)
    return np.maximum(cached[:, None] + np.cumsum(~padding_mask, axis=1) - 1, 0)  # (B, t)


def attend_cached(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    cache: KVCache,
    padding_mask: np.ndarray | None,
    *,
    in_place: bool = False,
) -> tuple[np.ndarray, KVCache]:
    """The new tokens' keys and values ``(B, G, t, H)`` written after the cache's, and their queries
    ``(B, N, t, H)`` attended to the cache's filled part (its padding hidden, and the new tokens
    ``padding_mask`` marks): query head n reads key/value head ``n // (N/G)`` (G = N: multi-head
    attention; G < N: grouped-query attention, whose cache holds the G key/value heads alone).
    ``in_place``: written into the cache's own arrays, else into copies (a new value).
    Returns: ``(context_vec (B, t, N*H), new cache)``."""
    start, num_tokens = int(cache.length), queries.shape[-2]  # an int: a uint8 length would wrap
    end = start + num_tokens
    if not in_place:
        cache = KVCache(cache.keys.copy(), cache.values.copy(), cache.padding.copy(), start)  # a new value
    cache.keys[:, :, start:end] = keys
    cache.values[:, :, start:end] = values
    cache.padding[:, start:end] = False if padding_mask is None else padding_mask
    b, num_heads, _, head_size = queries.shape
    num_kv_groups = keys.shape[1]
    grouped = queries.reshape(b, num_kv_groups, num_heads // num_kv_groups, num_tokens, head_size)
    padding = cache.padding[:, None, None, None, :end]  # (B, 1, 1, 1, S)
    mask = causal_mask(num_tokens, end, offset=start) | padding  # (B, 1, 1, t, S)
    context_vec, _ = scaled_dot_product_attention(
        grouped, cache.keys[:, :, None, :end], cache.values[:, :, None, :end], mask
    )  # (B, G, N/G, t, H)
    return merge_heads(context_vec.reshape(queries.shape)), cache._replace(length=end)


def multi_head_attention_decode(
    params: Mapping[str, np.ndarray], x: np.ndarray, cache: KVCache, *, num_heads: int, context_length: int
) -> tuple[np.ndarray, KVCache]:
    """``MultiHeadAttention`` on new tokens given the cache of the earlier ones (evaluation mode).

    Args: params as ``multi_head_attention``'s; x ``(B, t, D)``; the cache's tokens plus t within
    the cache and ``context_length``.
    Returns: ``(output (B, t, E), new_cache)``: the full causal pass's outputs at those positions.
    """
    return attention_decode(params, x, cache, None, num_heads=num_heads)


def attention_decode(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    cache: KVCache,
    padding_mask: np.ndarray | None,
    *,
    num_heads: int,
    in_place: bool = False,
) -> tuple[np.ndarray, KVCache]:
    """``multi_head_attention_decode`` with a ``padding_mask`` (bool ``(B, t)``, True = padding: the
    new tokens hidden from every later query), as the GPT's blocks decode. ``in_place``: the
    cache's arrays written as they are (``generate``'s own caches), not a new cache's copies."""
    b, num_tokens, _ = x.shape
    rows = x.reshape(b * num_tokens, x.shape[-1])  # (B·t, D): one product per weight, a GEMV at t = 1
    queries = linear(rows, params["W_query.weight"], params.get("W_query.bias")).reshape(b, num_tokens, -1)
    keys = linear(rows, params["W_key.weight"], params.get("W_key.bias")).reshape(b, num_tokens, -1)
    values = linear(rows, params["W_value.weight"], params.get("W_value.bias")).reshape(b, num_tokens, -1)
    context_vec, cache = attend_cached(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads),
        cache, padding_mask, in_place=in_place,
    )  # fmt: skip  # (B, t, E)
    output = linear(
        context_vec.reshape(b * num_tokens, -1), params["out_proj.weight"], params.get("out_proj.bias")
    )
    return output.reshape(b, num_tokens, -1), cache  # (B, t, E)


def fused_causal_attention_decode(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    cache: KVCache,
    padding_mask: np.ndarray | None = None,
    *,
    num_heads: int,
    context_size: int,
) -> tuple[np.ndarray, KVCache]:
    """``FusedCausalAttention`` on new tokens given the cache of the earlier ones (evaluation mode).

    Args: params as ``fused_causal_attention``'s; x ``(B, t, D)``; padding_mask bool ``(B, t)``,
    True = padding: the new tokens hidden from every later query.
    Returns: ``(output (B, t, D), new_cache)``.
    """
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, t, 3D)
    queries, keys, values = np.split(qkv, 3, axis=-1)  # 3 x (B, t, D)
    context_vec, cache = attend_cached(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads),
        cache, padding_mask,
    )  # fmt: skip  # (B, t, D)
    return linear(context_vec, params["Wo.weight"], params.get("Wo.bias")), cache
