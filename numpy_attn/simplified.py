"""Self-attention without trainable weights (the notes' first section)."""

from __future__ import annotations

import numpy as np

from numpy_attn.softmax import softmax
from numpy_attn.steps import Steps
from numpy_attn.validation import check_flag, check_input

__all__ = ["simplified_self_attention"]


def simplified_self_attention(
    x: np.ndarray, *, return_steps: bool = False
) -> np.ndarray | tuple[np.ndarray, Steps]:
    """Every token attends to every token with ``softmax(x @ x^T) @ x``; x is ``(T, D)``.

    Steps: ``attn_scores`` (T, T), ``attn_weights`` (T, T), ``context_vec`` (T, D), ``output``.
    """
    check_input(x, layout="(T, D)")
    check_flag("return_steps", return_steps)
    x = np.asarray(x)  # arrays from any framework compute here
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
