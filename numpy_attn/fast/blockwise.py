"""Blockwise attention: the same result as ``scaled_dot_product_attention`` in O(T) memory.

One head at a time (a loop over heads; the batch is one axis of every block), queries are taken
``side`` at a time and, for each query block, keys ``side`` at a time, where ``side`` is
``block_size // isqrt(B)``, so that a block holds about block_size^2 scores whatever the batch;
a running sum ``l`` and a running output ``acc`` per query replace the (T, S) weights, and key
blocks that the causal mask hides entirely are skipped, which halves the work of causal
attention. Only (B, side, side) scores exist at any time. Blocks never exceed the sequence and
are cut as equal as possible (``numpy_attn.fast.blocks.fit_block_size``).

The scores are lowered by a per-query ``shift`` before ``exp``, as softmax lowers them by their
maximum. The online softmax shifts by the running maximum, which costs a maximum over every block
and a rescaling of ``l`` and ``acc`` whenever it grows. Here the shift is the first key block's
maximum and stays, and a block is done again with the running maximum as shift (the online
softmax's step) only when its weights tell that the shift is wrong for some query: they sum
above the block's width (a score above the shift; with the running maximum no weight exceeds
1, so the sums and the overflow bound stay the online softmax's), or below 1 for a query that
had seen no key, or NaN. On attention scores that happens rarely, so most blocks make one pass
over their scores fewer (NumPy runs every pass on one core); the result equals the online
softmax's up to rounding, since both are the same softmax under another shift. For the same
reason neither the shift nor the running sum is a pass of its own: each head's keys and values
get a column of ones, so the queries' matmul with the keys also subtracts the shift (held in the
query block's last column: one more term of the matmul's sum) and the weights' matmul with
the values also sums the weights' rows, into the last column of ``acc`` (with dropout, which the
sums must not see, they are summed apart).
Heads split from ``(B, T, E)`` projections are read and written in that token-major layout, so
that merging the heads back is a view, not a copy. ``blockwise_self_attention`` (the
multi-head layers' blockwise path) starts from the layer input instead: each head's queries,
keys and values are projected inside the loop over heads, so no whole projection exists.
Heads run one after another, or on threads within ``numpy_attn.parallel_heads`` (each head's
passes on one core, BLAS limited to one thread per call by the caller's context manager; the
bits of one head after another under the same BLAS).
jax_attn's ``blockwise.py`` mirrors this module function for function; what the two share (the
heads and their layout, the blocks' sizes) is ``numpy_attn.fast.blocks``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from numpy_attn.fast.blocks import Heads, fit_block_size, from_token_major, head_weights, token_major
from numpy_attn.fast.options import DEFAULT_BLOCK_SIZE
from numpy_attn.fast.threads import head_threads
from numpy_attn.ops import causal_mask, compute_dtype, draw_keep_mask, linear

__all__ = ["block_sides", "blockwise_attention", "blockwise_self_attention"]

HeadInputs = Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]]  # head n -> its queries, keys, values


def block_sides(block_size: int, batch: int, num_queries: int, num_keys: int) -> tuple[int, int]:
    """``(bq, bk)``: the query and key block sizes of numpy_attn's loops. The batch is an axis of
    every block, so the sides are ``block_size // isqrt(B)``, fitted to the sequences
    (``fit_block_size``): a block's B x bq x bk scores stay near block_size^2 whatever the batch
    (B = 8, T = 1024: sides of 256 instead of 512 took 0.89-0.91 of the time)."""
    side = max(1, block_size // math.isqrt(batch))
    return fit_block_size(side, num_queries), fit_block_size(side, num_keys)


def blockwise_attention(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    *,
    causal: bool = False,
    padding_mask: np.ndarray | None = None,
    dropout: float | None = None,
    rng: np.random.Generator | None = None,
    attn_keep_mask: np.ndarray | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> np.ndarray:
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``, block by block.

    Args:
        queries: ``(..., T, H)``; keys and values ``(..., S, H)`` and ``(..., S, Hv)``, with the
            queries' leading axes.
        causal: hide key s from query t when s > t (T = S).
        padding_mask: bool ``(B, S)``, True = padding (hidden); B the queries' first axis (1 for
            ``(T, H)`` queries).
        dropout: the probability of dropping a normalised weight, with ``attn_keep_mask`` (bool
            ``(..., T, S)``, True = keep) or, drawn per block from ``rng``, other draws than the
            reference path's; None: no dropout.
        block_size: keys per block of one sequence (divided by isqrt(B): ``block_sides``).
    Returns:
        ``(..., T, Hv)`` in the queries' dtype (half precision is computed in float32 and cast
        once). A query whose every key is hidden gets zeros.
    """
    heads = Heads.of_attention(
        queries, keys, values, causal=causal, padding_mask=padding_mask, dropout=dropout, random=rng,
        keep_mask=attn_keep_mask, block_size=block_size,
    )  # fmt: skip
    if heads.empty:  # no block to cut: scaled_dot_product_attention's zeros
        return np.zeros((*queries.shape[:-1], values.shape[-1]), queries.dtype)
    major = [token_major(a) for a in (queries, keys, values)]  # (B, T, N, H), (B, S, N, H), (B, S, N, Hv)
    context_vec = _heads_blockwise(lambda n: tuple(a[:, :, n] for a in major), heads)  # (B, T, N, Hv)
    return from_token_major(context_vec, queries, values)  # (..., T, Hv), a view of (B, T, N, Hv)


