"""``CausalAttention`` and ``MultiHeadAttentionWrapper`` (a stack of causal heads)."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jax_attn.attend import unchecked_attend
from jax_attn.checks import check_key, check_layer
from jax_attn.compiled import compiled
from jax_attn.linear import unchecked_qkv_projections
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking
from numpy_attn.implementation import DEFAULT_BLOCK_SIZE, fuses_projections
from numpy_attn.steps import Steps

__all__ = ["causal_attention", "multi_head_attention_wrapper"]


@compiled
def causal_attention(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    context_length: int,
    dropout: float = 0.0,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    implementation: str = "reference",
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``CausalAttention``: one causal head. x is ``(B, T, D)`` with T <= context_length;
    returns ``(B, T, E)``.

    Dropout on the attention weights only happens with ``key`` or ``attn_keep_mask``
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
        params, jnp.asarray(x), AttnDropout(dropout, key, attn_keep_mask),
        ComputePath(implementation, block_size), return_steps,
    )  # fmt: skip


def _causal_head(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    dropout: AttnDropout,
    path: ComputePath,
    return_steps: bool,
) -> jax.Array | tuple[jax.Array, Steps]:
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


@compiled
def multi_head_attention_wrapper(
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
    """``MultiHeadAttentionWrapper``: ``num_heads`` independent causal heads (weights
    ``heads.{i}.*``), concatenated. x is ``(B, T, D)``; returns ``(B, T, N * E)``, no projection.

    ``attn_keep_mask`` is bool ``(B, N, T, S)``, True = keep; head i uses ``[:, i]`` and, for
    random dropout, the key ``jax.random.fold_in(key, i)``.
    Steps: each head's steps prefixed ``heads.{i}.``, then ``context_vec`` and ``output``.
    """
    check_layer(
        "MultiHeadAttentionWrapper", params, x, num_heads=num_heads,
        context_length=context_length, dropouts={"dropout": dropout},
        attn_keep_mask=attn_keep_mask, implementation=implementation, block_size=block_size,
        return_steps=return_steps,
    )  # fmt: skip
    x = jnp.asarray(x)  # arrays from any framework compute here
    check_key(key)  # before jax.random.fold_in reads it
    head_outputs, steps, path = [], Steps(), ComputePath(implementation, block_size)
    for i in range(num_heads):
        prefix = f"heads.{i}."
        head_params = {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
        head_dropout = AttnDropout(
            dropout,
            None if key is None else jax.random.fold_in(key, i),
            None if attn_keep_mask is None else attn_keep_mask[:, i],
        )
        head = _causal_head(head_params, x, head_dropout, path, return_steps)
        head_output, head_steps = head if return_steps else (head, {})  # (B, T, E)
        head_outputs.append(head_output)
        steps.update((prefix + name, value) for name, value in head_steps.items())
    context_vec = jnp.concatenate(head_outputs, axis=-1)  # (B, T, N * E)
    if not return_steps:
        return context_vec
    return context_vec, Steps(**steps, context_vec=context_vec, output=context_vec)
