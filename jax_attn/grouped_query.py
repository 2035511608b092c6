"""Grouped-query attention (GQA), the attention of the book's Llama 3 and Qwen3, with its KV cache:
``numpy_attn.grouped_query`` in JAX (its docstring says how; axis letters as there). The cache is
read and written by ``kv_cache.attend_cached``, as the multi-head layers' (shapes never change:
under ``jax.jit`` decoding compiles once per input length).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jax_attn.kv_cache import KVCache, attend_cached, token_positions
from jax_attn.ops import causal_mask, linear, merge_heads, scaled_dot_product_attention, split_heads
from jax_attn.rms_norm import rms_norm
from jax_attn.rope import apply_rope, rope_cos_sin
from numpy_attn.decoder_spec import rope_frequencies
from numpy_attn.steps import Steps

Norm = Callable[[jax.Array], jax.Array] | None


def rotated_heads(
    queries: jax.Array, keys: jax.Array, values: jax.Array, *, num_heads: int, num_kv_groups: int,
    inv_freq: Any, positions: jax.Array | None = None, q_norm: Norm = None, k_norm: Norm = None,
) -> tuple[jax.Array, jax.Array, jax.Array, Steps]:  # fmt: skip
    """The projections ``(B, T, N*H)``, ``(B, S, G*H)``, ``(B, S, G*H)`` split into heads, queries and keys
    normalised (``q_norm``, ``k_norm``) and rotated for ``positions``: integer ``(T,)``, or ``(B, T)`` (each
    row its own: a left-padded batch decoding); None: 0, 1, ..., T - 1. As
    ``numpy_attn.grouped_query.rotated_heads``."""
    steps = Steps(queries=queries, keys=keys, values=values)
    queries = split_heads(queries, num_heads)  # (B, N, T, H)
    keys = split_heads(keys, num_kv_groups)  # (B, G, S, H)
    values = split_heads(values, num_kv_groups)  # (B, G, S, H)
    if q_norm is not None:
        steps["q_norm"] = queries = q_norm(queries)
        steps["k_norm"] = keys = k_norm(keys)
    positions = jnp.arange(queries.shape[-2]) if positions is None else positions  # (T,) or (B, T)
    cos, sin = rope_cos_sin(positions, inv_freq, jnp.promote_types(queries.dtype, jnp.float32))  # 2 x (T, H)
    if cos.ndim == 3:  # per row: (B, T, H) -> (B, 1, T, H), every head
        cos, sin = cos[:, None], sin[:, None]
    steps["queries_rope"] = queries = apply_rope(queries, cos, sin)
    steps["keys_rope"] = keys = apply_rope(keys, cos, sin)
    return queries, keys, values, steps


def attend_groups(
    queries: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array
) -> tuple[jax.Array, Steps]:
    """Query head n attends with key/value head ``n // (N/G)``; mask bool, True = hidden, broadcastable to
    ``(B, 1, 1, T, S)``. As ``numpy_attn.grouped_query.attend_groups``."""
    b, num_heads, num_tokens, head_size = queries.shape
    num_kv_groups = keys.shape[1]
    group_size = num_heads // num_kv_groups
    grouped = queries.reshape(b, num_kv_groups, group_size, num_tokens, head_size)  # (B, G, N/G, T, H)
    context_vec, steps = scaled_dot_product_attention(
        grouped, keys[:, :, None], values[:, :, None], mask
    )  # (B, G, N/G, T, H)
    heads = {name: step.reshape(b, num_heads, num_tokens, -1) for name, step in steps.items()}  # (B, N, T, S)
    return merge_heads(context_vec.reshape(b, num_heads, num_tokens, head_size)), Steps(heads)  # (B, T, N*H)


def _norms(params: Mapping[str, jax.Array], norm_eps: float) -> dict[str, Norm]:
    """QK-norm's ``q_norm`` and ``k_norm`` where the weights hold them (their ``scale``)."""
    if "q_norm.scale" not in params:
        return {"q_norm": None, "k_norm": None}
    return {
        name: functools.partial(rms_norm, weight=params[f"{name}.scale"], eps=norm_eps)
        for name in ("q_norm", "k_norm")
    }


