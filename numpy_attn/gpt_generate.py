"""Text generation with the GPT: prefill once, then one token at a time from per-layer KV caches.

``gpt_model_decode`` runs the model on new tokens given a ``KVCache`` per block (numpy_attn's
cache: preallocated ``(B, N, L, H)`` arrays, L = ``context_length``, written in place); its
logits equal the full pass's at those positions. ``temperature=0`` is greedy (argmax, as
transformers' ``do_sample=False``); otherwise the logits are divided by ``temperature``, cut
to the ``top_k`` largest, and sampled with ``rng`` (a ``numpy.random.Generator``; the same seed
draws other tokens than jax_attn's keys). jax_attn.gpt_generate mirrors this module.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.gpt import apply_block, apply_model, block_parts, head_parts
from numpy_attn.gpt_spec import (
    FIRST_WEIGHT,
    check_config,
    check_generate_args,
    check_gpt_caches,
    check_gpt_params,
    check_logits_finite,
    check_token_ids,
    sub_params,
    without_gpt_buffers,
)
from numpy_attn.kv_cache import KVCache, cache_length, init_kv_cache, unchecked_multi_head_attention_decode
from numpy_attn.softmax import unchecked_softmax
from numpy_attn.validation import check_rng

__all__ = ["generate", "gpt_model_decode", "init_gpt_cache", "unchecked_gpt_model_decode"]


def init_gpt_cache(config: Mapping[str, Any], batch: int, dtype: Any = np.float32) -> tuple[KVCache, ...]:
    """Empty caches, one per block, for ``context_length`` tokens."""
    check_config(config)
    head_dim = config["emb_dim"] // config["n_heads"]
    return tuple(
        init_kv_cache(batch, config["n_heads"], config["context_length"], head_dim, dtype)
        for _ in range(config["n_layers"])
    )


def gpt_model_decode(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
) -> tuple[np.ndarray, tuple[KVCache, ...]]:
    """The GPT on new ``token_ids`` (B, t) after the ``caches``' tokens: ``(logits (B, t, V),
    caches)``, the logits the full pass gives at those positions (evaluation mode).

    Checks first, as ``gpt_model`` and ``generate`` do: the config, the weights, the ids, and
    the caches (``check_gpt_caches``: one per block, each as the decode functions check theirs,
    all holding the same tokens with room for t more)."""
    check_config(config)
    params = without_gpt_buffers(params, config)
    check_gpt_params(params, config)
    check_token_ids(token_ids, config)
    check_gpt_caches(
        caches, token_ids.shape, config, params[FIRST_WEIGHT].dtype, KVCache, np.ndarray, cache_length
    )
    return unchecked_gpt_model_decode(params, token_ids, caches, config)


def unchecked_gpt_model_decode(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
) -> tuple[np.ndarray, tuple[KVCache, ...]]:
    """``gpt_model_decode`` without its checks: ``generate``'s step, checked once per call."""
    # an int, as the layers' _decode: a narrow integer length (uint8) would wrap start + num_tokens
    start, num_tokens = cache_length(caches[0]), token_ids.shape[1]
    tok_embeds = params["tok_emb.weight"][token_ids]  # (B, t, D)
    pos_embeds = params["pos_emb.weight"][start : start + num_tokens]  # (t, D)
    x = tok_embeds + pos_embeds  # (B, t, D)
    blocks, new_caches = [], []
    for index, cache in enumerate(caches):
        block = sub_params(params, f"trf_blocks.{index}.")

        def att(h: np.ndarray, block=block, cache=cache) -> np.ndarray:
            out, cache = unchecked_multi_head_attention_decode(
                sub_params(block, "att."), h, cache, num_heads=config["n_heads"]
            )
            new_caches.append(cache)
            return out

        blocks.append(
            functools.partial(apply_block, **block_parts(block), att=att, drop_shortcut=lambda h: h)
        )
    logits, _ = apply_model(x, blocks=blocks, **head_parts(params))  # (B, t, V)
    return logits, tuple(new_caches)


def _next_tokens(
    logits: np.ndarray, rng: np.random.Generator | None, temperature: float, top_k: int | None
) -> np.ndarray:
    """The next token per row of ``logits`` (B, V): argmax, or a sample. The logits kept (the
    ``top_k`` largest), less their maximum, are divided by ``temperature``: each is <= 0 and the
    largest 0, so no temperature overflows them; where a tiny one takes the others to -inf, the
    sample is the argmax (greedy; ties shared)."""
    if temperature == 0.0:
        return np.argmax(logits, axis=-1)  # (B,)
    if top_k is not None:
        kth_largest = -np.sort(-logits, axis=-1)[:, top_k - 1 : top_k]  # (B, 1)
        logits = np.where(logits < kth_largest, -np.inf, logits)
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)  # (B, V), <= 0
    with np.errstate(over="ignore"):  # a tiny temperature: -inf, as the limit
        probs = unchecked_softmax(shifted / temperature, axis=-1)  # (B, V)
    return np.array([rng.choice(len(row), p=row) for row in probs])  # (B,)


def generate(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    config: Mapping[str, Any],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Extend ``token_ids`` (B, T) by ``max_new_tokens`` tokens: returns ``(B, T + max_new_tokens)``.

    ``T + max_new_tokens`` may not exceed ``context_length`` (the cache holds that many).
    ``temperature > 0`` samples and needs ``rng``; ``top_k`` keeps the k likeliest tokens.
    Logits that are not finite (a float16 model whose activations overflow) raise a ValueError
    naming the step (``check_logits_finite``), before any token is picked from them.
    """
    params = without_gpt_buffers(params, config)
    check_gpt_params(params, config)
    check_token_ids(token_ids, config)
    check_rng(rng)
    check_generate_args(token_ids.shape, max_new_tokens, config, temperature, top_k, rng is not None)
    temperature = float(temperature)  # checked within float64's range: an int past int64's divides too
    caches = init_gpt_cache(config, token_ids.shape[0], params["tok_emb.weight"].dtype)
    new_tokens, step_input = [], token_ids
    for step in range(1, max_new_tokens + 1):
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is check_logits_finite's error
            logits, caches = unchecked_gpt_model_decode(params, step_input, caches, config)
        last = logits[:, -1]  # (B, V)
        check_logits_finite(step, bool(np.isfinite(last).all()), max_new_tokens, params[FIRST_WEIGHT].dtype)
        step_input = _next_tokens(last, rng, temperature, top_k)[:, None].astype(token_ids.dtype)  # (B, 1)
        new_tokens.append(step_input)
    return np.concatenate([token_ids, *new_tokens], axis=1)  # (B, T + new)
