"""The next token from the logits, in JAX: transformers' logits processors and warpers.

numpy_attn/sampling.py is the same file in NumPy. ``suppress_stops`` is ``min_new_tokens``'
processor; ``next_tokens`` divides by the temperature, keeps the ``top_k`` largest, then the ``top_p``
nucleus (``keep_top_p``), and samples: transformers' order, on float32 logits as transformers'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def suppress_stops(logits: jax.Array, stops: jax.Array, new_tokens: jax.Array, min_new_tokens: jax.Array):
    """transformers' ``MinNewTokensLengthLogitsProcessor``: the eos ids' logits at -inf while fewer
    than ``min_new_tokens`` tokens are generated. ``logits`` ``(B, V)``, ``stops`` ``(k,)``."""
    is_stop = (jnp.arange(logits.shape[-1])[:, None] == stops[None, :]).any(axis=-1)  # (V,)
    return jnp.where(is_stop & (new_tokens < min_new_tokens), -jnp.inf, logits)


def keep_top_p(scaled: jax.Array, top_p: jax.Array) -> jax.Array:
    """transformers' ``TopPLogitsWarper``: the most probable tokens whose probability before them
    (in descending order) is below ``top_p`` are kept, the most probable always; the others -inf.
    ``top_p`` 1 keeps every token (transformers applies no warper at 1; a cumulative sum rounded up
    to 1 would drop the least probable). ``scaled`` ``(B, V)``, the logits after temperature (and top_k)."""
    order = jnp.argsort(-scaled, axis=-1, stable=True)  # (B, V), most probable first
    probs = jax.nn.softmax(jnp.take_along_axis(scaled, order, axis=-1), axis=-1)  # (B, V)
    before = jnp.cumsum(probs, axis=-1) - probs  # (B, V): the probability of the tokens before each
    remove_sorted = ((before >= top_p) & (top_p < 1)).at[:, 0].set(False)
    remove = jnp.zeros_like(remove_sorted).at[jnp.arange(scaled.shape[0])[:, None], order].set(remove_sorted)
    return jnp.where(remove, -jnp.inf, scaled)


def next_tokens(
    logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: int | None, top_p: jax.Array | None
) -> jax.Array:
    """A sample from each row of ``logits`` ``(B, V)`` (float32): the logits, less their maximum,
    divided by ``temperature`` (a 0-d float32, at most float32's largest value: each <= 0, so no
    temperature overflows them), cut by ``top_k`` and ``top_p``."""
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, V), <= 0
    scaled = jnp.where(shifted == 0, 0, shifted / temperature)  # 0 / 0 where temperature rounds to 0
    if top_k is not None:
        kth_largest = jax.lax.top_k(scaled, top_k)[0][:, -1:]  # (B, 1)
        scaled = jnp.where(scaled < kth_largest, -jnp.inf, scaled)
    if top_p is not None:
        scaled = keep_top_p(scaled, top_p)
    return jax.random.categorical(key, scaled, axis=-1)  # (B,)
