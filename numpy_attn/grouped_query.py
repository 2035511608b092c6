"""Grouped-query attention (GQA), the attention of the book's Llama 3 and Qwen3, with its KV cache.

N query heads share G = ``num_kv_groups`` key/value heads: query head n reads key/value head
``n // (N / G)`` (the book's ``repeat_interleave``). Here the keys and values are never repeated:
the query heads are grouped ``(B, G, N/G, T, H)`` and broadcast against ``(B, G, 1, S, H)``, so that
a KV cache holds the G key/value heads alone. Queries and keys are rotated by RoPE after the
optional RMSNorm of each head (QK-norm, Qwen3: ``q_norm``, ``k_norm``). Axis letters: B batch, T
query tokens, S key tokens, N query heads, G key/value heads, H head size, D model width.
``jax_attn/grouped_query.py`` is the same file in JAX.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from numpy_attn.decoder_spec import rope_frequencies
from numpy_attn.kv_cache import KVCache, attend_cached, token_positions
from numpy_attn.ops import causal_mask, linear, merge_heads, scaled_dot_product_attention, split_heads
from numpy_attn.rms_norm import rms_norm
from numpy_attn.rope import apply_rope, rope_cos_sin
from numpy_attn.steps import Steps

Norm = Callable[[np.ndarray], np.ndarray] | None


def rotated_heads(
    queries: np.ndarray, keys: np.ndarray, values: np.ndarray, *, num_heads: int, num_kv_groups: int,
    inv_freq: np.ndarray, positions: np.ndarray | None = None, q_norm: Norm = None, k_norm: Norm = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Steps]:  # fmt: skip
    """The projections ``(B, T, N*H)``, ``(B, S, G*H)``, ``(B, S, G*H)`` split into heads, queries and
    keys normalised (``q_norm``, ``k_norm``) and rotated for ``positions``: integer ``(T,)``, or
    ``(B, T)`` (each row its own: a left-padded batch decoding); None: 0, 1, ..., T - 1.

    Returns: ``(queries (B, N, T, H), keys (B, G, S, H), values (B, G, S, H), steps)``.
    """
    steps = Steps(queries=queries, keys=keys, values=values)
    queries = split_heads(queries, num_heads)  # (B, N, T, H)
    keys = split_heads(keys, num_kv_groups)  # (B, G, S, H)
    values = split_heads(values, num_kv_groups)  # (B, G, S, H)
    if q_norm is not None:
        steps["q_norm"] = queries = q_norm(queries)
        steps["k_norm"] = keys = k_norm(keys)
    positions = np.arange(queries.shape[-2]) if positions is None else positions  # (T,) or (B, T)
    cos, sin = rope_cos_sin(positions, inv_freq, np.promote_types(queries.dtype, np.float32))  # 2 x (T, H)
    if cos.ndim == 3:  # per row: (B, T, H) -> (B, 1, T, H), every head
        cos, sin = cos[:, None], sin[:, None]
    steps["queries_rope"] = queries = apply_rope(queries, cos, sin)
    steps["keys_rope"] = keys = apply_rope(keys, cos, sin)
    return queries, keys, values, steps


def attend_groups(
    queries: np.ndarray, keys: np.ndarray, values: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, Steps]:
    """Query head n attends with key/value head ``n // (N/G)``; mask bool, True = hidden,
    broadcastable to ``(B, 1, 1, T, S)``.

    Args: queries ``(B, N, T, H)``; keys and values ``(B, G, S, H)``.
    Returns: ``(context_vec (B, T, N*H), steps)``: ``attn_scores``, ``masked_scores``,
    ``attn_weights``, each ``(B, N, T, S)``.
    """
    b, num_heads, num_tokens, head_size = queries.shape
    num_kv_groups = keys.shape[1]
    group_size = num_heads // num_kv_groups
    grouped = queries.reshape(b, num_kv_groups, group_size, num_tokens, head_size)  # (B, G, N/G, T, H)
    context_vec, steps = scaled_dot_product_attention(
        grouped, keys[:, :, None], values[:, :, None], mask
    )  # (B, G, N/G, T, H)
    heads = {name: step.reshape(b, num_heads, num_tokens, -1) for name, step in steps.items()}  # (B, N, T, S)
    return merge_heads(context_vec.reshape(b, num_heads, num_tokens, head_size)), Steps(heads)  # (B, T, N*H)


def _norms(params: Mapping[str, np.ndarray], norm_eps: float) -> dict[str, Norm]:
    """QK-norm's ``q_norm`` and ``k_norm`` where the weights hold them (their ``scale``)."""
    if "q_norm.scale" not in params:
        return {"q_norm": None, "k_norm": None}
    return {
        name: functools.partial(rms_norm, weight=params[f"{name}.scale"], eps=norm_eps)
        for name in ("q_norm", "k_norm")
    }


