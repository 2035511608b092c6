"""Blockwise attention: the same result as ``scaled_dot_product_attention`` in O(T) memory.

One head at a time (a ``lax.fori_loop`` over batch x heads), queries are taken ``block_size`` at
a time and, for each query block, keys ``block_size`` at a time (two more ``lax.fori_loop``s;
blocks are read with ``dynamic_slice`` and results written in place); a running maximum ``m``, a
running sum ``l`` and a running output ``acc`` per query (the "online softmax") replace the
(T, S) weights. Only (block_size, block_size) scores of one head exist at a time, so they stay
in cache: on a 2-core CPU at B=8, T=1024 and B=1, T=4096 this core is ~1.2x faster than one
whose blocks span every head.
Key blocks that the causal mask hides entirely are skipped with ``lax.switch``, which halves the
work of causal attention and stays differentiable; the mask is applied only to blocks that hide
some key (the diagonal blocks, or every block with padding). Blocks never exceed the sequence
and are cut as equal as possible (``numpy_attn.fast.blocks.fit_block_size``); when T or S does
not divide into them, the last block is padded (by fewer rows than there are blocks) and padded
keys are hidden. Heads split from ``(B, T, E)`` projections are read and written in that
token-major layout, so that XLA copies no whole ``(B, N, T, H)`` array on the way in or out.
``blockwise_self_attention`` (the multi-head layers' blockwise path) starts from the layer input
instead: each head's queries, keys and values are projected inside the loop over heads, so no
whole projection exists. Each block's scores pass through ``jax_attn.ops.rounded``, so that the
running maximum is of the very values exponentiated.
numpy_attn's ``blockwise.py`` mirrors this module function for function (with the batch as one
axis of every block instead of a loop; what the two share is ``numpy_attn.fast.blocks``). One
difference: NumPy shifts the scores by the first key block's maximum and does a block again only
when its weights show that shift is wrong, which spares most blocks a pass NumPy makes on one
core; here every block takes the running maximum, one step per block with no branch on the data.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jax_attn.ops import draw_keep_mask, linear, rounded
from numpy_attn.fast.blocks import Heads, fit_block_size, from_token_major, head_weights, token_major
from numpy_attn.fast.options import DEFAULT_BLOCK_SIZE
from numpy_attn.ops import compute_dtype

__all__ = ["blockwise_attention", "blockwise_self_attention"]

HeadInputs = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]  # (b, n) -> q, k, v


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
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``, block by block:
    numpy_attn's ``blockwise_attention`` in JAX (its arguments and result), with ``key`` (a
    ``jax.random`` key) for dropout, whose masks are drawn per block (``fold_in(fold_in(key,
    head), block pair)``: other draws than the reference path's)."""
    heads = Heads.of_attention(
        queries, keys, values, causal=causal, padding_mask=padding_mask, dropout=dropout, random=key,
        keep_mask=attn_keep_mask, block_size=block_size,
    )  # fmt: skip
    if heads.empty:  # no block to cut: scaled_dot_product_attention's zeros
        return jnp.zeros((*queries.shape[:-1], values.shape[-1]), queries.dtype)
    major = [token_major(jnp.asarray(a)) for a in (queries, keys, values)]  # (B, T|S, N, H|Hv)

    def head_inputs(b: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        def of_head(x: jax.Array) -> jax.Array:  # (B, L, N, H) -> this head's (L, H)
            return jax.lax.dynamic_slice(x, (b, 0, n, 0), (1, x.shape[1], 1, x.shape[3]))[0, :, 0]

        return of_head(major[0]), of_head(major[1]), of_head(major[2])

    context_vec = _heads_blockwise(head_inputs, heads)  # (B, T, N, Hv)
    return from_token_major(context_vec, queries, values)  # (..., T, Hv)


def blockwise_self_attention(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None = None,
    *,
    num_heads: int,
    causal: bool = False,
    padding_mask: jax.Array | None = None,
    dropout: float | None = None,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> jax.Array:
    """Multi-head self-attention of x ``(B, T, D)`` projected by the stacked QKV ``weight``
    ``(3E, D)`` (bias ``(3E,)`` or None), block by block: numpy_attn's
    ``blockwise_self_attention`` in JAX (each head projected inside the loop). Returns:
    ``(B, T, E)``."""
    heads = Heads.of_self_attention(
        x, weight, num_heads, causal=causal, padding_mask=padding_mask, dropout=dropout, random=key,
        keep_mask=attn_keep_mask, block_size=block_size,
    )  # fmt: skip
    x, weight, bias = (None if a is None else jnp.asarray(a) for a in (x, weight, bias))  # NumPy ones too
    weights, biases = head_weights(weight, bias, num_heads)  # (N, 3H, D), (N, 3H) or None

    def head_inputs(b: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        projected = linear(x[b], weights[n], None if biases is None else biases[n])  # (T, 3H)
        return tuple(jnp.split(projected, 3, axis=-1))  # queries, keys, values: 3 x (T, H)

    context_vec = _heads_blockwise(head_inputs, heads)  # (B, T, N, H)
    return context_vec.reshape(*x.shape[:2], -1)  # (B, T, E)


def _heads_blockwise(head_inputs: HeadInputs, heads: Heads) -> jax.Array:
    """The blockwise loops over every head: ``head_inputs(b, n)`` gives head (b, n)'s queries
    ``(T, H)`` and keys and values ``(S, H)``; returns the context in token-major
    ``(B, T, N, Hv)`` layout. Everything up to the context is computed in ``compute_dtype(dtype)``
    (float32 for half precision: each head's queries, keys and values are cast as it starts),
    each query block's context cast to ``dtype`` as it is written."""
    batch, num_heads, num_queries, num_keys = heads.batch, heads.num_heads, heads.num_queries, heads.num_keys
    causal, dropout, head_dim, dtype = heads.causal, heads.dropout, heads.head_dim, heads.dtype
    dropping = heads.dropping
    query_block_size = fit_block_size(heads.block_size, num_queries)  # bq
    key_block_size = fit_block_size(heads.block_size, num_keys)  # bk (= bq when causal: T = S)
    padded_length = -(-num_queries // query_block_size) * query_block_size  # Tp
    padded_keys = -(-num_keys // key_block_size) * key_block_size  # Sp
    num_key_blocks = padded_keys // key_block_size
    hidden = jnp.broadcast_to(jnp.arange(padded_keys) >= num_keys, (batch, padded_keys))  # (B, Sp)
    if heads.padding_mask is not None:
        hidden = hidden | _pad_to_blocks(jnp.asarray(heads.padding_mask), key_block_size, -1)
    # without padding, only a causal diagonal block (or, without causality, a padded key) hides keys
    mask_every_block = heads.padding_mask is not None or (not causal and num_keys % key_block_size != 0)
    # a JAX array (a NumPy mask cannot be indexed by the loop's traced b and n)
    keep_mask = heads.keep_mask_by_head(jnp)  # (B, N, T, S) or None
    if keep_mask is not None:
        keep_mask = _pad_to_blocks(_pad_to_blocks(keep_mask, key_block_size, -1), query_block_size, -2)
    query_slice = functools.partial(jax.lax.dynamic_slice_in_dim, slice_size=query_block_size)
    key_slice = functools.partial(jax.lax.dynamic_slice_in_dim, slice_size=key_block_size)
    compute = compute_dtype(dtype)  # the input dtype, or float32 for half precision

    def after_query(qi: jax.Array, ki: jax.Array) -> jax.Array:
        """(bq, bk) bool, True where key block ``ki``'s key comes after query block ``qi``'s query."""
        key_positions = ki * key_block_size + jnp.arange(key_block_size)
        return key_positions[None, :] > (qi * query_block_size + jnp.arange(query_block_size))[:, None]

    def one_head(head: jax.Array, context_vec: jax.Array) -> jax.Array:
        b, n = head // num_heads, head % num_heads
        head_queries, head_keys, head_values = head_inputs(b, n)  # (T, H), (S, H), (S, Hv)
        # in compute (astype is no operation in float32 and float64)
        head_queries, head_keys, head_values = (
            a.astype(compute) for a in (head_queries, head_keys, head_values)
        )
        head_queries = head_queries * jnp.asarray(1 / head_queries.shape[-1] ** 0.5, compute)
        head_queries = _pad_to_blocks(head_queries, query_block_size, 0)  # (Tp, H)
        head_keys = _pad_to_blocks(head_keys, key_block_size, 0)  # (Sp, H): padded keys are hidden
        head_values = _pad_to_blocks(head_values, key_block_size, 0)  # (Sp, Hv)
        head_hidden = hidden[b]  # (Sp,)
        head_keep = None if keep_mask is None else keep_mask[b, n]  # (Tp, Sp)
        head_key = None if heads.random is None else jax.random.fold_in(heads.random, head)

        def one_query_block(qi: jax.Array, head_context: jax.Array) -> jax.Array:
            query_block = query_slice(head_queries, qi * query_block_size)  # (bq, H)

            def step(ki: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array], masked: bool):
                running_max, running_sum, acc = carry
                # rounded: the maximum is of the values exponentiated (a head of size 1 is a product)
                scores = rounded(query_block @ key_slice(head_keys, ki * key_block_size).T)  # (bq, bk)
                if masked:
                    block_hidden = key_slice(head_hidden, ki * key_block_size)[None, :]  # (1, bk)
                    if causal:
                        block_hidden = block_hidden | after_query(qi, ki)  # (bq, bk)
                    scores = jnp.where(block_hidden, -jnp.inf, scores)
                block_max = jnp.maximum(running_max, scores.max(axis=-1, keepdims=True))
                safe_max = jnp.where(block_max == -jnp.inf, 0, block_max)
                correction = jnp.exp(running_max - safe_max)
                weights = jnp.exp(scores - safe_max)  # unnormalised weights of this block
                running_sum = running_sum * correction + weights.sum(axis=-1, keepdims=True)
                if dropping:
                    if head_keep is not None:
                        query_rows = query_slice(head_keep, qi * query_block_size, axis=0)  # (bq, Sp)
                        keep = key_slice(query_rows, ki * key_block_size, axis=1)  # (bq, bk)
                    else:
                        pair_key = jax.random.fold_in(head_key, qi * num_key_blocks + ki)
                        keep = draw_keep_mask(pair_key, dropout, weights.shape)
                    weights = weights * keep / (1 - dropout)
                acc = acc * correction + weights @ key_slice(head_values, ki * key_block_size)  # (bq, Hv)
                return block_max, running_sum, acc

            def visit(ki: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]):
                if not causal:
                    return step(ki, carry, mask_every_block)
                branches = [  # key block before, on, after the diagonal
                    functools.partial(step, masked=mask_every_block),
                    functools.partial(step, masked=True),
                    lambda _, unchanged: unchanged,  # hidden entirely: skipped
                ]
                return jax.lax.switch(jnp.sign(ki - qi) + 1, branches, ki, carry)

            init = (
                jnp.full((query_block_size, 1), -jnp.inf, compute),
                jnp.zeros((query_block_size, 1), compute),
                jnp.zeros((query_block_size, head_dim), compute),
            )
            _, running_sum, acc = jax.lax.fori_loop(0, num_key_blocks, visit, init)
            result = acc * (1 / jnp.where(running_sum == 0, 1, running_sum))  # (bq, Hv), in compute
            result = result.astype(dtype)  # half precision's one cast
            return jax.lax.dynamic_update_slice_in_dim(head_context, result, qi * query_block_size, axis=0)

        head_context = jnp.zeros((padded_length, head_dim), dtype)
        num_query_blocks = padded_length // query_block_size
        head_context = jax.lax.fori_loop(0, num_query_blocks, one_query_block, head_context)  # (Tp, Hv)
        head_context = head_context[None, :num_queries, None, :]  # (1, T, 1, Hv)
        return jax.lax.dynamic_update_slice(context_vec, head_context, (b, 0, n, 0))

    context_vec = jnp.zeros((batch, num_queries, num_heads, head_dim), dtype)
    return jax.lax.fori_loop(0, batch * num_heads, one_head, context_vec)  # (B, T, N, Hv)
