"""``CausalAttention`` and ``MultiHeadAttentionWrapper`` (a stack of causal heads)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from numpy_attn.attend import unchecked_attend
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking
from numpy_attn.implementation import DEFAULT_BLOCK_SIZE, fuses_projections
from numpy_attn.linear import unchecked_qkv_projections
from numpy_attn.spec import check_layer
from numpy_attn.steps import Steps

__all__ = ["causal_attention", "multi_head_attention_wrapper"]


def causal_attention(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    context_length: int,
    dropout: float = 0.0,
    rng: np.random.Generator | None = None,
    attn_keep_mask: np.ndarray | None = None,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> np.ndarray | tuple[np.ndarray, Steps]:
    """``CausalAttention``: one causal head. x is ``(B, T, D)`` with T <= context_length;
    returns ``(B, T, E)``.

    Dropout on the attention weights only happens with ``rng`` or ``attn_keep_mask``
    (bool ``(B, T, S)``, True = keep); otherwise the call is deterministic (eval mode).
    ``implementation``: ``"reference"`` (the notes' math), ``"blockwise"`` (O(T) memory) or
    ``"auto"``; the projections run as one matmul where ``fuses_projections`` says so.
    """
    check_layer(
        "CausalAttention", params, x, context_length=context_length,
        dropouts={"dropout": dropout}, attn_keep_mask=attn_keep_mask,
        implementation=implementation, block_size=block_size,
        return_steps=return_steps,
    )  # fmt: skip
    return _causal_head(
        params, np.asarray(x), AttnDropout(dropout, rng, attn_keep_mask),
        ComputePath(implementation, block_size), return_steps,
    )  # fmt: skip


def _causal_head(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    dropout: AttnDropout,
    path: ComputePath,
    return_steps: bool,
) -> np.ndarray | tuple[np.ndarray, Steps]:
    """``causal_attention`` on checked arguments (the wrapper checks all its heads at once)."""
    fused = fuses_projections(path.implementation, x.shape[-2])
    queries, keys, values = unchecked_qkv_projections(x, params, fused=fused)  # 3 x (B, T, E)
    context_vec, attention_steps = unchecked_attend(
        queries, keys, values, Masking(causal=True), dropout, path, return_steps
    )  # (B, T, E)
    if not return_steps:
        return context_vec
    return context_vec, Steps(
        queries=queries,
        keys=keys,
        values=values,
        **attention_steps,
        context_vec=context_vec,
        output=context_vec,
    )


def multi_head_attention_wrapper(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    num_heads: int,
    context_length: int,
    dropout: float = 0.0,
    rng: np.random.Generator | None = None,
    attn_keep_mask: np.ndarray | None = None,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> np.ndarray | tuple[np.ndarray, Steps]:
    """``MultiHeadAttentionWrapper``: ``num_heads`` independent causal heads (weights
    ``heads.{i}.*``), concatenated. x is ``(B, T, D)``; returns ``(B, T, N * E)``, no projection.

    ``attn_keep_mask`` is bool ``(B, N, T, S)``, True = keep; head i uses ``[:, i]``.
    Steps: each head's steps prefixed ``heads.{i}.``, then ``context_vec`` and ``output``.
    """
    check_layer(
        "MultiHeadAttentionWrapper", params, x, num_heads=num_heads,
        context_length=context_length, dropouts={"dropout": dropout},
        attn_keep_mask=attn_keep_mask, implementation=implementation, block_size=block_size,
        return_steps=return_steps,
    )  # fmt: skip
    x = np.asarray(x)  # arrays from any framework compute here
    head_outputs, steps, path = [], Steps(), ComputePath(implementation, block_size)
    for i in range(num_heads):
        prefix = f"heads.{i}."
        head_params = {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
        head_dropout = AttnDropout(dropout, rng, None if attn_keep_mask is None else attn_keep_mask[:, i])
        head = _causal_head(head_params, x, head_dropout, path, return_steps)
        head_output, head_steps = head if return_steps else (head, {})  # (B, T, E)
        head_outputs.append(head_output)
        steps.update((prefix + name, value) for name, value in head_steps.items())
    context_vec = np.concatenate(head_outputs, axis=-1)  # (B, T, N * E)
    if not return_steps:
        return context_vec
    return context_vec, Steps(**steps, context_vec=context_vec, output=context_vec)
