"""Blockwise attention in JAX: ``scaled_dot_product_attention``'s result in O(T) memory.

One head at a time (a ``lax.fori_loop`` over batch x heads: a block's scores stay in cache), queries
and keys ``block_size`` at a time (two more ``fori_loop``s); a running maximum, sum and output per
query (the online softmax) replace the (T, S) weights. Key blocks the causal mask hides entirely are
skipped by ``lax.switch``; the mask is applied only to blocks that hide a key; a last block that
does not fill is padded, its keys hidden. Scores pass through ``jax_attn.ops.rounded``, so the
maximum is of the values exponentiated. numpy_attn's ``blockwise.py`` mirrors this module (with
the batch in each block, and a shift kept while it fits where this takes the running maximum)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jax_attn.ops import draw_keep_mask, linear, rounded
from numpy_attn.fast.blocks import Heads, fit_block_size, from_token_major, head_weights, token_major
from numpy_attn.fast.options import DEFAULT_BLOCK_SIZE
from numpy_attn.ops import compute_dtype

Carry = tuple[jax.Array, jax.Array, jax.Array]  # the online softmax's running maximum, sum and output
HeadInputs = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]  # (b, n) -> q, k, v


def blockwise_attention(
    queries: jax.Array, keys: jax.Array, values: jax.Array, *, causal: bool = False,
    padding_mask: jax.Array | None = None, dropout: float | None = None, key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
) -> jax.Array:  # fmt: skip
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``, block by block:
    numpy_attn's ``blockwise_attention`` (its arguments and result) with ``key``, a ``jax.random``
    key, for dropout drawn per block (``fold_in(fold_in(key, head), block pair)``)."""
    heads = Heads.of_attention(
        queries, keys, values, causal, padding_mask, dropout, key, attn_keep_mask, block_size
    )
    if heads.empty:  # no block to cut: scaled_dot_product_attention's zeros
        return jnp.zeros((*queries.shape[:-1], values.shape[-1]), queries.dtype)
    major = [token_major(jnp.asarray(a)) for a in (queries, keys, values)]  # (B, T|S, N, H|Hv)
    context_vec = _heads_blockwise(lambda b, n: tuple(a[b, :, n] for a in major), heads)  # (B, T, N, Hv)
    return from_token_major(context_vec, queries)  # (..., T, Hv)


def blockwise_self_attention(
    x: jax.Array, weight: jax.Array, bias: jax.Array | None = None, *, num_heads: int,
    causal: bool = False, padding_mask: jax.Array | None = None, dropout: float | None = None,
    key: jax.Array | None = None, attn_keep_mask: jax.Array | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> jax.Array:  # fmt: skip
    """numpy_attn's ``blockwise_self_attention`` in JAX: x ``(B, T, D)`` projected by the stacked
    QKV ``weight (3E, D)`` and ``bias (3E,)`` or None, each head inside the loop; ``(B, T, E)``."""
    heads = Heads.of_self_attention(
        x, weight, num_heads, causal, padding_mask, dropout, key, attn_keep_mask, block_size
    )
    x, weight, bias = (None if a is None else jnp.asarray(a) for a in (x, weight, bias))  # NumPy ones too
    weights, biases = head_weights(weight, bias, num_heads)  # (N, 3H, D), (N, 3H) or None

    def head_inputs(b: jax.Array, n: jax.Array) -> tuple[jax.Array, ...]:
        projected = linear(x[b], weights[n], None if biases is None else biases[n])  # (T, 3H)
        return tuple(jnp.split(projected, 3, axis=-1))  # queries, keys, values: 3 x (T, H)

    context_vec = _heads_blockwise(head_inputs, heads)  # (B, T, N, H)
    return context_vec.reshape(*x.shape[:2], -1)  # (B, T, E)


def online_softmax_step(
    carry: Carry, scores: jax.Array, values: jax.Array, keep: jax.Array | None = None, rate: float = 0
) -> Carry:
    """One key block of the online softmax. ``carry``: each query's running maximum and sum
    ``(..., T, 1)`` and output ``(..., T, Hv)``; scores ``(..., T, bk)``, hidden ones at -inf;
    values ``(..., bk, Hv)``; the weights dropped where ``keep`` is False (the sums are of all)."""
    running_max, running_sum, acc = carry
    block_max = jnp.maximum(running_max, scores.max(axis=-1, keepdims=True))
    safe_max = jnp.where(block_max == -jnp.inf, 0, block_max)
    correction = jnp.exp(running_max - safe_max)
    weights = jnp.exp(scores - safe_max)  # unnormalised weights of this block
    running_sum = running_sum * correction + weights.sum(axis=-1, keepdims=True)
    if keep is not None:
        weights = weights * keep / (1 - rate)
    return block_max, running_sum, acc * correction + weights @ values  # (..., T, Hv)


def _pad_to_blocks(x: jax.Array, block_size: int, axis: int) -> jax.Array:
    """``x`` with ``axis`` padded with zeros to a multiple of ``block_size`` (no copy when it divides)."""
    if x.shape[axis] % block_size == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, -x.shape[axis] % block_size)
    return jnp.pad(x, widths)