def grouped_query_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    num_kv_groups: int,
    rope_base: float = 10_000.0,
    rope_freq: Mapping[str, Any] | None = None,
    norm_eps: float = 1e-6,
) -> tuple[jax.Array, Steps]:
    """``GroupedQueryAttention``: causal attention of ``num_heads`` query heads sharing ``num_kv_groups``
    key/value heads, RoPE on queries and keys, QK-norm where the weights have it. As
    ``numpy_attn.grouped_query_attention``."""
    queries = linear(x, params["W_query.weight"])  # (B, T, N*H)
    keys = linear(x, params["W_key.weight"])  # (B, S, G*H)
    values = linear(x, params["W_value.weight"])  # (B, S, G*H)
    head_size = params["W_query.weight"].shape[0] // num_heads
    inv_freq = rope_frequencies(head_size, rope_base, rope_freq)  # (H/2,)
    queries, keys, values, steps = rotated_heads(
        queries, keys, values, num_heads=num_heads, num_kv_groups=num_kv_groups, inv_freq=inv_freq,
        **_norms(params, norm_eps),
    )  # fmt: skip
    mask = causal_mask(x.shape[1])  # (T, S), True = hidden
    context_vec, attention_steps = attend_groups(queries, keys, values, mask)  # (B, T, N*H)
    output = linear(context_vec, params["out_proj.weight"])  # (B, T, D)
    return output, Steps(**steps, **attention_steps, context_vec=context_vec, output=output)


def grouped_query_attention_decode(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    cache: KVCache,
    *,
    num_heads: int,
    num_kv_groups: int,
    rope_base: float = 10_000.0,
    rope_freq: Mapping[str, Any] | None = None,
    norm_eps: float = 1e-6,
) -> tuple[jax.Array, KVCache]:
    """``GroupedQueryAttention`` on new tokens x ``(B, t, D)`` after the ``cache``'s, at positions
    ``cache.length`` onwards: the cache holds the G rotated key heads and the value heads, ``(B, G, L, H)``,
    N/G times less than a multi-head cache. As ``numpy_attn.grouped_query_attention_decode``."""
    return grouped_attention_decode(
        params, x, cache, None, num_heads=num_heads, num_kv_groups=num_kv_groups, rope_base=rope_base,
        rope_freq=rope_freq, norm_eps=norm_eps,
    )  # fmt: skip


def grouped_attention_decode(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    cache: KVCache,
    padding_mask: jax.Array | None,
    *,
    num_heads: int,
    num_kv_groups: int,
    rope_base: float = 10_000.0,
    rope_freq: Mapping[str, Any] | None = None,
    norm_eps: float = 1e-6,
    empty: bool = False,
    linear: Callable[..., jax.Array] = linear,
) -> tuple[jax.Array, KVCache]:
    """``grouped_query_attention_decode`` with a ``padding_mask`` (bool ``(B, t)``, True = padding:
    those tokens hidden from every later query, and taking no position: each row's RoPE positions
    count its tokens alone, ``kv_cache.token_positions``), as the decoders' blocks decode.
    ``empty``: the cache is known to hold no token (``kv_cache.attend_cached``); ``linear``: the
    product of each weight (``ops.linear``'s arguments; ``jax_attn.generate``'s accumulates 16-bit
    ones in float32), on x's B·t rows."""
    b, num_tokens, _ = x.shape
    rows = x.reshape(b * num_tokens, x.shape[-1])  # (B·t, D): one product per weight, a GEMV at t = 1
    inv_freq = rope_frequencies(cache.keys.shape[-1], rope_base, rope_freq)  # (H/2,)
    queries = linear(rows, params["W_query.weight"]).reshape(b, num_tokens, -1)  # (B, t, N*H)
    keys = linear(rows, params["W_key.weight"]).reshape(b, num_tokens, -1)  # (B, t, G*H)
    values = linear(rows, params["W_value.weight"]).reshape(b, num_tokens, -1)  # (B, t, G*H)
    queries, keys, values, _ = rotated_heads(
        queries, keys, values, num_heads=num_heads, num_kv_groups=num_kv_groups, inv_freq=inv_freq,
        positions=token_positions(cache, padding_mask, num_tokens), **_norms(params, norm_eps),
    )  # fmt: skip
    context_vec, cache = attend_cached(queries, keys, values, cache, padding_mask, empty=empty)  # (B, t, N*H)
    output = linear(context_vec.reshape(b * num_tokens, -1), params["out_proj.weight"])
    return output.reshape(b, num_tokens, -1), cache  # (B, t, D)
