"""The book's ``MultiHeadAttention``: one projection per role, split into heads, causal."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jax_attn.attend import unchecked_attend_heads
from jax_attn.checks import check_layer
from jax_attn.compiled import compiled
from jax_attn.linear import unchecked_linear, unchecked_qkv_weights
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking
from numpy_attn.implementation import DEFAULT_BLOCK_SIZE, fuses_projections
from numpy_attn.steps import Steps

__all__ = ["multi_head_attention"]


@compiled
def multi_head_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    context_length: int,
    dropout: float = 0.0,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``MultiHeadAttention``: causal multi-head attention with an output projection.

    x is ``(B, T, D)`` with T <= context_length; returns ``(B, T, E)``. The ``out_proj`` bias is
    used if present (the book's class always has it; note 004's ``MultiHeadAttentionClass``
    only with ``qkv_bias``). ``attn_keep_mask`` is bool ``(B, N, T, S)``, True = keep.
    ``implementation``: ``"reference"`` (the notes' math), ``"blockwise"`` (O(T) memory) or
    ``"auto"``; the projections run as one matmul where ``fuses_projections`` says so.
    """
    check_layer(
        "MultiHeadAttention", params, x, num_heads=num_heads, context_length=context_length,
        dropouts={"dropout": dropout}, attn_keep_mask=attn_keep_mask,
        implementation=implementation, block_size=block_size,
        return_steps=return_steps,
    )  # fmt: skip
    x = jnp.asarray(x)  # arrays from any framework compute here
    context_vec, attention_steps = unchecked_attend_heads(
        x,
        unchecked_qkv_weights(params),
        num_heads,
        Masking(causal=True),
        AttnDropout(dropout, key, attn_keep_mask),
        ComputePath(implementation, block_size, fused_qkv=fuses_projections(implementation, x.shape[-2])),
        return_steps,
    )  # (B, T, E)
    output = unchecked_linear(context_vec, params["out_proj.weight"], params.get("out_proj.bias"))
    if not return_steps:
        return output
    return output, Steps(**attention_steps, context_vec=context_vec, output=output)