def grouped_query_attention(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    num_heads: int,
    num_kv_groups: int,
    rope_base: float = 10_000.0,
    rope_freq: Mapping[str, Any] | None = None,
    norm_eps: float = 1e-6,
) -> tuple[np.ndarray, Steps]:
    """``GroupedQueryAttention``: causal attention of ``num_heads`` query heads sharing ``num_kv_groups``
    key/value heads, RoPE on queries and keys, QK-norm where the weights have it.

    Args:
        params: ``W_query.weight`` ``(N*H, D)``, ``W_key.weight`` and ``W_value.weight`` ``(G*H, D)``,
            ``out_proj.weight`` ``(D, N*H)`` (no biases); ``q_norm.scale`` and ``k_norm.scale``
            ``(H,)`` for QK-norm (eps ``norm_eps``).
        x: ``(B, T, D)``.
        rope_base, rope_freq: RoPE's (``numpy_attn.rope``).
    Returns: ``(output (B, T, D), steps)``, the steps ``decoder_spec.GQA_STEPS``.
    """
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
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    cache: KVCache,
    *,
    num_heads: int,
    num_kv_groups: int,
    rope_base: float = 10_000.0,
    rope_freq: Mapping[str, Any] | None = None,
    norm_eps: float = 1e-6,
) -> tuple[np.ndarray, KVCache]:
    """``GroupedQueryAttention`` on new tokens x ``(B, t, D)`` after the ``cache``'s, at positions
    ``cache.length`` onwards: the cache holds the G rotated key heads and the value heads, ``(B, G, L,
    H)``, N/G times less than a multi-head cache.

    Returns: ``(output (B, t, D), new cache)``: the full causal pass's outputs at those positions.
    """
    return grouped_attention_decode(
        params, x, cache, None, num_heads=num_heads, num_kv_groups=num_kv_groups, rope_base=rope_base,
        rope_freq=rope_freq, norm_eps=norm_eps,
    )  # fmt: skip


def grouped_attention_decode(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    cache: KVCache,
    padding_mask: np.ndarray | None,
    *,
    num_heads: int,
    num_kv_groups: int,
    rope_base: float = 10_000.0,
    rope_freq: Mapping[str, Any] | None = None,
    norm_eps: float = 1e-6,
    in_place: bool = False,
) -> tuple[np.ndarray, KVCache]:
    """``grouped_query_attention_decode`` with a ``padding_mask`` (bool ``(B, t)``, True = padding:
    those tokens hidden from every later query, and taking no position: each row's RoPE positions
    count its tokens alone, ``kv_cache.token_positions``), as the decoders' blocks decode.
    ``in_place``: the cache's arrays written as they are (``generate``'s own caches)."""
    inv_freq = rope_frequencies(cache.keys.shape[-1], rope_base, rope_freq)  # (H/2,)
    queries = linear(x, params["W_query.weight"])  # (B, t, N*H)
    keys = linear(x, params["W_key.weight"])  # (B, t, G*H)
    values = linear(x, params["W_value.weight"])  # (B, t, G*H)
    queries, keys, values, _ = rotated_heads(
        queries, keys, values, num_heads=num_heads, num_kv_groups=num_kv_groups, inv_freq=inv_freq,
        positions=token_positions(cache, padding_mask, x.shape[1]), **_norms(params, norm_eps),
    )  # fmt: skip
    context_vec, cache = attend_cached(queries, keys, values, cache, padding_mask, in_place=in_place)
    return linear(context_vec, params["out_proj.weight"]), cache  # (B, t, D)
