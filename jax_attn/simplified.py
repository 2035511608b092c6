"""Self-attention without trainable weights (the book's section 3.3)."""

from __future__ import annotations

import jax

from jax_attn.ops import softmax
from numpy_attn.steps import Steps


def simplified_self_attention(x: jax.Array) -> tuple[jax.Array, Steps]:
    """Every token attends to every token: ``softmax(x @ x^T) @ x``. As
    ``numpy_attn.simplified_self_attention``."""
    attn_scores = x @ x.T  # (T, T)
    attn_weights = softmax(attn_scores, axis=-1)  # (T, T)
    context_vec = attn_weights @ x  # (T, D)
    steps = Steps(attn_scores=attn_scores, attn_weights=attn_weights, context_vec=context_vec)
    return context_vec, Steps(**steps, output=context_vec)
