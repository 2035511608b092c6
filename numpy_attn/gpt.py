"""The book's chapter-4 GPT in NumPy, on the weights format (torch_ref ``GPTModel``'s names).

Axis letters: B batch, T tokens, D model width (``emb_dim``), V vocabulary. A block is pre-LayerNorm:
``x + att(norm1(x))``, then ``x + ff(norm2(x))``; dropout after the embeddings, on the attention
weights and on both residual branches (``drop_rate``) when an ``rng`` is passed. The loops over
blocks are ``numpy_attn.gpt_spec``'s, which jax_attn runs too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.decoder_spec import cache_shape
from numpy_attn.gpt_spec import (
    LAYER_NORM_EPS,
    apply_block,
    apply_layers,
    block_parts,
    decode_model,
    sub_params,
)
from numpy_attn.kv_cache import KVCache, attention_decode, init_kv_cache, token_positions
from numpy_attn.multi_head import multi_head_attention
from numpy_attn.ops import dropout, linear
from numpy_attn.steps import Steps


def layer_norm(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """``LayerNorm``: x normalised over its last axis (biased variance, eps 1e-5), then scaled and shifted.

    Args: params ``scale`` and ``shift``, each ``(D,)``; x ``(..., D)``.
    Returns: ``(..., D)``.
    """
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    var = x.var(axis=-1, keepdims=True)  # (..., 1), biased
    norm_x = (x - mean) / np.sqrt(var + LAYER_NORM_EPS)
    return params["scale"] * norm_x + params["shift"]


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (the book's ``GELU``, GPT-2's ``gelu_new``), in x's dtype; sqrt(2 / pi)
    computed in float32 as the book's ``torch.sqrt(torch.tensor(2.0 / torch.pi))``, in float64 for float64."""
    scale = np.sqrt(np.asarray(2.0 / np.pi, np.promote_types(x.dtype, np.float32))).astype(x.dtype)
    return 0.5 * x * (1 + np.tanh(scale * (x + 0.044715 * x**3)))


def feed_forward(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """``FeedForward``: ``layers.0`` (D -> 4D), GELU, ``layers.2`` (4D -> D). Returns ``(..., D)``."""
    hidden = linear(x, params["layers.0.weight"], params["layers.0.bias"])  # (..., 4D)
    return linear(gelu(hidden), params["layers.2.weight"], params["layers.2.bias"])  # (..., D)


def transformer_block(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    num_heads: int,
    context_length: int,
    dropout_rate: float = 0.0,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, Steps]:
    """``TransformerBlock``: ``x + drop(att(norm1(x)))``, then ``+ drop(ff(norm2(.)))``.

    Args: params a block's (``att.*``, ``ff.*``, ``norm1.*``, ``norm2.*``); x ``(B, T, D)``;
    dropout (``dropout_rate``) only with an ``rng``.
    Returns: ``(output (B, T, D), steps)``, the steps ``BLOCK_STEPS``.
    """
    return apply_block(
        x, **block_parts(params, norm=layer_norm, feed_forward=feed_forward),
        att=lambda h: multi_head_attention(
            sub_params(params, "att."), h, num_heads=num_heads, context_length=context_length,
            dropout=dropout_rate, rng=rng,
        )[0],
        drop_shortcut=lambda h: dropout(h, dropout_rate, rng=rng),
    )  # fmt: skip


def gpt_model(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    config: Mapping[str, Any],
    *,
    rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, Steps]:
    """``GPTModel``: token embeddings plus position embeddings, ``n_layers`` blocks, a final
    LayerNorm and the output head.

    Args: params the model's weights; token_ids integer ``(B, T)``, T <= context_length; config the
    book's; dropout (``drop_rate``) only with an ``rng``.
    Returns: ``(logits (B, T, V), steps)``: ``embeddings``, each block's steps as
    ``trf_blocks.{i}.<step>``, ``final_norm``, ``output``.
    """
    num_tokens = token_ids.shape[1]
    tok_embeds = params["tok_emb.weight"][token_ids]  # (B, T, D)
    pos_embeds = params["pos_emb.weight"][:num_tokens]  # (T, D)
    x = dropout(tok_embeds + pos_embeds, config["drop_rate"], rng=rng)  # (B, T, D)

    def block(i: int, weights: Mapping[str, Any]) -> Any:  # block i, its dropout from rng
        return functools.partial(
            transformer_block, weights, num_heads=config["n_heads"], context_length=config["context_length"],
            dropout_rate=config["drop_rate"], rng=rng,
        )  # fmt: skip

    return apply_layers(params, x, config["n_layers"], block=block, norm=layer_norm, linear=linear)


def init_gpt_cache(config: Mapping[str, Any], batch: int, dtype: Any = np.float32) -> tuple[KVCache, ...]:
    """Empty KV caches, one per block, each ``(B, N, context_length, H)``."""
    shape = cache_shape(config, "GPTModel", batch)  # (B, N, L, H)
    return tuple(init_kv_cache(*shape, dtype) for _ in range(config["n_layers"]))


def gpt_model_decode(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
    padding_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, tuple[KVCache, ...]]:
    """The GPT on new ``token_ids`` ``(B, t)`` after the ``caches``' tokens (evaluation mode).

    Args: padding_mask bool ``(B, t)``, True = padding: those tokens are hidden from every query and
    take no position (a token's position counts the tokens before it that are not padding: prompts
    of different lengths, left-padded, decode as each would alone).
    Returns: ``(logits (B, t, V), caches)``: the full pass's logits at those positions; new caches.
    """
    return decode(params, token_ids, caches, config, padding_mask)


def decode(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
    padding_mask: np.ndarray | None = None,
    *,
    last_only: bool = False,
    in_place: bool = False,
) -> tuple[np.ndarray, tuple[KVCache, ...]]:
    """``gpt_model_decode``; ``last_only``: the logits of the last token alone ``(B, 1, V)`` (the
    output head's product for one position); ``in_place``: the caches written as they are."""
    positions = token_positions(caches[0], padding_mask, token_ids.shape[1])  # (B, t)
    x = params["tok_emb.weight"][token_ids] + params["pos_emb.weight"][positions]  # (B, t, D)
    att = functools.partial(
        attention_decode, padding_mask=padding_mask, num_heads=config["n_heads"], in_place=in_place
    )
    return decode_model(
        params, x, caches, att=att, norm=layer_norm, feed_forward=feed_forward, linear=linear,
        last_only=last_only,
    )  # fmt: skip
