"""Text generation with the GPT in NumPy: prefill once, then one token at a time from the KV caches.

``temperature=0`` is greedy (argmax, as transformers' ``do_sample=False``); otherwise the logits
are cut to the ``top_k`` largest, divided by ``temperature`` and sampled with ``rng`` (a
``numpy.random.Generator``; the same seed draws other tokens than jax_attn's keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.gpt import gpt_model_decode, init_gpt_cache
from numpy_attn.gpt_checks import check_logits_finite
from numpy_attn.ops import softmax

__all__ = ["generate"]


def next_tokens(
    logits: np.ndarray, rng: np.random.Generator | None, temperature: float, top_k: int | None
) -> np.ndarray:
    """The next token of each row of ``logits`` ``(B, V)``: the argmax, or a sample. The logits kept,
    less their maximum, are divided by ``temperature``: each <= 0, so no temperature overflows them."""
    if temperature == 0.0:
        return np.argmax(logits, axis=-1)  # (B,)
    if top_k is not None:
        kth_largest = -np.sort(-logits, axis=-1)[:, top_k - 1 : top_k]  # (B, 1)
        logits = np.where(logits < kth_largest, -np.inf, logits)
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)  # (B, V), <= 0
    with np.errstate(over="ignore"):  # a tiny temperature: -inf, as the limit
        probs = softmax(shifted / temperature, axis=-1)  # (B, V)
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
    """``token_ids`` ``(B, T)`` extended by ``max_new_tokens`` tokens: ``(B, T + max_new_tokens)``.

    Logits that are not finite (a float16 model whose activations overflow) raise ValueError naming
    the step, before any token is picked from them.
    """
    caches = init_gpt_cache(config, token_ids.shape[0], params["tok_emb.weight"].dtype)
    new_tokens, step_input = [], token_ids
    for step in range(1, max_new_tokens + 1):
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is check_logits_finite's error
            logits, caches = gpt_model_decode(params, step_input, caches, config)
        last = logits[:, -1]  # (B, V)
        check_logits_finite(
            step, bool(np.isfinite(last).all()), max_new_tokens, params["tok_emb.weight"].dtype
        )
        step_input = next_tokens(last, rng, float(temperature), top_k)[:, None].astype(
            token_ids.dtype
        )  # (B, 1)
        new_tokens.append(step_input)
    return np.concatenate([token_ids, *new_tokens], axis=1)  # (B, T + new)
