"""The book's Llama 3 and Qwen3 in JAX: ``numpy_attn.decoders`` (its docstring; axis letters as
there), with ``jax_attn.grouped_query``'s attention.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jax_attn.grouped_query import grouped_attention_decode, grouped_query_attention
from jax_attn.kv_cache import KVCache, init_kv_cache
from jax_attn.ops import linear
from jax_attn.rms_norm import rms_norm
from numpy_attn.decoder_spec import apply_decoder, attention_arguments, cache_shape, model_of, norm_math
from numpy_attn.gpt_spec import decode_model
from numpy_attn.steps import Steps


def silu(x: jax.Array) -> jax.Array:
    """SiLU, ``x * sigmoid(x)``, with ``sigmoid`` from ``exp(-|x|)`` (no overflow for any x)."""
    z = jnp.exp(-jnp.abs(x))
    return x * jnp.where(x >= 0, 1 / (1 + z), z / (1 + z))


def swiglu_feed_forward(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """The decoders' ``FeedForward``: ``fc3(silu(fc1(x)) * fc2(x))``, D -> F -> D, no biases. As
    ``numpy_attn.swiglu_feed_forward``."""
    return _swiglu(params, x, linear)


def _swiglu(params: Mapping[str, Any], x: jax.Array, linear: Callable[..., jax.Array]) -> jax.Array:
    """``swiglu_feed_forward`` with ``linear`` the product of each weight (``decode``'s)."""
    gate = silu(linear(x, params["fc1.weight"]))  # (..., F)
    return linear(gate * linear(x, params["fc2.weight"]), params["fc3.weight"])  # (..., D)


def _model(
    model: str, params: Mapping[str, jax.Array], token_ids: jax.Array, cfg: Mapping[str, Any]
) -> tuple[jax.Array, Steps]:
    """``model``'s full causal pass: the token embeddings, then ``decoder_spec.apply_decoder``."""
    x = jnp.asarray(params["tok_emb.weight"])[token_ids]  # (B, T, D); jnp: traced ids index it
    return apply_decoder(
        model, params, x, cfg, attention=grouped_query_attention, rms_norm=rms_norm,
        feed_forward=swiglu_feed_forward, linear=linear,
    )  # fmt: skip


def llama3_model(
    params: Mapping[str, jax.Array], token_ids: jax.Array, cfg: Mapping[str, Any]
) -> tuple[jax.Array, Steps]:
    """The book's ``Llama3Model``: token embeddings, ``n_layers`` blocks (GQA with RoPE scaled by
    ``rope_freq``), a final RMSNorm and the output head. As ``numpy_attn.llama3_model``."""
    return _model("Llama3Model", params, token_ids, cfg)


def qwen3_model(
    params: Mapping[str, jax.Array], token_ids: jax.Array, cfg: Mapping[str, Any]
) -> tuple[jax.Array, Steps]:
    """The book's ``Qwen3Model`` (dense): as ``llama3_model``, with ``head_dim``, QK-norm where ``qk_norm``
    and RMSNorms' ``scale``. As ``numpy_attn.qwen3_model``."""
    return _model("Qwen3Model", params, token_ids, cfg)


def init_decoder_cache(cfg: Mapping[str, Any], batch: int, dtype: Any = jnp.float32) -> tuple[KVCache, ...]:
    """Empty grouped KV caches, one per block, each ``(B, G, context_length, H)``: the key/value heads
    alone (``n_kv_groups``, not ``n_heads``), for a Llama 3 or Qwen3 ``cfg``."""
    shape = cache_shape(cfg, model_of(cfg), batch)  # (B, G, L, H)
    return tuple(init_kv_cache(*shape, dtype) for _ in range(cfg["n_layers"]))


def decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    cfg: Mapping[str, Any],
    padding_mask: jax.Array | None = None,
    *,
    last_only: bool = False,
    empty: bool = False,
    linear: Callable[..., jax.Array] = linear,
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """The cfg's decoder (``decoder_spec.model_of``) on new ``token_ids`` ``(B, t)`` after the caches'
    tokens: ``llama3_model_decode``, ``qwen3_model_decode``; ``last_only``: the logits of the last
    token alone ``(B, 1, V)``; ``empty``: the caches are known to hold no token (a prompt's pass);
    ``linear``: the product of each weight, on the B·t rows (``jax_attn.generate``'s accumulates
    16-bit ones in float32)."""
    model = model_of(cfg)
    x = jnp.asarray(params["tok_emb.weight"])[token_ids]  # (B, t, D)
    arguments = attention_arguments(cfg, model) | {"empty": empty, "linear": linear}
    att = functools.partial(grouped_attention_decode, padding_mask=padding_mask, **arguments)
    norm = norm_math(cfg, model, rms_norm)
    feed_forward = functools.partial(_swiglu, linear=linear)
    return decode_model(
        params, x, caches, att=att, norm=norm, feed_forward=feed_forward, linear=linear, last_only=last_only
    )


def llama3_model_decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    cfg: Mapping[str, Any],
    padding_mask: jax.Array | None = None,
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """``llama3_model`` on new ``token_ids`` ``(B, t)`` after the ``caches``' tokens (``init_decoder_cache``),
    at positions ``caches[0].length`` onwards. As ``numpy_attn.llama3_model_decode``."""
    return decode(params, token_ids, caches, cfg, padding_mask)


def qwen3_model_decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    cfg: Mapping[str, Any],
    padding_mask: jax.Array | None = None,
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """``qwen3_model`` on new ``token_ids`` ``(B, t)`` after the ``caches``' tokens, ``padding_mask`` as
    ``llama3_model_decode``'s. As ``numpy_attn.qwen3_model_decode``."""
    return decode(params, token_ids, caches, cfg, padding_mask)
