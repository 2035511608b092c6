"""Text generation with the GPT in NumPy: prefill once, then one token at a time from the KV caches.

``generate`` is transformers' ``generate`` for a GPT-2, with its names and meanings:

- ``temperature=0`` is greedy (argmax, transformers' ``do_sample=False``). Otherwise the logits are
  divided by ``temperature``, cut to the ``top_k`` largest, then to the most probable tokens whose
  probability reaches ``top_p`` (transformers' order), and a token is sampled with ``rng`` (a
  ``numpy.random.Generator``; jax_attn's keys draw other tokens). Unlike transformers, ``top_k``
  is None (every token) unless given.
- ``attention_mask`` ``(B, T)``: 1 = a token, 0 = padding (transformers' meaning; the padding masks
  of numpy_attn's layers say True = padding), each row left-padded. A row's padding is hidden and its
  positions count from its first token: each row gets the tokens it would alone.
- ``eos_token_id`` (an id or a list): a row that picks one is finished, and gets ``pad_token_id``
  (by default the first eos id) after it; generation stops when every row is finished, so fewer
  than ``max_new_tokens`` columns may come back. No eos id is picked before ``min_new_tokens``.
- ``streamer``: transformers' protocol: ``put`` the prompt ``(B, T)``, then each step's tokens
  ``(B,)``, then ``end()``.

The caches hold T + ``max_new_tokens`` tokens, allocated once and written in place (no copy or
allocation per token); the output head is computed for the last position only. The functions
before ``generate`` are shared with jax_attn's generation (framework-neutral).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.gpt import decode, init_gpt_cache
from numpy_attn.gpt_checks import check_logits_finite
from numpy_attn.sampling import next_tokens, suppress_stops

__all__ = ["generate"]


def stop_ids(eos_token_id: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """The eos ids as a list of ints ([] for None)."""
    if eos_token_id is None:
        return []
    ids = eos_token_id if isinstance(eos_token_id, list | tuple) else [eos_token_id]
    return [int(token) for token in ids]


def fill_id(stops: list[int], pad_token_id: int | None) -> int:
    """The id after a row's eos: ``pad_token_id``, else the first eos id (as transformers), else 0."""
    if pad_token_id is not None:
        return int(pad_token_id)
    return stops[0] if stops else 0


def generate(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    config: Mapping[str, Any],
    max_new_tokens: int,
    *,
    attention_mask: np.ndarray | None = None,
    min_new_tokens: int = 0,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    rng: np.random.Generator | None = None,
    streamer: Any = None,
) -> np.ndarray:
    """``token_ids`` ``(B, T)`` followed by up to ``max_new_tokens`` generated tokens:
    ``(B, T + n)``, n = ``max_new_tokens`` unless every row reached an eos id first (see the module).

    Logits that are not finite (a float16 model whose activations overflow) raise ValueError naming
    the step, before any token is picked from them.
    """
    batch, num_tokens = token_ids.shape
    dtype = params["tok_emb.weight"].dtype
    stops, fill = stop_ids(eos_token_id), fill_id(stop_ids(eos_token_id), pad_token_id)
    padding = None if attention_mask is None else np.asarray(attention_mask) == 0  # (B, T)
    caches = init_gpt_cache({**config, "context_length": num_tokens + max_new_tokens}, batch, dtype)
    sequences = np.full((batch, num_tokens + max_new_tokens), fill, token_ids.dtype)  # (B, T + new)
    sequences[:, :num_tokens] = token_ids
    finished = np.zeros(batch, bool)
    if streamer is not None:
        streamer.put(token_ids)
    step_input, step_padding, new = token_ids, padding, 0
    while new < max_new_tokens and not finished.all():
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is check_logits_finite's error
            logits, caches = decode(
                params, step_input, caches, config, step_padding, last_only=True, in_place=True
            )
        last = logits[:, -1]  # (B, V)
        check_logits_finite(new + 1, bool(np.isfinite(last).all()), max_new_tokens, dtype)
        last = suppress_stops(last, stops, new, min_new_tokens)
        tokens = np.where(finished, fill, next_tokens(last, rng, float(temperature), top_k, top_p))  # (B,)
        finished |= np.isin(tokens, stops)
        sequences[:, num_tokens + new] = tokens
        if streamer is not None:
            streamer.put(sequences[:, num_tokens + new].copy())
        step_input, step_padding, new = sequences[:, num_tokens + new : num_tokens + new + 1], None, new + 1
    if streamer is not None:
        streamer.end()
    return sequences[:, : num_tokens + new]
