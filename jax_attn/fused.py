"""Note 003's classes: one fused ``Wqkv`` projection, an output projection ``Wo``."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jax_attn.attend import unchecked_attend, unchecked_attend_heads
from jax_attn.checks import check_key, check_layer
from jax_attn.compiled import compiled
from jax_attn.dropout import unchecked_dropout
from jax_attn.linear import unchecked_linear, unchecked_split_projection
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking
from numpy_attn.implementation import DEFAULT_BLOCK_SIZE, fuses_projections
from numpy_attn.steps import Steps

__all__ = ["fused_causal_attention", "fused_multi_head_attention", "fused_single_head_attention"]


def _fused(implementation: str, num_tokens: int) -> bool:
    """Whether ``Wqkv`` runs as one matmul: as in the notes, unless ``fuses_projections`` says
    that this fast path runs the three thirds apart."""
    return implementation == "reference" or fuses_projections(implementation, num_tokens)


@compiled
def fused_single_head_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``FusedSingleHeadAttention``: bidirectional, head size ``hidden_size // 4``.

    x is ``(B, T, D)`` with D = hidden_size; returns ``(B, T, D)``.
    """
    check_layer(
        "FusedSingleHeadAttention",
        params,
        x,
        implementation=implementation,
        block_size=block_size,
        return_steps=return_steps,
    )
    x = jnp.asarray(x)  # arrays from any framework compute here
    queries, keys, values = unchecked_split_projection(
        x, params["Wqkv.weight"], params.get("Wqkv.bias"), fused=_fused(implementation, x.shape[-2])
    )  # 3 x (B, T, E)
    context_vec, attention_steps = unchecked_attend(
        queries, keys, values, path=ComputePath(implementation, block_size), return_steps=return_steps
    )  # (B, T, E)
    output = unchecked_linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    if not return_steps:
        return output
    return output, Steps(
        queries=queries,
        keys=keys,
        values=values,
        **attention_steps,
        context_vec=context_vec,
        output=output,
    )


@compiled
def fused_multi_head_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``FusedMultiHeadAttention``: bidirectional multi-head attention.

    x is ``(B, T, D)`` with D = hidden_size, divisible by num_heads; returns ``(B, T, D)``. The
    notes' ``reshape(B, T, 3, N, H).transpose(3, 1).unbind(2)`` equals splitting ``Wqkv(x)``
    into thirds and each third into heads, which is what is done here.
    """
    check_layer(
        "FusedMultiHeadAttention", params, x, num_heads=num_heads,
        implementation=implementation, block_size=block_size,
        return_steps=return_steps,
    )  # fmt: skip
    x = jnp.asarray(x)  # arrays from any framework compute here
    qkv = params["Wqkv.weight"], params.get("Wqkv.bias")  # (3D, D), (3D,) or None
    path = ComputePath(implementation, block_size, fused_qkv=_fused(implementation, x.shape[-2]))
    context_vec, attention_steps = unchecked_attend_heads(
        x, qkv, num_heads, path=path, return_steps=return_steps
    )  # (B, T, D)
    output = unchecked_linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    if not return_steps:
        return output
    return output, Steps(**attention_steps, context_vec=context_vec, output=output)


@compiled
def fused_causal_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    padding_mask: jax.Array | None = None,
    *,
    num_heads: int,
    context_size: int,
    attn_drop: float = 0.1,
    out_drop: float = 0.1,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    out_keep_mask: jax.Array | None = None,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``FusedCausalAttention``: causal multi-head attention with an optional padding mask.

    x is ``(B, T, D)`` with T <= context_size; returns ``(B, T, D)``. ``padding_mask`` is bool
    ``(B, S)``, True = padding (hidden from every query), as in the notes; None = no padding.
    A query whose every visible key is padding gets zero weights, so its output is ``Wo``'s
    bias (torch gives NaN). Dropout (``attn_drop`` on the weights, ``out_drop`` on the output)
    only happens with ``key`` (split in two: weights, output) or the keep-masks
    (``attn_keep_mask`` bool ``(B, N, T, S)``, ``out_keep_mask`` bool ``(B, T, D)``, True =
    keep). Steps end with ``projected`` (before output dropout) and ``output``.
    ``implementation``: ``"reference"`` (the notes' math), ``"blockwise"`` (O(T) memory) or
    ``"auto"``.
    """
    check_layer(
        "FusedCausalAttention",
        params,
        x,
        num_heads=num_heads,
        context_length=context_size,
        context_name="context_size",
        dropouts={"attn_drop": attn_drop, "out_drop": out_drop},
        attn_keep_mask=attn_keep_mask,
        out_keep_mask=out_keep_mask,
        padding_mask=padding_mask,
        implementation=implementation,
        block_size=block_size,
        return_steps=return_steps,
    )
    x = jnp.asarray(x)  # arrays from any framework compute here
    check_key(key)  # before jax.random.split reads it
    attn_key, out_key = (None, None) if key is None else jax.random.split(key)
    qkv = params["Wqkv.weight"], params.get("Wqkv.bias")  # (3D, D), (3D,) or None
    context_vec, attention_steps = unchecked_attend_heads(
        x,
        qkv,
        num_heads,
        Masking(causal=True, padding_mask=padding_mask),
        AttnDropout(attn_drop, attn_key, attn_keep_mask),
        ComputePath(implementation, block_size, fused_qkv=_fused(implementation, x.shape[-2])),
        return_steps,
    )  # (B, T, D)
    projected = unchecked_linear(context_vec, params["Wo.weight"], params.get("Wo.bias"))  # (B, T, D)
    output = unchecked_dropout(projected, out_drop, key=out_key, keep_mask=out_keep_mask)
    if not return_steps:
        return output
    return output, Steps(**attention_steps, context_vec=context_vec, projected=projected, output=output)
