"""Text generation with the GPT: prefill once, then one token at a time from per-layer KV caches.

``gpt_model_decode`` runs the model on new tokens given a ``KVCache`` per block (jax_attn's
functional cache: fixed ``(B, N, L, H)`` arrays, L = ``context_length``); its logits equal the
full pass's at those positions. ``generate`` jits one step (decode, then pick the next token):
it compiles once for the prompt's length and once for single tokens, never once per token.
``temperature=0`` is greedy (argmax, as transformers' ``do_sample=False``); otherwise the
logits are divided by ``temperature``, cut to the ``top_k`` largest, and sampled with ``rng``
(a ``jax.random`` key). numpy_attn.gpt_generate mirrors this module.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jax_attn.checks import check_key
from jax_attn.gpt import GPTModel, block_parts, head_parts
from jax_attn.kv_cache import KVCache, init_kv_cache, multi_head_attention_decode
from numpy_attn.gpt import apply_block, apply_model
from numpy_attn.gpt_spec import (
    check_config,
    check_generate_args,
    check_gpt_params,
    check_token_ids,
    sub_params,
)

__all__ = ["generate", "gpt_model_decode", "init_gpt_cache"]


def init_gpt_cache(config: Mapping[str, Any], batch: int, dtype: Any = jnp.float32) -> tuple[KVCache, ...]:
    """Empty caches, one per block, for ``context_length`` tokens."""
    check_config(config)
    head_dim = config["emb_dim"] // config["n_heads"]
    return tuple(
        init_kv_cache(batch, config["n_heads"], config["context_length"], head_dim, dtype)
        for _ in range(config["n_layers"])
    )


def gpt_model_decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """The GPT on new ``token_ids`` (B, t) after the ``caches``' tokens: ``(logits (B, t, V),
    caches)``, the logits the full pass gives at those positions (evaluation mode)."""
    start, num_tokens = caches[0].length, token_ids.shape[1]
    tok_embeds = params["tok_emb.weight"][token_ids]  # (B, t, D)
    pos_embeds = jax.lax.dynamic_slice_in_dim(params["pos_emb.weight"], start, num_tokens)  # (t, D)
    x = tok_embeds + pos_embeds  # (B, t, D)
    blocks, new_caches = [], []
    for index, cache in enumerate(caches):
        block = sub_params(params, f"trf_blocks.{index}.")

        def att(h: jax.Array, block=block, cache=cache) -> jax.Array:
            out, cache = multi_head_attention_decode(
                sub_params(block, "att."), h, cache, num_heads=config["n_heads"],
                context_length=config["context_length"],
            )  # fmt: skip
            new_caches.append(cache)
            return out

        blocks.append(
            functools.partial(apply_block, **block_parts(block), att=att, drop_shortcut=lambda h: h)
        )
    logits, _ = apply_model(x, blocks=blocks, **head_parts(params))  # (B, t, V)
    return logits, tuple(new_caches)


def _next_tokens(
    logits: jax.Array, key: jax.Array | None, temperature: float, top_k: int | None
) -> jax.Array:
    """The next token per row of ``logits`` (B, V): argmax, or a sample."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1)  # (B,)
    logits = logits / temperature
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]  # (B, 1)
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1)  # (B,)


@functools.partial(jax.jit, static_argnames=("config_items", "temperature", "top_k"))
def _step(params, token_ids, caches, key, config_items, temperature, top_k):
    """One jitted step: decode ``token_ids`` (B, t), pick the next token from the last logits."""
    logits, caches = gpt_model_decode(params, token_ids, caches, dict(config_items))
    return _next_tokens(logits[:, -1], key, temperature, top_k), caches


def generate(
    model: GPTModel,
    token_ids: jax.Array,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    rng: jax.Array | None = None,
) -> jax.Array:
    """Extend ``token_ids`` (B, T) by ``max_new_tokens`` tokens: returns ``(B, T + max_new_tokens)``.

    ``T + max_new_tokens`` may not exceed ``context_length`` (the cache holds that many).
    ``temperature > 0`` samples and needs ``rng``; ``top_k`` keeps the k likeliest tokens.
    """
    config = model.config
    params = model.torch_params()  # the weights format, converted once per call
    check_gpt_params(params, config)
    check_token_ids(token_ids, config)
    check_key(rng, "rng")  # a jax.random key, under numpy_attn's argument name
    check_generate_args(token_ids.shape, max_new_tokens, config, temperature, top_k, rng is not None)
    token_ids = jnp.asarray(token_ids)
    caches = init_gpt_cache(config, token_ids.shape[0], params["tok_emb.weight"].dtype)
    keys = jax.random.split(rng, max_new_tokens) if rng is not None else [None] * max_new_tokens
    config_items, new_tokens, step_input = tuple(config.items()), [], token_ids
    for key in keys:
        next_tokens, caches = _step(params, step_input, caches, key, config_items, temperature, top_k)
        step_input = next_tokens[:, None].astype(token_ids.dtype)  # (B, 1)
        new_tokens.append(step_input)
    return jnp.concatenate([token_ids, *new_tokens], axis=1)  # (B, T + new)
