"""Self-attention without trainable weights (the notes' first section)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_attn.checks import check_x64
from jax_attn.softmax import softmax
from numpy_attn.steps import Steps
from numpy_attn.validation import JAX_FLOATS, check_flag, check_input

__all__ = ["simplified_self_attention"]


def simplified_self_attention(
    x: jax.Array, *, return_steps: bool = False
) -> jax.Array | tuple[jax.Array, Steps]:
    """Every token attends to every token with ``softmax(x @ x^T) @ x``; x is ``(T, D)``.

    Steps: ``attn_scores`` (T, T), ``attn_weights`` (T, T), ``context_vec`` (T, D), ``output``.
    float64 only in 64-bit mode (``check_x64``), as the layers.
    """
    check_input(x, layout="(T, D)", floating=JAX_FLOATS)
    check_x64("x", x)
    check_flag("return_steps", return_steps)
    x = jnp.asarray(x)  # arrays from any framework compute here
    attn_scores = x @ x.T  # (T, T)
    attn_weights = softmax(attn_scores, axis=-1)  # (T, T)
    context_vec = attn_weights @ x  # (T, D)
    if not return_steps:
        return context_vec
    return context_vec, Steps(
        attn_scores=attn_scores,
        attn_weights=attn_weights,
        context_vec=context_vec,
        output=context_vec,
    )
