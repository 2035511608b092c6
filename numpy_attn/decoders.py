"""The book's Llama 3 and Qwen3 in NumPy, on the weights format (torch_ref ``Llama3Model``'s and
``Qwen3Model``'s names).

Axis letters: B batch, T tokens, D model width (``emb_dim``), F ``hidden_dim``, V vocabulary, G
key/value heads. A block is pre-RMSNorm: ``x + att(norm1(x))``, then ``x + ff(norm2(x))``, with
grouped-query attention (``numpy_attn.grouped_query``) and a SwiGLU feed-forward; no position
embeddings (RoPE rotates queries and keys), no dropout. The two models differ in their cfg only
(``numpy_attn.decoder_spec``); the loops over blocks are ``numpy_attn.gpt_spec``'s, which jax_attn
runs too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.decoder_spec import MODELS, attention_arguments, cache_shape, model_of, norm_eps
from numpy_attn.gpt_spec import apply_block, apply_model, decode_model, sub_params
from numpy_attn.grouped_query import grouped_attention_decode, grouped_query_attention
from numpy_attn.kv_cache import KVCache, init_kv_cache
from numpy_attn.ops import linear
from numpy_attn.rms_norm import rms_norm
from numpy_attn.steps import Steps


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU, ``x * sigmoid(x)``, with ``sigmoid`` from ``exp(-|x|)`` (no overflow for any x)."""
    z = np.exp(-np.abs(x))
    return x * np.where(x >= 0, 1 / (1 + z), z / (1 + z))