def _heads_blockwise(head_inputs: HeadInputs, heads: Heads) -> jax.Array:
    """The context ``(B, T, N, Hv)`` of every head, ``head_inputs(b, n)`` giving head (b, n)'s
    queries ``(T, H)``, keys and values ``(S, H)``, computed in ``compute_dtype`` (float32 for half
    precision), each query block cast to the heads' dtype as it is written."""
    num_heads, num_queries, num_keys = heads.num_heads, heads.num_queries, heads.num_keys
    causal, compute = heads.causal, compute_dtype(heads.dtype)  # the input dtype, or float32 for half
    bq, bk = fit_block_size(heads.block_size, num_queries), fit_block_size(heads.block_size, num_keys)
    padded_queries, padded_keys = -(-num_queries // bq) * bq, -(-num_keys // bk) * bk  # Tp, Sp
    hidden = jnp.broadcast_to(jnp.arange(padded_keys) >= num_keys, (heads.batch, padded_keys))  # (B, Sp)
    if heads.padding_mask is not None:
        hidden = hidden | _pad_to_blocks(jnp.asarray(heads.padding_mask), bk, 1)
    # without padding, only a causal diagonal block (or, without causality, a padded key) hides keys
    mask_every_block = heads.padding_mask is not None or (not causal and num_keys % bk != 0)
    keep_mask = heads.keep_mask_by_head(jnp)  # (B, N, T, S) or None: indexed by the traced b and n
    if keep_mask is not None:
        keep_mask = _pad_to_blocks(_pad_to_blocks(keep_mask, bk, 3), bq, 2)  # (B, N, Tp, Sp)
    query_slice = functools.partial(jax.lax.dynamic_slice_in_dim, slice_size=bq)
    key_slice = functools.partial(jax.lax.dynamic_slice_in_dim, slice_size=bk)

    def one_head(head: jax.Array, context_vec: jax.Array) -> jax.Array:
        b, n = head // num_heads, head % num_heads
        head_queries, head_keys, head_values = (a.astype(compute) for a in head_inputs(b, n))  # (T|S, H|Hv)
        scale = jnp.asarray(1 / head_queries.shape[-1] ** 0.5, compute)
        head_queries = _pad_to_blocks(head_queries * scale, bq, 0)  # (Tp, H)
        head_keys, head_values = (_pad_to_blocks(a, bk, 0) for a in (head_keys, head_values))  # (Sp, H|Hv)
        head_keep = None if keep_mask is None else keep_mask[b, n]  # (Tp, Sp)
        head_key = None if heads.random is None else jax.random.fold_in(heads.random, head)

        def one_query_block(qi: jax.Array, head_context: jax.Array) -> jax.Array:
            query_block = query_slice(head_queries, qi * bq)  # (bq, H)

            def step(ki: jax.Array, carry: Carry, masked: bool) -> Carry:
                scores = rounded(query_block @ key_slice(head_keys, ki * bk).T)  # (bq, bk)
                if masked:
                    block_hidden = key_slice(hidden[b], ki * bk)[None, :]  # (1, bk)
                    if causal:  # keys after the query
                        after = ki * bk + jnp.arange(bk)[None, :] > qi * bq + jnp.arange(bq)[:, None]
                        block_hidden = block_hidden | after  # (bq, bk)
                    scores = jnp.where(block_hidden, -jnp.inf, scores)
                keep = None  # (bq, bk), True = keep
                if heads.dropping and head_keep is not None:
                    keep = key_slice(query_slice(head_keep, qi * bq, axis=0), ki * bk, axis=1)
                elif heads.dropping:
                    pair_key = jax.random.fold_in(head_key, qi * (padded_keys // bk) + ki)
                    keep = draw_keep_mask(pair_key, heads.dropout, scores.shape)
                value_block = key_slice(head_values, ki * bk)  # (bk, Hv)
                return online_softmax_step(carry, scores, value_block, keep, heads.dropout)

            def visit(ki: jax.Array, carry: Carry) -> Carry:
                if not causal:
                    return step(ki, carry, mask_every_block)
                branches = [  # key block before, on, after the diagonal (hidden entirely: skipped)
                    functools.partial(step, masked=mask_every_block),
                    functools.partial(step, masked=True),
                    lambda _, unchanged: unchanged,
                ]
                return jax.lax.switch(jnp.sign(ki - qi) + 1, branches, ki, carry)

            init = (
                jnp.full((bq, 1), -jnp.inf, compute),
                jnp.zeros((bq, 1), compute),
                jnp.zeros((bq, heads.head_dim), compute),
            )
            _, running_sum, acc = jax.lax.fori_loop(0, padded_keys // bk, visit, init)
            result = (acc * (1 / jnp.where(running_sum == 0, 1, running_sum))).astype(heads.dtype)  # one cast
            return jax.lax.dynamic_update_slice_in_dim(head_context, result, qi * bq, axis=0)

        head_context = jnp.zeros((padded_queries, heads.head_dim), heads.dtype)
        head_context = jax.lax.fori_loop(0, padded_queries // bq, one_query_block, head_context)  # (Tp, Hv)
        head_context = head_context[None, :num_queries, None, :]  # (1, T, 1, Hv)
        return jax.lax.dynamic_update_slice(context_vec, head_context, (b, 0, n, 0))

    context_vec = jnp.zeros((heads.batch, num_queries, num_heads, heads.head_dim), heads.dtype)
    return jax.lax.fori_loop(0, heads.batch * num_heads, one_head, context_vec)  # (B, T, N, Hv)
