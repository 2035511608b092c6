"""The attention core of every layer, by implementation: the notes' math or the blockwise path;
and of the multi-head layers from their input on, projections and heads included."""

from __future__ import annotations

import jax
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking, check_option_types
from numpy_attn.blockwise import check_leading_axes
from numpy_attn.implementation import uses_blockwise
from numpy_attn.validation import (
    JAX_FLOATS,
    check_attend_options,
    check_attention_shapes,
    check_divisible,
    check_flag,
    check_input,
    check_linear_shapes,
    check_parts,
    check_qkv_pair,
    padding_batch,
)

from jax_attn.attention import unchecked_scaled_dot_product_attention
from jax_attn.blockwise import unchecked_blockwise_attention, unchecked_blockwise_self_attention
from jax_attn.checks import check_jax_operands, check_key
from jax_attn.dropout import draw_keep_mask
from jax_attn.heads import unchecked_merge_heads, unchecked_split_heads
from jax_attn.linear import unchecked_split_projection
from jax_attn.masks import unchecked_causal_mask
from numpy_attn.steps import Steps

__all__ = ["attend", "attend_heads", "unchecked_attend", "unchecked_attend_heads"]


def attend(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(),
    path: ComputePath = ComputePath(),
    return_steps: bool = False,
) -> tuple[jax.Array, Steps]:
    """``unchecked_attend`` after ``scaled_dot_product_attention``'s checks of the queries, keys, values,
    masks and dropout rate, and ``check_attend_options``' (``causal`` a bool, and T = S with it, the padding
    mask bool ``(B, S)`` on every path, a known implementation) (TypeError for a non-array, another
    framework's tensor, a non-floating dtype, float64 without 64-bit mode, different dtypes; ValueError for
    shapes that do not fit); ``return_steps`` a bool (``check_flag``)."""
    check_jax_operands(queries=queries, keys=keys, values=values)
    check_attention_shapes(queries, keys, values)
    check_leading_axes(queries, keys, values)  # on every path: blockwise cannot broadcast them
    check_option_types(masking, dropout, path)
    check_attend_options(
        masking, dropout, path,
        batch=padding_batch(queries.shape), num_queries=queries.shape[-2], num_keys=keys.shape[-2],
    )  # fmt: skip
    check_flag("return_steps", return_steps)
    return unchecked_attend(queries, keys, values, masking, dropout, path, return_steps)


def unchecked_attend(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(),
    path: ComputePath = ComputePath(),
    return_steps: bool = False,
) -> tuple[jax.Array, Steps]:
    """``(context_vec, steps)`` of ``(..., T, H)`` queries against ``(..., S, H)`` keys/values,
    for arguments already checked (the layers'; ``dropout.rng`` is checked here).

    ``path.implementation="reference"`` builds the mask from ``masking`` (causal, OR the ``(B, S)``
    padding mask, True = hidden, B the queries' first axis: 1 for ``(T, H)`` queries, as on the
    blockwise path) and runs ``scaled_dot_product_attention``; ``"blockwise"`` runs
    ``blockwise_attention`` in O(T) memory; ``"auto"`` picks blockwise from
    ``implementation.AUTO_BLOCKWISE_TOKENS`` query tokens on. The (T, S) steps are materialised only
    with ``return_steps`` (then by the reference math; the context still comes from the chosen
    path, and random dropout draws one keep-mask from ``dropout.rng``, a key, that both use).
    """
    check_key(dropout.rng)
    blockwise = uses_blockwise(path.implementation, queries.shape[-2])
    key, attn_keep_mask = dropout.rng, dropout.keep_mask
    if blockwise and return_steps and key is not None and dropout.rate:
        shape = queries.shape[:-1] + keys.shape[-2:-1]
        attn_keep_mask = draw_keep_mask(key, dropout.rate, shape)
        key = None
    steps = Steps()
    if not blockwise or return_steps:
        mask = unchecked_causal_mask(queries.shape[-2], keys.shape[-2]) if masking.causal else None  # (T, S)
        if masking.padding_mask is not None:  # (B, S) -> (B, 1, ..., 1, S), the queries' rank
            padding_mask = masking.padding_mask
            hidden_keys = padding_mask.reshape(
                padding_mask.shape[:1] + (1,) * (queries.ndim - 2) + padding_mask.shape[1:]
            )
            mask = hidden_keys if mask is None else mask | hidden_keys  # (B, 1, ..., T, S)
        attention = unchecked_scaled_dot_product_attention(
            queries, keys, values, mask,
            dropout=dropout.rate, key=key, attn_keep_mask=attn_keep_mask, return_steps=return_steps,
        )  # fmt: skip
        context_vec, steps = attention if return_steps else (attention, steps)
        if not blockwise:
            return context_vec, steps
    context_vec = unchecked_blockwise_attention(
        queries, keys, values, causal=masking.causal, padding_mask=masking.padding_mask,
        dropout=dropout.rate, key=key, attn_keep_mask=attn_keep_mask, block_size=path.block_size,
    )  # fmt: skip
    return context_vec, steps


