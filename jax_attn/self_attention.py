"""``SelfAttentionV1`` and ``SelfAttentionV2``: trainable, bidirectional, single head, (T, D) input."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jax_attn.attend import unchecked_attend
from jax_attn.checks import check_layer
from jax_attn.compiled import compiled
from jax_attn.linear import unchecked_qkv_projections
from numpy_attn.attend_options import ComputePath
from numpy_attn.implementation import DEFAULT_BLOCK_SIZE, fuses_projections
from numpy_attn.steps import Steps

__all__ = ["self_attention_v1", "self_attention_v2"]


@compiled
def self_attention_v1(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``SelfAttentionV1``: raw ``(d_in, d_out)`` matrices ``W_query``/``W_key``/``W_value``, used
    as ``x @ W``. x is ``(T, D)``; returns ``(T, E)``. ``implementation``: ``"reference"`` (the
    notes' math), ``"blockwise"`` (O(T) memory) or ``"auto"``."""
    check_layer(
        "SelfAttentionV1",
        params,
        x,
        implementation=implementation,
        block_size=block_size,
        return_steps=return_steps,
    )
    x = jnp.asarray(x)  # arrays from any framework compute here
    queries = x @ params["W_query"]  # (T, E)
    keys = x @ params["W_key"]  # (T, E)
    values = x @ params["W_value"]  # (T, E)
    context_vec, attention_steps = unchecked_attend(
        queries, keys, values, path=ComputePath(implementation, block_size), return_steps=return_steps
    )  # (T, E)
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


@compiled
def self_attention_v2(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``SelfAttentionV2``: ``nn.Linear`` projections (bias if ``W_query.bias`` is present).
    x is ``(T, D)``; returns ``(T, E)``."""
    check_layer(
        "SelfAttentionV2",
        params,
        x,
        implementation=implementation,
        block_size=block_size,
        return_steps=return_steps,
    )
    x = jnp.asarray(x)  # arrays from any framework compute here
    fused = fuses_projections(implementation, x.shape[-2])
    queries, keys, values = unchecked_qkv_projections(x, params, fused=fused)  # 3 x (T, E)
    context_vec, attention_steps = unchecked_attend(
        queries, keys, values, path=ComputePath(implementation, block_size), return_steps=return_steps
    )  # (T, E)
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
