"""What the decoders' functions of numpy_attn and jax_attn check at their door (``gpt_checks``' kin):
the building blocks' arguments, a cfg, the weights against it, the token ids and the grouped KV
caches; one text for one mistake."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn import checks, finite, memory
from numpy_attn.cache_checks import check_cache_memory, check_decode_room, check_kv_cache
from numpy_attn.decoder_spec import (
    FIRST_WEIGHT,
    check_config,
    check_eps,
    check_rope_base,
    check_rope_freq,
    decoder_param_shapes,
    gqa_shapes,
    head_dim,
    model_of,
    swiglu_shapes,
    without_decoder_buffers,
)
from numpy_attn.gpt_checks import check_model_weights, check_token_ids

A = Mapping[str, Any]


def rms_norm(fw: Any, a: A) -> None:
    """x floating ``(..., D)``, D >= 1; weight ``(D,)`` of x's dtype; eps a number >= 0."""
    fw.check_operands(x=a["x"], weight=a["weight"])
    shape = tuple(a["x"].shape)
    if not shape or shape[-1] < 1:
        raise ValueError(f"x must have shape (..., D) with D >= 1, got shape {shape}")
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
    fw.check_operands(x=x)
    shape = tuple(x.shape)
    if not shape or shape[-1] < 1:
        raise ValueError(f"x must have shape (..., D) with D >= 1, got shape {shape}")
    checks.check_mapping(params)
    fc1 = params.get("fc1.weight")
    hidden = fc1.shape[0] if hasattr(fc1, "shape") and len(fc1.shape) == 2 else 4 * shape[-1]
    checks.check_params(params, swiglu_shapes(shape[-1], hidden), layer="SwiGLUFeedForward", dtype=x.dtype)


def check_rope_call(fw: Any, x: Any, rope_base: Any, rope_freq: Any) -> tuple[int, ...]:
    """x floating ``(..., T, H)``, no empty axis, H even; RoPE's base and scaling. Returns x's shape."""
    fw.check_operands(x=x)
    shape = tuple(x.shape)
    if len(shape) < 2 or 0 in shape:
        raise ValueError(f"x must have shape (..., T, H) with no empty axis, got shape {shape}")
    if shape[-1] % 2:
        raise ValueError(f"x has head size H={shape[-1]} (shape {shape}); RoPE rotates pairs: H must be even")
    check_rope_base(rope_base)
    check_rope_freq(rope_freq)
    return shape


def rope(fw: Any, a: A) -> None:
    """``check_rope_call``; ``offset`` an int >= 0 (or a traced 0-d integer array in jax_attn) with
    the positions within int32."""
    shape = check_rope_call(fw, a["x"], a["rope_base"], a["rope_freq"])
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
    if fw.concrete(a):
        finite.check_finite(params)
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


def check_group_cache(fw: Any, cache: Any, x: Any, num_kv_groups: int, size: int, name: str = "cache",
                      x_name: str = "x") -> None:  # fmt: skip
    """A grouped KV cache: its package's ``KVCache`` with keys and values ``(B, G, L, H)``, G the
    key/value heads (not the query heads), then ``check_kv_cache``'s other rules."""
    keys = getattr(cache, "keys", None)
    shape = tuple(getattr(keys, "shape", ()))
    if isinstance(cache, fw.kv_cache) and (len(shape) != 4 or shape[1] != num_kv_groups):
        raise ValueError(
            f"{name}.keys has shape {shape}, but a grouped cache holds the key/value heads: (B, G, L, H) "
            f"with G = n_kv_groups = {num_kv_groups} (init_decoder_cache(cfg, batch))"
        )
    check_kv_cache(fw, cache, x, num_kv_groups, size, name, x_name)


def check_decoder_params(fw: Any, params: Mapping[str, Any], cfg: Mapping[str, Any], model: str, *,
                         values: bool = True) -> None:  # fmt: skip
    """One ValueError naming every missing, unexpected and mis-shaped weight of ``model(cfg)``; then
    one floating dtype, the first weight's (TypeError); then, with ``values``, finite values."""
    checks.check_mapping(params)
    check_model_weights(fw, params, decoder_param_shapes(cfg, model), model, values=values)


def _model_call(fw: Any, a: dict[str, Any], model: str) -> bool:
    """A model function's cfg, weights (a ``state_dict()`` as it is: RoPE's buffers left out) and
    token ids; returns whether values are known."""
    check_config(a["cfg"], model)
    a["params"] = without_decoder_buffers(a["params"])
    concrete = fw.concrete(a)
    check_decoder_params(fw, a["params"], a["cfg"], model, values=concrete)
    check_token_ids(a["token_ids"], a["cfg"], values=concrete)
    return concrete


def llama3_model(fw: Any, a: dict[str, Any]) -> None:
    _model_call(fw, a, "Llama3Model")
    checks.check_flag("return_steps", a["return_steps"])


def qwen3_model(fw: Any, a: dict[str, Any]) -> None:
    _model_call(fw, a, "Qwen3Model")
    checks.check_flag("return_steps", a["return_steps"])


def init_decoder_cache(fw: Any, a: A) -> None:
    """A Llama 3 or Qwen3 cfg (``decoder_spec.model_of``), a positive batch, a floating dtype, and
    caches that fit in memory."""
    cfg = a["cfg"]
    model = model_of(cfg) if isinstance(cfg, Mapping) else "Llama3Model"
    check_config(cfg, model)
    checks.check_size("batch", a["batch"])
    shape = (a["batch"], cfg["n_kv_groups"], cfg["context_length"], head_dim(cfg, model))
    memory.check_array_size("the cache's keys (batch, n_kv_groups, context_length, head_dim)", shape)
    check_cache_memory(fw, shape, fw.check_dtype(a["dtype"]), blocks=cfg["n_layers"])


def _model_decode(fw: Any, a: dict[str, Any], model: str) -> None:
    _model_call(fw, a, model)
    cfg, caches = a["cfg"], a["caches"]
    if isinstance(caches, fw.kv_cache) or not isinstance(caches, tuple | list):
        raise TypeError(
            "caches must be a tuple of KVCache, one per block (init_decoder_cache(cfg, batch)), "
            f"got {type(caches).__name__}"
        )
    if len(caches) != cfg["n_layers"]:
        raise ValueError(
            f"caches has {len(caches)} KVCache, but cfg['n_layers'] = {cfg['n_layers']} blocks need one each"
        )
    batch, num_tokens = a["token_ids"].shape
    x = np.broadcast_to(np.zeros((), a["params"][FIRST_WEIGHT].dtype), (batch, num_tokens, cfg["emb_dim"]))
    for index, cache in enumerate(caches):
        check_group_cache(
            fw, cache, x, cfg["n_kv_groups"], head_dim(cfg, model), f"caches[{index}]", "the blocks' input"
        )
    lengths = [fw.cache_length(cache) for cache in caches]
    if len({length for length in lengths if length is not None}) > 1:
        raise ValueError(f"the caches hold {lengths} tokens: every block's cache must hold the same tokens")
    for index, (cache, length) in enumerate(zip(caches, lengths, strict=True)):
        check_decode_room(
            length, cache.keys.shape[2], x.shape, cfg["context_length"], name=f"caches[{index}]"
        )
    if a["padding_mask"] is not None:
        checks.check_padding_mask(a["padding_mask"], batch, num_tokens)


def llama3_model_decode(fw: Any, a: dict[str, Any]) -> None:
    _model_decode(fw, a, "Llama3Model")


def qwen3_model_decode(fw: Any, a: dict[str, Any]) -> None:
    _model_decode(fw, a, "Qwen3Model")