def attend_heads(
    x: jax.Array,
    qkv: tuple[jax.Array, jax.Array | None],
    num_heads: int,
    masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(),
    path: ComputePath = ComputePath(),
    return_steps: bool = False,
) -> tuple[jax.Array, Steps]:
    """``unchecked_attend_heads`` after ``linear``'s checks of x and ``qkv`` (named ``qkv[0]``,
    ``qkv[1]``), that the weight stacks 3 projections whose width ``num_heads`` divides, and
    ``check_attend_options``' (``causal`` a bool, the padding mask bool ``(B, T)``, the keep-mask
    an array NumPy can read, the dropout rate in [0, 1), a known implementation); ``return_steps`` a bool."""
    check_qkv_pair(qkv)
    check_jax_operands(x=x, **{"qkv[0]": qkv[0], "qkv[1]": qkv[1]}, optional=("qkv[1]",))
    check_input(x, layout="(B, T, D)", floating=JAX_FLOATS)
    check_linear_shapes(x, *qkv)
    check_parts(tuple(qkv[0].shape), 3)
    check_divisible("E", qkv[0].shape[0] // 3, num_heads)
    check_option_types(masking, dropout, path)
    check_attend_options(
        masking, dropout, path, batch=x.shape[0], num_queries=x.shape[-2], num_keys=x.shape[-2]
    )
    check_flag("return_steps", return_steps)
    return unchecked_attend_heads(x, qkv, num_heads, masking, dropout, path, return_steps)


def unchecked_attend_heads(
    x: jax.Array,
    qkv: tuple[jax.Array, jax.Array | None],
    num_heads: int,
    masking: Masking = Masking(),
    dropout: AttnDropout = AttnDropout(),
    path: ComputePath = ComputePath(),
    return_steps: bool = False,
) -> tuple[jax.Array, Steps]:
    """``(context_vec, steps)`` of multi-head self-attention, up to the output projection, for
    arguments already checked (the layers'; ``dropout.rng`` is checked here).

    x ``(B, T, D)`` is projected by ``qkv``, the stacked QKV weight ``(3E, D)`` (torch layout:
    the rows of W_query, W_key, W_value) and bias ``(3E,)`` or None, in one matmul if
    ``path.fused_qkv`` (else three, as the notes' separate projections); the queries, keys and
    values are split into ``num_heads`` heads, attended by ``attend`` (``masking``, ``dropout``,
    ``path`` and ``return_steps`` are ``attend``'s) and merged back: context_vec is
    ``(B, T, E)``; steps are the projections and ``attend``'s steps, with ``return_steps``. On
    the blockwise path without steps, ``blockwise_self_attention`` projects each head inside its
    loop instead, so that no ``(B, T, 3E)`` projection is stored.
    """
    check_key(dropout.rng)
    if uses_blockwise(path.implementation, x.shape[-2]) and not return_steps:
        context_vec = unchecked_blockwise_self_attention(
            x, *qkv, num_heads=num_heads, causal=masking.causal, padding_mask=masking.padding_mask,
            dropout=dropout.rate, key=dropout.rng, attn_keep_mask=dropout.keep_mask,
            block_size=path.block_size,
        )  # fmt: skip
        return context_vec, Steps()
    queries, keys, values = unchecked_split_projection(x, *qkv, fused=path.fused_qkv)  # 3 x (B, T, E)
    context_vec, attention_steps = unchecked_attend(
        unchecked_split_heads(queries, num_heads),  # (B, N, T, H)
        unchecked_split_heads(keys, num_heads),  # (B, N, S, H)
        unchecked_split_heads(values, num_heads),  # (B, N, S, H)
        masking,
        dropout,
        path,
        return_steps,
    )  # (B, N, T, H)
    steps = Steps()
    if return_steps:
        steps = Steps(queries=queries, keys=keys, values=values, **attention_steps)
    return unchecked_merge_heads(context_vec), steps
