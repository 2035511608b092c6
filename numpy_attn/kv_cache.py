"""Decoding with a key/value cache: prefill once, then one token at a time, for the causal classes.

A ``KVCache`` holds the keys and values of every token seen so far, per head, in fixed-size
``(B, N, L, H)`` arrays (``L`` = the layer's context length), which padding keys it must hide,
and how many tokens it holds. Each call projects only the new tokens and attends the new queries
to everything cached: outputs equal the full causal pass, at O(L) work per token instead of
O(L^2). Caches are values, as in jax_attn: a call returns a new cache holding the new tokens and
never changes the one it was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from numpy_attn.attention import unchecked_scaled_dot_product_attention
from numpy_attn.heads import unchecked_merge_heads, unchecked_split_heads
from numpy_attn.linear import unchecked_linear, unchecked_qkv_projections
from numpy_attn.masks import unchecked_causal_mask
from numpy_attn.spec import check_layer
from numpy_attn.validation import (
    NUMPY_FLOATS,
    check_decode_room,
    check_dtype_argument,
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
    keys: np.ndarray  # (B, N, L, H)
    values: np.ndarray  # (B, N, L, H)
    padding: np.ndarray  # (B, L) bool, True = a padding token (hidden from every query)
    length: int  # tokens cached so far


def init_kv_cache(batch: int, num_heads: int, max_length: int, head_dim: int, dtype=np.float32) -> KVCache:
    """An empty cache for ``max_length`` tokens (the layer's ``context_length``/``context_size``),
    in the dtype of the x and weights it will be used with (the decode functions check it)."""
    check_kv_cache_sizes(batch, num_heads, max_length, head_dim)
    check_dtype_argument(dtype, NUMPY_FLOATS)
    shape = (batch, num_heads, max_length, head_dim)
    return KVCache(np.zeros(shape, dtype), np.zeros(shape, dtype), np.zeros((batch, max_length), bool), 0)


def cache_length(cache: KVCache) -> int:
    """The tokens a (checked) cache holds, as an int."""
    return int(cache.length)


def _check_cache(
    cache: KVCache, x: np.ndarray, num_heads: int, head_dim: int, context_length: int, context_name: str
) -> None:
    """A decode function's ``cache`` for new tokens ``x``: ``check_kv_cache``, then, where the
    length is concrete (under jax.jit the caller keeps within the cache and the context), room
    for x's tokens in the cache and within the layer's ``context_length`` (``context_name``)."""
    check_kv_cache(cache, KVCache, np.ndarray, x, num_heads, head_dim)
    check_decode_room(cache_length(cache), cache.keys.shape[-2], x.shape, context_length, context_name)


def _decode(
    queries: np.ndarray, keys: np.ndarray, values: np.ndarray, cache: KVCache, padding_mask: np.ndarray | None
) -> tuple[np.ndarray, KVCache]:
    """A new cache with the new keys/values (B, N, t, H) appended, and the new queries attended
    to it; the given cache is left as it was."""
    # an int, as init_kv_cache's: a narrow integer length (uint8) would wrap
    start, num_tokens = cache_length(cache), queries.shape[-2]
    end = start + num_tokens
    cache = KVCache(cache.keys.copy(), cache.values.copy(), cache.padding.copy(), end)  # (B, N, L, H)
    cache.keys[:, :, start:end] = keys
    cache.values[:, :, start:end] = values
    cache.padding[:, start:end] = False if padding_mask is None else padding_mask
    mask = (
        unchecked_causal_mask(num_tokens, end, offset=start) | cache.padding[:, None, None, :end]
    )  # (B, 1, t, S)
    context_vec = unchecked_scaled_dot_product_attention(
        queries, cache.keys[:, :, :end], cache.values[:, :, :end], mask
    )  # (B, N, t, H)
    return unchecked_merge_heads(context_vec), cache


def multi_head_attention_decode(
    params: Mapping[str, np.ndarray], x: np.ndarray, cache: KVCache, *, num_heads: int, context_length: int
) -> tuple[np.ndarray, KVCache]:
    """``MultiHeadAttention`` on new tokens ``x`` (B, t, D) given the cache of the earlier ones.

    Returns ``(output (B, t, E), new_cache)`` (the given cache is unchanged): the outputs the
    full causal pass gives at those positions (evaluation mode: no dropout). Prefill with the
    prompt, then call with one token. ``context_length`` is the layer's: the tokens the cache
    holds plus x's may exceed neither it (the full causal pass refuses that many) nor the cache's
    size, ValueError otherwise.
    """
    check_layer("MultiHeadAttention", params, x, num_heads=num_heads, context_length=context_length)
    _check_cache(
        cache, x, num_heads, params["out_proj.weight"].shape[1] // num_heads, context_length, "context_length"
    )
    return unchecked_multi_head_attention_decode(params, x, cache, num_heads=num_heads)


def unchecked_multi_head_attention_decode(
    params: Mapping[str, np.ndarray], x: np.ndarray, cache: KVCache, *, num_heads: int
) -> tuple[np.ndarray, KVCache]:
    """``multi_head_attention_decode`` without its checks, for a caller that has made them (the
    GPT's decode, once per call rather than once per block and token)."""
    x = np.asarray(x)  # arrays from any framework compute here
    queries, keys, values = unchecked_qkv_projections(x, params, fused=True)  # 3 x (B, t, E)
    context_vec, cache = _decode(
        unchecked_split_heads(queries, num_heads),
        unchecked_split_heads(keys, num_heads),
        unchecked_split_heads(values, num_heads),
        cache, None,
    )  # fmt: skip  # (B, t, E)
    return unchecked_linear(context_vec, params["out_proj.weight"], params.get("out_proj.bias")), cache


def fused_causal_attention_decode(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    cache: KVCache,
    padding_mask: np.ndarray | None = None,
    *,
    num_heads: int,
    context_size: int,
) -> tuple[np.ndarray, KVCache]:
    """``FusedCausalAttention`` on new tokens ``x`` (B, t, D) given the cache of the earlier ones;
    ``padding_mask`` (bool ``(B, t)``, True = padding) marks new padding tokens, which stay
    hidden from every later query. Returns ``(output (B, t, D), new_cache)``, evaluation mode;
    the given cache is unchanged. ``context_size`` is the layer's: the tokens the cache holds
    plus x's may exceed neither it (the full causal pass refuses that many) nor the cache's size,
    ValueError otherwise."""
    check_layer("FusedCausalAttention", params, x, num_heads=num_heads, context_length=context_size,
                context_name="context_size")  # fmt: skip
    if padding_mask is not None:
        check_padding_mask(padding_mask, x.shape[0], x.shape[1])
    _check_cache(cache, x, num_heads, params["Wo.weight"].shape[1] // num_heads, context_size, "context_size")
    x = np.asarray(x)  # arrays from any framework compute here
    qkv = unchecked_linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, t, 3 * D)
    queries, keys, values = np.split(qkv, 3, axis=-1)  # 3 x (B, t, D)
    context_vec, cache = _decode(
        unchecked_split_heads(queries, num_heads),
        unchecked_split_heads(keys, num_heads),
        unchecked_split_heads(values, num_heads),
        cache, padding_mask,
    )  # fmt: skip  # (B, t, D)
    return unchecked_linear(context_vec, params["Wo.weight"], params.get("Wo.bias")), cache
