"""The book's chapter-4 GPT in JAX: ``numpy_attn.gpt`` (its docstring; axis letters as there), with
dropout drawn from a ``key``, split for each draw, in place of an ``rng``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jax_attn.kv_cache import KVCache, attention_decode, init_kv_cache, token_positions
from jax_attn.multi_head import multi_head_attention
from jax_attn.ops import dropout, linear
from numpy_attn.decoder_spec import cache_shape
from numpy_attn.gpt_spec import (
    LAYER_NORM_EPS,
    apply_block,
    apply_layers,
    block_parts,
    decode_model,
    sub_params,
)
from numpy_attn.steps import Steps


def layer_norm(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """``LayerNorm``: x normalised over its last axis (biased variance, eps 1e-5), then scaled and shifted. As
    ``numpy_attn.layer_norm``."""
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    var = x.var(axis=-1, keepdims=True)  # (..., 1), biased
    norm_x = (x - mean) / jnp.sqrt(var + LAYER_NORM_EPS)
    return params["scale"] * norm_x + params["shift"]


def gelu(x: jax.Array) -> jax.Array:
    """GELU, tanh approximation (the book's ``GELU``, GPT-2's ``gelu_new``), in x's dtype; sqrt(2 / pi)
    computed in float32 as the book's ``torch.sqrt(torch.tensor(2.0 / torch.pi))``, in float64 for float64."""
    scale = jnp.sqrt(jnp.asarray(2.0 / jnp.pi, jnp.promote_types(x.dtype, jnp.float32))).astype(x.dtype)
    return 0.5 * x * (1 + jnp.tanh(scale * (x + 0.044715 * x**3)))


def feed_forward(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """``FeedForward``: ``layers.0`` (D -> 4D), GELU, ``layers.2`` (4D -> D). Returns ``(..., D)``."""
    return _feed_forward(params, x, linear)


def _feed_forward(params: Mapping[str, Any], x: jax.Array, linear: Callable[..., jax.Array]) -> jax.Array:
    """``feed_forward`` with ``linear`` the product of each weight (``decode``'s)."""
    hidden = linear(x, params["layers.0.weight"], params["layers.0.bias"])  # (..., 4D)
    return linear(gelu(hidden), params["layers.2.weight"], params["layers.2.bias"])  # (..., D)


def transformer_block(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    context_length: int,
    dropout_rate: float = 0.0,
    key: jax.Array | None = None,
) -> tuple[jax.Array, Steps]:
    """``TransformerBlock``: ``x + drop(att(norm1(x)))``, then ``+ drop(ff(norm2(.)))``. As
    ``numpy_attn.transformer_block``; ``key`` (a ``jax.random`` key) in place of ``rng``."""
    att_key, drop_key = (None, None) if key is None else jax.random.split(key)
    drop_keys = iter([None] * 2 if drop_key is None else jax.random.split(drop_key, 2))  # the 2 residuals
    return apply_block(
        x, **block_parts(params, norm=layer_norm, feed_forward=feed_forward),
        att=lambda h: multi_head_attention(
            sub_params(params, "att."), h, num_heads=num_heads, context_length=context_length,
            dropout=dropout_rate, key=att_key,
        )[0],
        drop_shortcut=lambda h: dropout(h, dropout_rate, key=next(drop_keys)),
    )  # fmt: skip


def gpt_model(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    config: Mapping[str, Any],
    *,
    key: jax.Array | None = None,
) -> tuple[jax.Array, Steps]:
    """``GPTModel``: token embeddings plus position embeddings, ``n_layers`` blocks, a final LayerNorm and the
    output head. As ``numpy_attn.gpt_model``; ``key`` (a ``jax.random`` key) in place of ``rng``."""
    num_tokens = token_ids.shape[1]
    keys = [None] * (config["n_layers"] + 1) if key is None else jax.random.split(key, config["n_layers"] + 1)
    tok_embeds = jnp.asarray(params["tok_emb.weight"])[token_ids]  # (B, T, D); jnp: traced ids index it
    pos_embeds = params["pos_emb.weight"][:num_tokens]  # (T, D)
    x = dropout(tok_embeds + pos_embeds, config["drop_rate"], key=keys[0])  # (B, T, D)

    def block(i: int, weights: Mapping[str, Any]) -> Any:  # block i, its dropout key keys[i + 1]
        return functools.partial(
            transformer_block, weights, num_heads=config["n_heads"], context_length=config["context_length"],
            dropout_rate=config["drop_rate"], key=keys[i + 1],
        )  # fmt: skip

    return apply_layers(params, x, config["n_layers"], block=block, norm=layer_norm, linear=linear)


def init_gpt_cache(config: Mapping[str, Any], batch: int, dtype: Any = jnp.float32) -> tuple[KVCache, ...]:
    """Empty KV caches, one per block, each ``(B, N, context_length, H)``."""
    shape = cache_shape(config, "GPTModel", batch)  # (B, N, L, H)
    return tuple(init_kv_cache(*shape, dtype) for _ in range(config["n_layers"]))


def gpt_model_decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
    padding_mask: jax.Array | None = None,
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """The GPT on new ``token_ids`` ``(B, t)`` after the ``caches``' tokens (evaluation mode). As
    ``numpy_attn.gpt_model_decode``."""
    return decode(params, token_ids, caches, config, padding_mask)


def decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
    padding_mask: jax.Array | None = None,
    *,
    last_only: bool = False,
    empty: bool = False,
    linear: Callable[..., jax.Array] = linear,
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """``gpt_model_decode``; ``last_only``: the logits of the last token alone ``(B, 1, V)`` (the
    output head's product for one position); ``empty``: the caches are known to hold no token (a
    prompt's pass: their keys are not read); ``linear``: the product of each weight
    (``ops.linear``'s arguments; ``jax_attn.generate``'s accumulates 16-bit ones in float32)."""
    positions = token_positions(caches[0], padding_mask, token_ids.shape[1])  # (B, t)
    tok_embeds = jnp.asarray(params["tok_emb.weight"])[token_ids]  # (B, t, D)
    x = tok_embeds + jnp.asarray(params["pos_emb.weight"])[positions]  # (B, t, D)
    att = functools.partial(
        attention_decode, padding_mask=padding_mask, num_heads=config["n_heads"], empty=empty, linear=linear
    )

    feed_forward_linear = functools.partial(_feed_forward, linear=linear)
    return decode_model(
        params, x, caches, att=att, norm=layer_norm, feed_forward=feed_forward_linear, linear=linear,
        last_only=last_only,
    )  # fmt: skip