def blockwise_self_attention(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    num_heads: int,
    causal: bool = False,
    padding_mask: np.ndarray | None = None,
    dropout: float | None = None,
    rng: np.random.Generator | None = None,
    attn_keep_mask: np.ndarray | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> np.ndarray:
    """Multi-head self-attention of x projected by the stacked QKV ``weight``, block by block:
    ``merge_heads(blockwise_attention(...))`` of the split projections, but each head is
    projected inside the loop over heads, ``(B, T, 3H)`` at a time, so that no ``(B, T, 3E)``
    projection is ever stored.

    Args:
        x: ``(B, T, D)``.
        weight: ``(3E, D)`` in torch's layout (the rows of W_query, W_key, W_value: note 003's
            ``Wqkv``); bias ``(3E,)`` or None.
        num_heads: N, dividing E; the rest as ``blockwise_attention``'s (``attn_keep_mask``
            ``(B, N, T, T)``).
    Returns:
        The heads' context merged, ``(B, T, E)``.
    """
    heads = Heads.of_self_attention(
        x, weight, num_heads, causal=causal, padding_mask=padding_mask, dropout=dropout, random=rng,
        keep_mask=attn_keep_mask, block_size=block_size,
    )  # fmt: skip
    weights, biases = head_weights(weight, bias, num_heads)  # (N, 3H, D), (N, 3H) or None

    def head_inputs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        projected = linear(x, weights[n], None if biases is None else biases[n])  # (B, T, 3H)
        return tuple(np.split(projected, 3, axis=-1))  # queries, keys, values: 3 x (B, T, H)

    context_vec = _heads_blockwise(head_inputs, heads)  # (B, T, N, H)
    return context_vec.reshape(*x.shape[:2], -1)  # (B, T, E)


def _heads_blockwise(head_inputs: HeadInputs, heads: Heads) -> np.ndarray:
    """The blockwise loops over every head: ``head_inputs(n)`` gives head n's queries
    ``(B, T, H)`` and keys and values ``(B, S, H)``; returns the context in token-major
    ``(B, T, N, Hv)`` layout. Everything up to the context is computed in ``compute_dtype(dtype)``
    (float32 for half precision: the keys and values are cast with their column of ones, the
    queries as they are scaled), the context cast to ``dtype`` as it is written."""
    batch, num_heads, num_queries, num_keys = heads.batch, heads.num_heads, heads.num_queries, heads.num_keys
    causal, dropout, rng = heads.causal, heads.dropout, heads.random
    dropping = heads.dropping
    if dropping:
        dropout = float(dropout)  # a NumPy scalar would set the tiles' dtype, as in dropout
    query_block_size, key_block_size = block_sides(heads.block_size, batch, num_queries, num_keys)  # bq, bk
    hidden = None if heads.padding_mask is None else heads.padding_mask[:, None, :]  # (B, 1, S)
    keep_mask = heads.keep_mask_by_head(np)  # (B, N, T, S) or None
    context_vec = np.empty((batch, num_queries, num_heads, heads.head_dim), heads.dtype)
    compute = compute_dtype(heads.dtype)  # the input dtype, or float32 for half precision
    ones = np.ones((batch, num_keys, 1), compute)

    # a score above a block's stale shift overflows exp to inf (and inf x 0 in the weights' matmul
    # gives NaN): the signal that the block is done again with a new shift, not a warning's cause
    @np.errstate(over="ignore", invalid="ignore")
    def attend_head(n: int) -> None:
        head_queries, head_keys, head_values = head_inputs(n)  # (B, T, H), (B, S, H), (B, S, Hv)
        # a column of ones after the keys and the values: a query block whose last column holds
        # -shift gets its scores lowered by the shift from the matmul, and weights @ values also
        # sums the weights' rows
        keys_and_ones = np.concatenate([head_keys, ones], axis=-1, dtype=compute)  # (B, S, H + 1)
        values_and_ones = np.concatenate([head_values, ones], axis=-1, dtype=compute)  # (B, S, Hv + 1)
        scale = np.asarray(1 / head_queries.shape[-1] ** 0.5, compute)
        for q0 in range(0, num_queries, query_block_size):
            q1 = min(q0 + query_block_size, num_queries)
            # (B, bq, H + 1): the scaled queries and -shift, 0 until the shift is known
            query_block = np.zeros((batch, q1 - q0, head_queries.shape[-1] + 1), compute)
            np.multiply(head_queries[:, q0:q1], scale, out=query_block[..., :-1], dtype=compute)
            shift = None  # (B, bq, 1): what each query's scores are lowered by before exp
            # (B, bq, Hv + 1): the weighted values and, in the last column, the running sum l
            acc = np.zeros((batch, q1 - q0, heads.head_dim + 1), dtype=compute)
            last_key = q1 if causal else num_keys  # keys after the block's last query are all hidden
            for k0 in range(0, last_key, key_block_size):
                k1 = min(k0 + key_block_size, num_keys)
                block_hidden = None
                if causal and k1 - 1 > q0:  # a block on the diagonal
                    block_hidden = causal_mask(q1 - q0, k1 - k0, q0 - k0)  # (bq, bk)
                if hidden is not None:
                    block_padding = hidden[..., k0:k1]  # (B, 1, bk)
                    block_hidden = block_padding if block_hidden is None else block_hidden | block_padding
                keep = None  # (B, bq, bk), True = keep
                if dropping:
                    keep = (
                        keep_mask[:, n, q0:q1, k0:k1]
                        if keep_mask is not None
                        else draw_keep_mask(rng, dropout, (batch, q1 - q0, k1 - k0))
                    )
                key_block = np.swapaxes(keys_and_ones[:, k0:k1], -1, -2)  # (B, H + 1, bk)
                block_values = values_and_ones[:, k0:k1]  # (B, bk, Hv + 1)
                scores = _block_scores(query_block, key_block, block_hidden)  # (B, bq, bk), - shift
                if shift is None:  # the first key block: each query's scores lowered by their maximum
                    shift = _safe_max(scores)
                    weights = _shifted_exp(scores, shift)
                    query_block[..., -1:] = -shift  # the next blocks' scores come shifted
                else:
                    weights = np.exp(scores, out=scores)
                product = _weighted_values(weights, block_values, keep, dropout)
                if _needs_new_shift(product[..., -1:], acc[..., -1:], key_block_size):
                    # the scores rose above the shift, or nothing was seen yet: shift by the running
                    # maximum (the online softmax's step), rescaling what was summed so far
                    running_sum = acc[..., -1:]
                    query_block[..., -1:] = 0
                    scores = _block_scores(query_block, key_block, block_hidden)  # not shifted
                    new_shift = _safe_max(scores, np.where(running_sum == 0, -np.inf, shift))
                    acc *= np.exp(np.where(running_sum == 0, 0, shift - new_shift))  # <= 1
                    shift = new_shift
                    query_block[..., -1:] = -shift
                    product = _weighted_values(_shifted_exp(scores, shift), block_values, keep, dropout)
                acc += product
            # the reciprocal of the sum, as in softmax; a query that saw no key keeps a zero output
            # (written in the input dtype: half precision's one cast)
            running_sum = acc[..., -1:]
            context_vec[:, q0:q1, n] = acc[..., :-1] * (1 / np.where(running_sum == 0, 1, running_sum))

    workers, one_thread_blas, min_scores = head_threads()
    workers = min(workers, num_heads)
    few_scores = batch * num_queries * num_keys < min_scores  # faster on one thread
    if workers == 1 or few_scores or (dropping and rng is not None):  # rng: draws in order
        for n in range(num_heads):
            attend_head(n)
    else:  # parallel_heads: a head per thread, each making its matmuls on one core
        with one_thread_blas(), ThreadPoolExecutor(workers) as pool:
            list(pool.map(attend_head, range(num_heads)))  # list(): raises what a head raised
    return context_vec


def _block_scores(
    query_block: np.ndarray, key_block: np.ndarray, block_hidden: np.ndarray | None
) -> np.ndarray:
    """``(B, bq, bk)`` scores of a (scaled) query block against a key block, hidden ones at -inf."""
    scores = query_block @ key_block  # (B, bq, bk)
    if block_hidden is not None:
        np.copyto(scores, -np.inf, where=block_hidden)
    return scores


def _safe_max(scores: np.ndarray, shift: np.ndarray | None = None) -> np.ndarray:
    """``(B, bq, 1)``: each row's maximum (at least ``shift``'s), 0 where every score is hidden."""
    row_max = scores.max(axis=-1, keepdims=True)
    if shift is not None:
        row_max = np.maximum(shift, row_max)
    return np.where(row_max == -np.inf, 0, row_max)


def _shifted_exp(scores: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``exp(scores - shift)``, in place."""
    return np.exp(np.subtract(scores, shift, out=scores), out=scores)


def _weighted_values(
    weights: np.ndarray, values_and_ones: np.ndarray, keep: np.ndarray | None, dropout: float | None
) -> np.ndarray:
    """``(B, bq, Hv + 1)``: ``weights @ values``, the weights dropped where ``keep`` is False (and
    the rest scaled by ``1 / (1 - dropout)``), then the weights' row sums, taken before dropout.
    Without dropout one matmul gives both, the sums from the column of ones."""
    if keep is None:
        return weights @ values_and_ones
    product = (weights * keep / (1 - dropout)) @ values_and_ones
    product[..., -1:] = weights.sum(axis=-1, keepdims=True)
    return product


def _needs_new_shift(block_sum: np.ndarray, running_sum: np.ndarray, key_block_size: int) -> bool:
    """Whether some query needs the block again with a new shift: its weights sum above
    ``key_block_size`` (a score above the shift: with the running maximum as shift, every weight
    is at most 1, so the sums, and the overflow bound, stay those of the online softmax), or
    NaN, or below 1 for a query that had seen no key (a shift above every score it sees)."""
    return not np.all((block_sum <= key_block_size) & ((running_sum > 0) | (block_sum >= 1)))
