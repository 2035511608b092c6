"""Note 003's classes: one fused ``Wqkv`` projection cut into queries, keys and values, and an
output projection ``Wo``."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from numpy_attn.ops import (
    causal_mask,
    dropout,
    linear,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)
from numpy_attn.steps import Steps


def fused_single_head_attention(params: Mapping[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, Steps]:
    """``FusedSingleHeadAttention`` (note 003's ``SingleHeadAttention``): one bidirectional head of
    size E = D // 4.

    Args: params ``Wqkv`` (``.weight`` ``(3E, D)``) and ``Wo`` (``.weight`` ``(D, E)``), biases
    with ``bias``; x ``(B, T, D)``.
    Returns: ``(output (B, T, D), steps)``.
    """
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, T, 3E)
    queries, keys, values = np.split(qkv, 3, axis=-1)  # 3 x (B, T, E): the notes' unbind
    context_vec, steps = scaled_dot_product_attention(queries, keys, values)  # (B, T, E)
    output = linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    steps = Steps(queries=queries, keys=keys, values=values, **steps, context_vec=context_vec)
    return output, Steps(**steps, output=output)


def fused_multi_head_attention(
    params: Mapping[str, np.ndarray], x: np.ndarray, *, num_heads: int
) -> tuple[np.ndarray, Steps]:
    """``FusedMultiHeadAttention`` (note 003's ``MultiHeadAttention``): bidirectional heads.

    The notes' ``reshape(B, T, 3, N, H).transpose(3, 1).unbind(2)`` is ``Wqkv(x)`` cut into thirds,
    each split into heads, as written here.
    Args: params ``Wqkv`` (``.weight`` ``(3D, D)``) and ``Wo`` (``.weight`` ``(D, D)``), biases with
    ``bias``; x ``(B, T, D)``, D divisible by ``num_heads``.
    Returns: ``(output (B, T, D), steps)``.
    """
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, T, 3D)
    queries, keys, values = np.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
    steps = Steps(queries=queries, keys=keys, values=values)
    context_vec, attention_steps = scaled_dot_product_attention(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads)
    )  # (B, N, T, H)
    context_vec = merge_heads(context_vec)  # (B, T, D)
    output = linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    return output, Steps(**steps, **attention_steps, context_vec=context_vec, output=output)


def fused_causal_attention(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    padding_mask: np.ndarray | None = None,
    *,
    num_heads: int,
    context_size: int,
    attn_drop: float = 0.1,
    out_drop: float = 0.1,
    rng: np.random.Generator | None = None,
    attn_keep_mask: np.ndarray | None = None,
    out_keep_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, Steps]:
    """``FusedCausalAttention`` (note 003's ``CausalAttention``): causal heads, a padding mask, and
    dropout on the attention weights and on the output.

    Args:
        params: as ``fused_multi_head_attention``'s.
        x: ``(B, T, D)``, T <= context_size.
        padding_mask: bool ``(B, S)``, True = padding: hidden from every query; None: no padding.
        attn_drop, out_drop, rng, attn_keep_mask, out_keep_mask: dropout happens with an ``rng``
            or the keep-masks (bool, True = keep: ``(B, N, T, S)`` and ``(B, T, D)``).
    Returns: ``(output (B, T, D), steps)``; the steps end with ``projected``, before output dropout.
    A query whose every visible key is padding gets zero weights (torch: NaN).
    """
    b, num_tokens, d_in = x.shape
    qkv = linear(x, params["Wqkv.weight"], params.get("Wqkv.bias"))  # (B, T, 3D)
    queries, keys, values = np.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
    steps = Steps(queries=queries, keys=keys, values=values)
    mask = causal_mask(num_tokens)  # (T, S), True = hidden
    if padding_mask is not None:
        mask = mask | padding_mask[:, None, None, :]  # (B, 1, T, S): the notes' mask.view(B, 1, 1, S)
    context_vec, attention_steps = scaled_dot_product_attention(
        split_heads(queries, num_heads), split_heads(keys, num_heads), split_heads(values, num_heads),
        mask, dropout=attn_drop, rng=rng, attn_keep_mask=attn_keep_mask,
    )  # fmt: skip  # (B, N, T, H)
    context_vec = merge_heads(context_vec)  # (B, T, D)
    projected = linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    output = dropout(projected, out_drop, rng=rng, keep_mask=out_keep_mask)  # (B, T, D)
    steps = Steps(**steps, **attention_steps, context_vec=context_vec, projected=projected)
    return output, Steps(**steps, output=output)
