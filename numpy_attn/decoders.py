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

from numpy_attn.decoder_spec import apply_decoder, attention_arguments, cache_shape, model_of, norm_math
from numpy_attn.gpt_spec import decode_model
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


def _model(
    model: str, params: Mapping[str, np.ndarray], token_ids: np.ndarray, cfg: Mapping[str, Any]
) -> tuple[np.ndarray, Steps]:
    """``model``'s full causal pass: the token embeddings, then ``decoder_spec.apply_decoder``."""
    x = params["tok_emb.weight"][token_ids]  # (B, T, D)
    return apply_decoder(
        model, params, x, cfg, attention=grouped_query_attention, rms_norm=rms_norm,
        feed_forward=swiglu_feed_forward, linear=linear,
    )  # fmt: skip


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
    norm = norm_math(cfg, model, rms_norm)
    return decode_model(
        params, x, caches, att=att, norm=norm, feed_forward=swiglu_feed_forward, linear=linear,
        last_only=last_only,
    )  # fmt: skip


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