def swiglu_feed_forward(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The decoders' ``FeedForward``: ``fc3(silu(fc1(x)) * fc2(x))``, D -> F -> D, no biases.

    Args: params ``fc1.weight`` and ``fc2.weight`` ``(F, D)``, ``fc3.weight`` ``(D, F)``; x ``(..., D)``.
    Returns: ``(..., D)``.
    """
    gate = silu(linear(x, params["fc1.weight"]))  # (..., F)
    return linear(gate * linear(x, params["fc2.weight"]), params["fc3.weight"])  # (..., D)


def _parts(params: Mapping[str, np.ndarray], cfg: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A block's ``norm1``, ``norm2`` and ``ff`` for ``apply_block``, and ``drop_shortcut`` (none)."""
    weight, eps = MODELS[model].norms[0], norm_eps(cfg, model)
    return {
        "norm1": functools.partial(rms_norm, weight=params[f"norm1.{weight}"], eps=eps),
        "norm2": functools.partial(rms_norm, weight=params[f"norm2.{weight}"], eps=eps),
        "ff": functools.partial(swiglu_feed_forward, sub_params(params, "ff.")),
        "drop_shortcut": lambda h: h,
    }


def _head(params: Mapping[str, np.ndarray], cfg: Mapping[str, Any], model: str) -> dict[str, Any]:
    """``apply_model``'s final RMSNorm and output head."""
    weight = params[f"final_norm.{MODELS[model].norms[0]}"]
    return {
        "final_norm": functools.partial(rms_norm, weight=weight, eps=norm_eps(cfg, model)),
        "out_head": lambda x: linear(x, params["out_head.weight"]),  # (B, T, V)
    }


def _model(
    model: str, params: Mapping[str, np.ndarray], token_ids: np.ndarray, cfg: Mapping[str, Any]
) -> tuple[np.ndarray, Steps]:
    """``model``'s full causal pass: the token embeddings, ``n_layers`` blocks, the head."""
    x = params["tok_emb.weight"][token_ids]  # (B, T, D)
    arguments = attention_arguments(cfg, model)
    blocks = []
    for i in range(cfg["n_layers"]):
        block = sub_params(params, f"trf_blocks.{i}.")
        att = functools.partial(grouped_query_attention, sub_params(block, "att."), **arguments)
        parts = _parts(block, cfg, model)
        blocks.append(functools.partial(apply_block, **parts, att=lambda h, att=att: att(h)[0]))
    return apply_model(x, blocks=blocks, **_head(params, cfg, model))  # (B, T, V)


def llama3_model(
    params: Mapping[str, np.ndarray], token_ids: np.ndarray, cfg: Mapping[str, Any]
) -> tuple[np.ndarray, Steps]:
    """The book's ``Llama3Model``: token embeddings, ``n_layers`` blocks (GQA with RoPE scaled by
    ``rope_freq``), a final RMSNorm and the output head.

    Args: params the model's weights (RMSNorms' ``weight``); token_ids integer ``(B, T)``, T <=
    context_length; cfg the book's.
    Returns: ``(logits (B, T, V), steps)``: ``embeddings``, each block's steps as
    ``trf_blocks.{i}.<step>``, ``final_norm``, ``output``.
    """
    return _model("Llama3Model", params, token_ids, cfg)


def qwen3_model(
    params: Mapping[str, np.ndarray], token_ids: np.ndarray, cfg: Mapping[str, Any]
) -> tuple[np.ndarray, Steps]:
    """The book's ``Qwen3Model`` (dense): as ``llama3_model``, with ``head_dim``, QK-norm where
    ``qk_norm`` and RMSNorms' ``scale``.

    Returns: ``(logits (B, T, V), steps)``, the steps ``llama3_model``'s.
    """
    return _model("Qwen3Model", params, token_ids, cfg)


def init_decoder_cache(cfg: Mapping[str, Any], batch: int, dtype: Any = np.float32) -> tuple[KVCache, ...]:
    """Empty grouped KV caches, one per block, each ``(B, G, context_length, H)``: the key/value heads
    alone (``n_kv_groups``, not ``n_heads``), for a Llama 3 or Qwen3 ``cfg``."""
    shape = cache_shape(cfg, model_of(cfg), batch)  # (B, G, L, H)
    return tuple(init_kv_cache(*shape, dtype) for _ in range(cfg["n_layers"]))


def decode(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    caches: tuple[KVCache, ...],
    cfg: Mapping[str, Any],
    padding_mask: np.ndarray | None = None,
    *,
    last_only: bool = False,
    in_place: bool = False,
) -> tuple[np.ndarray, tuple[KVCache, ...]]:
    """The cfg's decoder (``decoder_spec.model_of``) on new ``token_ids`` ``(B, t)`` after the caches'
    tokens: ``llama3_model_decode``, ``qwen3_model_decode``; ``last_only``: the logits of the last
    token alone ``(B, 1, V)``; ``in_place``: the caches written as they are (``generate``'s)."""
    model = model_of(cfg)
    x = params["tok_emb.weight"][token_ids]  # (B, t, D)
    arguments = attention_arguments(cfg, model)
    att = functools.partial(
        grouped_attention_decode, padding_mask=padding_mask, **arguments, in_place=in_place
    )
    parts = functools.partial(_parts, cfg=cfg, model=model)
    head = _head(params, cfg, model)
    return decode_model(params, x, caches, att=att, parts=parts, head=head, last_only=last_only)


def llama3_model_decode(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    caches: tuple[KVCache, ...],
    cfg: Mapping[str, Any],
    padding_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, tuple[KVCache, ...]]:
    """``llama3_model`` on new ``token_ids`` ``(B, t)`` after the ``caches``' tokens
    (``init_decoder_cache``), at positions ``caches[0].length`` onwards.

    Args: padding_mask bool ``(B, t)``, True = padding: those tokens are hidden from every query and
    take no position (a token's RoPE position counts the tokens before it that are not padding:
    prompts of different lengths, left-padded, decode as each would alone).
    Returns: ``(logits (B, t, V), caches)``: the full pass's logits at those positions.
    """
    return decode(params, token_ids, caches, cfg, padding_mask)


def qwen3_model_decode(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    caches: tuple[KVCache, ...],
    cfg: Mapping[str, Any],
    padding_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, tuple[KVCache, ...]]:
    """``qwen3_model`` on new ``token_ids`` ``(B, t)`` after the ``caches``' tokens, ``padding_mask``
    as ``llama3_model_decode``'s.

    Returns: ``(logits (B, t, V), caches)``: the full pass's logits at those positions.
    """
    return decode(params, token_ids, caches, cfg, padding_mask)
