"""Blockwise attention: the same result as ``scaled_dot_product_attention`` in O(T) memory.

Queries are taken ``block_size`` at a time and, for each query block, keys ``block_size`` at a
time (two ``lax.fori_loop``s; blocks are read with ``dynamic_slice`` and results written in
place, so no blocked copy of the inputs is made); a running maximum ``m``, a running sum ``l``
and a running output ``acc`` per query (the "online softmax") replace the (T, S) weights.
Key blocks that the causal mask hides entirely are skipped with ``lax.cond``, which halves the
work of causal attention and stays differentiable. T and S need not divide by ``block_size``:
the last blocks are padded, and padded keys are hidden.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from numpy_attn.validation import check_dropout, check_keep_mask

__all__ = ["DEFAULT_BLOCK_SIZE", "blockwise_attention"]

DEFAULT_BLOCK_SIZE = 512  # fastest of 256, 512, 1024 on a 2-core CPU at B=8, T=1024, d=768


def _pad_to_blocks(x: jax.Array, block_size: int, axis: int) -> jax.Array:
    """Pad ``axis`` with zeros to a multiple of ``block_size`` (no copy when it divides)."""
    axis = axis % x.ndim
    missing = -x.shape[axis] % block_size
    if missing == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, missing)
    return jnp.pad(x, widths)


def blockwise_attention(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    *,
    causal: bool = False,
    padding_mask: jax.Array | None = None,
    dropout: float | None = None,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> jax.Array:
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``, block by block.

    Shapes: queries ``(..., T, H)``, keys and values ``(..., S, H)``; returns ``(..., T, H)``.
    ``causal`` hides key s from query t when s > t (T = S); ``padding_mask`` is bool ``(B, S)``,
    True = padding (hidden), for 4-D ``(B, N, T, H)`` inputs. A query whose every key is hidden
    gets a zero output. Dropout on the (normalised) weights: ``attn_keep_mask`` (bool
    ``(..., T, S)``, True = keep) is sliced per block; ``key`` draws a mask per block
    (``fold_in(key, block pair)``: other draws than the reference path's).
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if dropout is not None:
        check_dropout("dropout", dropout)
    num_queries, num_keys = queries.shape[-2], keys.shape[-2]
    if causal and num_queries != num_keys:
        raise ValueError(f"causal blockwise attention needs T = S, got T={num_queries}, S={num_keys}")
    if attn_keep_mask is not None:
        check_keep_mask("attn_keep_mask", attn_keep_mask, (*queries.shape[:-1], num_keys))
    dropping = dropout is not None and (key is not None or attn_keep_mask is not None)
    scale = jnp.asarray(1 / queries.shape[-1] ** 0.5, queries.dtype)
    padded_queries = _pad_to_blocks(queries, block_size, -2)  # (..., Tp, H)
    padded_keys = _pad_to_blocks(keys, block_size, -2)  # (..., Sp, H)
    padded_values = _pad_to_blocks(values, block_size, -2)  # (..., Sp, Hv)
    num_query_blocks = padded_queries.shape[-2] // block_size
    num_key_blocks = padded_keys.shape[-2] // block_size
    hidden = jnp.arange(padded_keys.shape[-2]) >= num_keys  # padded keys: (Sp,)
    hidden = jnp.broadcast_to(hidden, (queries.shape[:1] if queries.ndim > 2 else (1,)) + hidden.shape)
    if padding_mask is not None:
        hidden = hidden | _pad_to_blocks(padding_mask, block_size, -1)  # (B or 1, Sp)
    keep_mask = None
    if attn_keep_mask is not None:
        keep_mask = _pad_to_blocks(_pad_to_blocks(attn_keep_mask, block_size, -1), block_size, -2)
    positions = jnp.arange(block_size)
    block = functools.partial(jax.lax.dynamic_slice_in_dim, slice_size=block_size)

    def one_query_block(qi: jax.Array, context_vec: jax.Array) -> jax.Array:
        query_block = block(padded_queries, qi * block_size, axis=-2) * scale  # (..., bq, H)

        def step(ki: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]):
            running_max, running_sum, acc = carry
            key_block = block(padded_keys, ki * block_size, axis=-2)  # (..., bk, H)
            scores = query_block @ jnp.swapaxes(key_block, -1, -2)  # (..., bq, bk)
            block_hidden = block(hidden, ki * block_size, axis=-1)  # (B or 1, bk)
            if scores.ndim == 2:  # (T, H) inputs
                block_hidden = block_hidden[0]
            else:
                block_hidden = block_hidden.reshape(block_hidden.shape[:1] + (1,) * (scores.ndim - 2) + (-1,))
            if causal:
                above = (ki * block_size + positions)[None, :] > (qi * block_size + positions)[:, None]
                block_hidden = block_hidden | above  # (..., bq, bk)
            scores = jnp.where(block_hidden, -jnp.inf, scores)
            block_max = jnp.maximum(running_max, scores.max(axis=-1, keepdims=True))
            safe_max = jnp.where(block_max == -jnp.inf, 0, block_max)
            correction = jnp.exp(running_max - safe_max)
            weights = jnp.exp(scores - safe_max)  # unnormalised weights of this block
            running_sum = running_sum * correction + weights.sum(axis=-1, keepdims=True)
            if dropping:
                if keep_mask is not None:
                    rows = block(keep_mask, qi * block_size, axis=-2)
                    keep = block(rows, ki * block_size, axis=-1)
                else:
                    pair_key = jax.random.fold_in(key, qi * num_key_blocks + ki)
                    keep = jax.random.bernoulli(pair_key, 1 - dropout, weights.shape)
                weights = weights * keep / (1 - dropout)
            value_block = block(padded_values, ki * block_size, axis=-2)  # (..., bk, Hv)
            acc = acc * correction + weights @ value_block
            return block_max, running_sum, acc

        def maybe_step(ki: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]):
            if not causal:
                return step(ki, carry)
            return jax.lax.cond(ki <= qi, step, lambda _, c: c, ki, carry)  # skip hidden blocks

        stats_shape = (*query_block.shape[:-1], 1)
        init = (
            jnp.full(stats_shape, -jnp.inf, queries.dtype),
            jnp.zeros(stats_shape, queries.dtype),
            jnp.zeros(query_block.shape[:-1] + values.shape[-1:], queries.dtype),
        )
        _, running_sum, acc = jax.lax.fori_loop(0, num_key_blocks, maybe_step, init)
        result = acc * (1 / jnp.where(running_sum == 0, 1, running_sum))
        return jax.lax.dynamic_update_slice_in_dim(context_vec, result, qi * block_size, axis=-2)

    context_vec = jnp.zeros(padded_queries.shape[:-1] + values.shape[-1:], queries.dtype)
    context_vec = jax.lax.fori_loop(0, num_query_blocks, one_query_block, context_vec)
    return context_vec[..., :num_queries, :]
