"""Scaled dot-product attention: the computation every layer shares."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpy_attn.softmax import compute_dtype
from numpy_attn.validation import (
    check_attention_shapes,
    check_dropout,
    check_flag,
    check_mask_operands,
    check_scores_mask,
)

from jax_attn.checks import check_jax_operands, check_key
from jax_attn.dropout import unchecked_dropout
from jax_attn.softmax import unchecked_softmax
from numpy_attn.steps import Steps

__all__ = ["scaled_dot_product_attention", "unchecked_scaled_dot_product_attention"]


def scaled_dot_product_attention(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array | None = None,
    *,
    dropout: float | None = None,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``.

    Shapes: queries ``(..., T, H)``, keys ``(..., S, H)``, values ``(..., S, Hv)``; returns
    ``(..., T, Hv)``. ``mask`` is bool, broadcastable to ``(..., T, S)``, True = hidden (the
    notes' meaning; ``jax.nn.dot_product_attention`` and Flax use the opposite). A query whose
    every key is hidden gets zero weights and a zero output (torch gives NaN).

    Half-precision inputs (float16, bfloat16) have their scores and softmax computed in
    float32 and the weights cast back to the input dtype, as the blockwise path and
    ``jax.nn`` do: so scores beyond float16's range (|q . k| above ~65504) stay finite and the
    answer does not depend on the path. The notes' torch classes compute the scores in float16
    and give NaN there. The recorded ``attn_scores``/``masked_scores`` steps are these float32
    scores (torch's are float16, inf beyond its range).

    ``dropout`` is the probability of dropping attention weights, or None for a layer that has no
    attention dropout (its trace then has no ``attn_weights_dropped`` step); see ``dropout`` for
    ``key`` and ``attn_keep_mask``. Steps: ``attn_scores``, ``masked_scores`` (only with a
    mask), ``attn_weights``, ``attn_weights_dropped`` (only with ``dropout``).

    TypeError for a non-array (masks included), another framework's tensor, a non-floating
    dtype, float64 without 64-bit mode or queries, keys and values of different dtypes;
    ValueError for shapes that do not fit, a mask that is not bool or does not broadcast to the
    scores' ``(..., T, S)``, ``dropout`` outside [0, 1); ``key`` is checked with or without
    dropout.
    """
    check_jax_operands(queries=queries, keys=keys, values=values)
    check_attention_shapes(queries, keys, values)
    check_scores_mask(mask, queries, keys)
    check_mask_operands(attn_keep_mask=attn_keep_mask)
    check_key(key)
    if dropout is not None:
        check_dropout("dropout", dropout)
    check_flag("return_steps", return_steps)
    return unchecked_scaled_dot_product_attention(
        queries, keys, values, mask, dropout=dropout, key=key, attn_keep_mask=attn_keep_mask,
        return_steps=return_steps,
    )  # fmt: skip


def unchecked_scaled_dot_product_attention(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array | None = None,
    *,
    dropout: float | None = None,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``scaled_dot_product_attention`` for arguments already checked (the layers')."""
    dtype = queries.dtype
    compute = compute_dtype(dtype)  # half precision: scores in float32
    queries_acc, keys_acc = queries.astype(compute, copy=False), keys.astype(compute, copy=False)
    # one contraction, no transposed keys: XLA would fold a transpose into the keys' projection,
    # a dot contracting the weight's first axis, which XLA:CPU runs with its slow generic kernel
    attn_scores = jnp.einsum("...th,...sh->...ts", queries_acc, keys_acc)  # (..., T, S)
    masked_scores = attn_scores if mask is None else jnp.where(mask, -jnp.inf, attn_scores)
    attn_weights = unchecked_softmax(masked_scores / keys.shape[-1] ** 0.5, axis=-1)  # (..., T, S)
    attn_weights = attn_weights.astype(dtype, copy=False)
    attn_weights_dropped = (
        attn_weights
        if dropout is None
        else unchecked_dropout(attn_weights, dropout, key=key, keep_mask=attn_keep_mask)
    )
    context_vec = attn_weights_dropped @ values  # (..., T, Hv)
    if not return_steps:
        return context_vec
    steps = Steps(attn_scores=attn_scores)
    if mask is not None:
        steps["masked_scores"] = masked_scores
    steps["attn_weights"] = attn_weights
    if dropout is not None:
        steps["attn_weights_dropped"] = attn_weights_dropped
    return context_vec, steps
