"""The next token from the logits, in NumPy: transformers' logits processors and warpers.

jax_attn/sampling.py is the same file in JAX. ``suppress_stops`` is ``min_new_tokens``' processor;
``next_tokens`` divides by the temperature, keeps the ``top_k`` largest, then the ``top_p`` nucleus
(``keep_top_p``), and samples with a ``numpy.random.Generator``: transformers' order (in float64).
"""

from __future__ import annotations

import numpy as np

from numpy_attn.ops import softmax


def suppress_stops(logits: np.ndarray, stops: list[int], new_tokens: int, min_new_tokens: int) -> np.ndarray:
    """transformers' ``MinNewTokensLengthLogitsProcessor``: the eos ids' logits at -inf while fewer
    than ``min_new_tokens`` tokens are generated. ``logits`` ``(B, V)``."""
    if new_tokens >= min_new_tokens or not stops:
        return logits
    logits = logits.copy()
    logits[:, stops] = -np.inf
    return logits


def keep_top_p(scaled: np.ndarray, top_p: float) -> np.ndarray:
    """transformers' ``TopPLogitsWarper``: the most probable tokens whose probability before them
    (in descending order) is below ``top_p`` are kept, the most probable always; the others -inf.
    ``top_p`` 1 keeps every token (transformers applies no warper at 1; a cumulative sum rounded up
    to 1 would drop the least probable). ``scaled`` ``(B, V)``, the logits after temperature (and top_k)."""
    order = np.argsort(-scaled, axis=-1, kind="stable")  # (B, V), most probable first
    probs = softmax(np.take_along_axis(scaled, order, axis=-1), axis=-1)  # (B, V)
    before = np.cumsum(probs, axis=-1) - probs  # (B, V): the probability of the tokens before each
    remove_sorted = (before >= top_p) & (top_p < 1)
    remove_sorted[:, 0] = False
    remove = np.empty_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)
    return np.where(remove, -np.inf, scaled)


def next_tokens(
    logits: np.ndarray,
    rng: np.random.Generator | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> np.ndarray:
    """The next token of each row of ``logits`` ``(B, V)``: the argmax, or a sample. The logits,
    less their maximum, are divided by ``temperature`` (each <= 0, so no temperature overflows them;
    float64), cut by ``top_k`` and ``top_p``, and sampled."""
    if temperature == 0.0:
        return np.argmax(logits, axis=-1)  # (B,)
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)  # (B, V), <= 0
    with np.errstate(over="ignore", divide="ignore"):  # a tiny temperature: -inf, as the limit
        scaled = np.where(shifted == 0, 0, shifted / temperature)  # (B, V)
    if top_k is not None:
        kth_largest = -np.sort(-scaled, axis=-1)[:, top_k - 1 : top_k]  # (B, 1)
        scaled = np.where(scaled < kth_largest, -np.inf, scaled)
    if top_p is not None:
        scaled = keep_top_p(scaled, top_p)
    probs = softmax(scaled, axis=-1)  # (B, V)
    return np.array([rng.choice(len(row), p=row) for row in probs])  # (B,)
