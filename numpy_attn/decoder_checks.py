"""What the decoders' functions of numpy_attn and jax_attn check at their door (``gpt_checks``' kin):
the building blocks' arguments, a cfg, the weights against it, the token ids and the grouped KV
caches; one text for one mistake."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn import checks
from numpy_attn.cache_checks import check_decode_room, check_group_cache
from numpy_attn.decoder_spec import (
    check_eps,
    check_rope_base,
    check_rope_freq,
    gqa_shapes,
    model_of,
    swiglu_shapes,
)
from numpy_attn.gpt_checks import check_features, init_cache, model_decode, model_pass

A = Mapping[str, Any]


def rms_norm(fw: Any, a: A) -> None:
    """x floating ``(..., D)``, D >= 1; weight ``(D,)`` of x's dtype; eps a number >= 0."""
    shape = check_features(fw, a["x"], weight=a["weight"])
    weight_shape = tuple(a["weight"].shape)
    if weight_shape != shape[-1:]:
        raise ValueError(
            f"weight must have shape (D,) = {shape[-1:]} for x of shape {shape}, got {weight_shape}"
        )
    check_eps(a["eps"])


def swiglu_feed_forward(fw: Any, a: A) -> None:
    """x floating ``(..., D)``; params exactly ``fc1``, ``fc2`` ``(F, D)`` and ``fc3`` ``(D, F)``, F
    read from ``fc1.weight``, of x's dtype."""
    params, x = a["params"], a["x"]
    shape = check_features(fw, x)
    checks.check_mapping(params)
    fc1 = params.get("fc1.weight")
    hidden = fc1.shape[0] if hasattr(fc1, "shape") and len(fc1.shape) == 2 else 4 * shape[-1]
    checks.check_params(params, swiglu_shapes(shape[-1], hidden), layer="SwiGLUFeedForward", dtype=x.dtype)


def rope(fw: Any, a: A) -> None:
    """x floating ``(..., T, H)``, no empty axis, H even; RoPE's base and scaling; ``offset`` an int
    >= 0 (or a traced 0-d integer array in jax_attn) with the positions within int32."""
    fw.check_operands(x=a["x"])
    shape = tuple(a["x"].shape)
    if len(shape) < 2 or 0 in shape:
        raise ValueError(f"x must have shape (..., T, H) with no empty axis, got shape {shape}")
    if shape[-1] % 2:
        raise ValueError(f"x has head size H={shape[-1]} (shape {shape}); RoPE rotates pairs: H must be even")
    check_rope_base(a["rope_base"])
    check_rope_freq(a["rope_freq"])
    offset = a["offset"]
    if not checks.is_int_scalar(offset, fw.array_types):
        raise TypeError(f"offset must be an int >= 0, got {offset!r} ({type(offset).__name__})")
    if isinstance(offset, int | np.integer) and not 0 <= offset <= checks.MAX_POSITION - shape[-2]:
        raise ValueError(
            f"offset must be in [0, 2**31 - 1 - T] (positions are int32 in jax_attn), got {offset}"
        )


def check_gqa(fw: Any, a: A) -> tuple[int, ...]:
    """``grouped_query_attention``'s call: the head counts (``num_kv_groups`` dividing ``num_heads``),
    x floating ``(B, T, D)``, ``W_query.weight``'s rows N*H with H even, the weights exactly a
    ``GroupedQueryAttention``'s (QK-norm where ``q_norm.scale`` is given) in x's dtype, RoPE's
    arguments and ``norm_eps``. Returns x's shape."""
    params, x = a["params"], a["x"]
    num_heads, num_kv_groups = a["num_heads"], a["num_kv_groups"]
    checks.check_size("num_heads", num_heads)
    checks.check_divisible("num_heads", num_heads, num_kv_groups, heads_name="num_kv_groups")
    shape = checks.check_input(x, layout="(B, T, D)", floating=fw.floats)
    checks.check_mapping(params)
    query = params.get("W_query.weight")
    rows = query.shape[0] if hasattr(query, "shape") and len(query.shape) == 2 else num_heads
    if rows % num_heads:
        raise ValueError(
            f"params['W_query.weight'] has {rows} rows, not num_heads={num_heads} heads of one size (N*H)"
        )
    qk_norm = "q_norm.scale" in params
    shapes = gqa_shapes(shape[-1], num_heads, num_kv_groups, rows // num_heads, qk_norm)
    checks.check_params(params, shapes, layer="GroupedQueryAttention", dtype=x.dtype)
    if (rows // num_heads) % 2:
        raise ValueError(f"the heads have size H={rows // num_heads}; RoPE rotates pairs: H must be even")
    check_rope_base(a["rope_base"])
    check_rope_freq(a["rope_freq"])
    check_eps(a["norm_eps"], "norm_eps")
    fw.check_float64("x", x)
    fw.check_finite(params)
    return shape


def grouped_query_attention(fw: Any, a: A) -> None:
    check_gqa(fw, a)
    checks.check_flag("return_steps", a["return_steps"])


def grouped_query_attention_decode(fw: Any, a: A) -> None:
    """``check_gqa``, then the cache: keys and values ``(B, G, L, H)`` for x's batch, of x's dtype,
    with room for x's tokens."""
    shape = check_gqa(fw, a)
    size = a["params"]["W_query.weight"].shape[0] // a["num_heads"]
    check_group_cache(fw, a["cache"], a["x"], a["num_kv_groups"], size)
    max_length = a["cache"].keys.shape[2]
    check_decode_room(fw.cache_length(a["cache"]), max_length, shape, max_length, "the cache's max_length")


def init_decoder_cache(fw: Any, a: A) -> None:
    """``init_cache`` for the decoder a cfg describes (``decoder_spec.model_of``; Llama 3's keys named
    for a cfg that is no mapping)."""
    init_cache(model_of(a["cfg"]) if isinstance(a["cfg"], Mapping) else "Llama3Model", fw, a)


llama3_model = functools.partial(model_pass, "Llama3Model")
qwen3_model = functools.partial(model_pass, "Qwen3Model")
llama3_model_decode = functools.partial(model_decode, "Llama3Model")
qwen3_model_decode = functools.partial(model_decode, "Qwen3Model")
