"""Blockwise attention in NumPy: ``scaled_dot_product_attention``'s result in O(T) memory.

One head at a time (or on threads: ``numpy_attn.parallel_heads``), the batch an axis of every block,
queries and keys ``block_size // isqrt(B)`` at a time; a running sum and output per query replace
the (T, S) weights; key blocks the causal mask hides entirely are skipped. Each query's scores are
lowered by a shift before ``exp``: its first key block's maximum, kept while later blocks' weights
show it fits (``_needs_new_shift``), else the running maximum (the online softmax's step, and its
overflow bound); most blocks are spared a pass. A column of ones after each head's keys and values
makes ``queries @ keys^T`` subtract the shift (held in the query block's last column) and
``weights @ values`` sum the weights' rows (benchmarks/README.md). jax_attn's ``blockwise.py``
mirrors this module; what the two share is ``numpy_attn.fast.blocks``."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy.random import Generator

from numpy_attn.fast.blocks import Heads, fit_block_size, from_token_major, head_weights, token_major
from numpy_attn.fast.options import DEFAULT_BLOCK_SIZE
from numpy_attn.fast.threads import head_threads
from numpy_attn.ops import causal_mask, compute_dtype, draw_keep_mask, linear

HeadInputs = Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]]  # head n -> its queries, keys, values


def block_sides(block_size: int, batch: int, num_queries: int, num_keys: int) -> tuple[int, int]:
    """``(bq, bk)``, the query and key block sizes: ``block_size // isqrt(B)`` fitted to the
    sequences (``fit_block_size``), so that a block's B x bq x bk scores stay near block_size^2."""
    side = max(1, block_size // math.isqrt(batch))
    return fit_block_size(side, num_queries), fit_block_size(side, num_keys)


def blockwise_attention(
    queries: np.ndarray, keys: np.ndarray, values: np.ndarray, *, causal: bool = False,
    padding_mask: np.ndarray | None = None, dropout: float | None = None, rng: Generator | None = None,
    attn_keep_mask: np.ndarray | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
) -> np.ndarray:  # fmt: skip
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``, block by block.

    Args: queries ``(..., T, H)``, keys ``(..., S, H)``, values ``(..., S, Hv)`` (the same leading
        axes); causal: hide key s from query t when s > t (T = S); padding_mask bool ``(B, S)``,
        True = padding, B the queries' first axis (1 for ``(T, H)``); dropout: the probability of
        dropping a weight, with ``attn_keep_mask`` (bool ``(..., T, S)``, True = keep) or drawn per
        block from ``rng`` (other draws than the reference path's); block_size: keys per block of
        one sequence (divided by isqrt(B): ``block_sides``).
    Returns: ``(..., T, Hv)`` in the queries' dtype (half precision computed in float32); zeros for
        a query whose every key is hidden. Heads split from ``(B, T, E)`` are read and written
        token-major, so merging them is a view.
    """
    heads = Heads.of_attention(
        queries, keys, values, causal, padding_mask, dropout, rng, attn_keep_mask, block_size
    )
    if heads.empty:  # no block to cut: scaled_dot_product_attention's zeros
        return np.zeros((*queries.shape[:-1], values.shape[-1]), queries.dtype)
    major = [token_major(a) for a in (queries, keys, values)]  # (B, T, N, H), (B, S, N, H), (B, S, N, Hv)
    context_vec = _heads_blockwise(lambda n: tuple(a[:, :, n] for a in major), heads)  # (B, T, N, Hv)
    return from_token_major(context_vec, queries)  # (..., T, Hv), a view of (B, T, N, Hv)


def blockwise_self_attention(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, *, num_heads: int,
    causal: bool = False, padding_mask: np.ndarray | None = None, dropout: float | None = None,
    rng: Generator | None = None, attn_keep_mask: np.ndarray | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> np.ndarray:  # fmt: skip
    """``merge_heads(blockwise_attention(...))`` of x's projections by the stacked QKV ``weight``,
    each head projected inside the loop over heads: no ``(B, T, 3E)`` projection is ever stored.

    Args: x ``(B, T, D)``; weight ``(3E, D)``, torch's rows of W_query, W_key, W_value (note 003's
        ``Wqkv``); bias ``(3E,)`` or None; num_heads N, dividing E; the rest as
        ``blockwise_attention``'s (the keep-mask ``(B, N, T, T)``).
    Returns: the heads' context merged, ``(B, T, E)``.
    """
    heads = Heads.of_self_attention(
        x, weight, num_heads, causal, padding_mask, dropout, rng, attn_keep_mask, block_size
    )
    weights, biases = head_weights(weight, bias, num_heads)  # (N, 3H, D), (N, 3H) or None

    def head_inputs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        projected = linear(x, weights[n], None if biases is None else biases[n])  # (B, T, 3H)
        return tuple(np.split(projected, 3, axis=-1))  # queries, keys, values: 3 x (B, T, H)

    context_vec = _heads_blockwise(head_inputs, heads)  # (B, T, N, H)
    return context_vec.reshape(*x.shape[:2], -1)  # (B, T, E)


def _heads_blockwise(head_inputs: HeadInputs, heads: Heads) -> np.ndarray:
    """The context ``(B, T, N, Hv)`` of every head, ``head_inputs(n)`` giving head n's queries
    ``(B, T, H)``, keys and values ``(B, S, H)``, computed in ``compute_dtype`` (float32 for half
    precision), cast to the heads' dtype as it is written."""
    batch, num_queries, num_keys, causal = heads.batch, heads.num_queries, heads.num_keys, heads.causal
    rate = float(heads.dropout) if heads.dropping else None  # a NumPy scalar would set the dtype
    bq, bk = block_sides(heads.block_size, batch, num_queries, num_keys)
    hidden = None if heads.padding_mask is None else heads.padding_mask[:, None, :]  # (B, 1, S)
    keep_mask = heads.keep_mask_by_head(np)  # (B, N, T, S) or None
    context_vec = np.empty((batch, num_queries, heads.num_heads, heads.head_dim), heads.dtype)
    compute = compute_dtype(heads.dtype)  # the input dtype, or float32 for half precision
    ones = np.ones((batch, num_keys, 1), compute)

    @np.errstate(over="ignore", invalid="ignore")  # exp above a stale shift: a block to redo, no warning
    def attend_head(n: int) -> None:
        head_queries, head_keys, head_values = head_inputs(n)  # (B, T, H), (B, S, H), (B, S, Hv)
        keys_and_ones = np.concatenate([head_keys, ones], axis=-1, dtype=compute)  # (B, S, H + 1)
        values_and_ones = np.concatenate([head_values, ones], axis=-1, dtype=compute)  # (B, S, Hv + 1)
        scale = np.asarray(1 / head_queries.shape[-1] ** 0.5, compute)
        for q0 in range(0, num_queries, bq):
            q1 = min(q0 + bq, num_queries)
            query_block = np.zeros((batch, q1 - q0, head_queries.shape[-1] + 1), compute)  # queries, -shift
            np.multiply(head_queries[:, q0:q1], scale, out=query_block[..., :-1], dtype=compute)
            acc = np.zeros((batch, q1 - q0, heads.head_dim + 1), compute)  # weighted values, running sum
            shift = None  # (B, bq, 1): what each query's scores are lowered by
            for k0 in range(0, q1 if causal else num_keys, bk):  # later keys are all hidden
                k1 = min(k0 + bk, num_keys)
                block_hidden = causal_mask(q1 - q0, k1 - k0, q0 - k0) if causal and k1 - 1 > q0 else None
                if hidden is not None:  # (B, 1, bk) padding, with the diagonal's (bq, bk)
                    padding = hidden[..., k0:k1]
                    block_hidden = padding if block_hidden is None else block_hidden | padding
                keep = None  # (B, bq, bk), True = keep
                if rate is not None and keep_mask is not None:
                    keep = keep_mask[:, n, q0:q1, k0:k1]
                elif rate is not None:
                    keep = draw_keep_mask(heads.random, rate, (batch, q1 - q0, k1 - k0))
                key_block = keys_and_ones[:, k0:k1].swapaxes(-1, -2)  # (B, H + 1, bk)
                value_block = values_and_ones[:, k0:k1]  # (B, bk, Hv + 1)
                scores = _block_scores(query_block, key_block, block_hidden)  # (B, bq, bk), - shift
                if shift is None:  # the first key block: lowered by each query's maximum
                    shift = _safe_max(scores)
                    weights = np.exp(np.subtract(scores, shift, out=scores), out=scores)
                    query_block[..., -1:] = -shift  # the next blocks' scores come shifted
                else:
                    weights = np.exp(scores, out=scores)
                product = _weighted_values(weights, value_block, keep, rate)
                if _needs_new_shift(product[..., -1:], acc[..., -1:], bk):  # by the running maximum
                    unseen = acc[..., -1:] == 0  # queries that saw no key yet
                    query_block[..., -1:] = 0
                    scores = _block_scores(query_block, key_block, block_hidden)  # not shifted
                    new_shift = _safe_max(scores, np.where(unseen, -np.inf, shift))
                    acc *= np.exp(np.where(unseen, 0, shift - new_shift))  # <= 1
                    shift, query_block[..., -1:] = new_shift, -new_shift
                    weights = np.exp(np.subtract(scores, shift, out=scores), out=scores)
                    product = _weighted_values(weights, value_block, keep, rate)
                acc += product
            running_sum = acc[..., -1:]  # a query that saw no key keeps a zero output
            context_vec[:, q0:q1, n] = acc[..., :-1] * (1 / np.where(running_sum == 0, 1, running_sum))

    workers, one_thread_blas, min_scores = head_threads()
    workers = min(workers, heads.num_heads)
    few_scores = batch * num_queries * num_keys < min_scores  # faster on one thread
    if workers == 1 or few_scores or (rate is not None and heads.random is not None):  # draws in order
        for n in range(heads.num_heads):
            attend_head(n)
    else:  # a head per thread, each making its matmuls on one core
        with one_thread_blas(), ThreadPoolExecutor(workers) as pool:
            list(pool.map(attend_head, range(heads.num_heads)))  # list(): raises what a head raised
    return context_vec


def _block_scores(query_block: np.ndarray, key_block: np.ndarray, hidden: np.ndarray | None) -> np.ndarray:
    """``(B, bq, bk)`` scores of a (scaled) query block against a key block, hidden ones at -inf."""
    scores = query_block @ key_block  # (B, bq, bk)
    if hidden is not None:
        np.copyto(scores, -np.inf, where=hidden)
    return scores


def _safe_max(scores: np.ndarray, shift: np.ndarray | None = None) -> np.ndarray:
    """``(B, bq, 1)``: each row's maximum (at least ``shift``'s), 0 where every score is hidden."""
    row_max = scores.max(axis=-1, keepdims=True)
    if shift is not None:
        row_max = np.maximum(shift, row_max)
    return np.where(row_max == -np.inf, 0, row_max)


def _weighted_values(
    weights: np.ndarray, values_and_ones: np.ndarray, keep: np.ndarray | None, rate: float | None
) -> np.ndarray:
    """``(B, bq, Hv + 1)``: the weights, dropped where ``keep`` is False (the rest scaled by
    ``1 / (1 - rate)``), @ the values, then the weights' row sums before dropout (without dropout
    one matmul gives both, the sums from the column of ones)."""
    if keep is None:
        return weights @ values_and_ones
    product = (weights * keep / (1 - rate)) @ values_and_ones
    product[..., -1:] = weights.sum(axis=-1, keepdims=True)
    return product


def _needs_new_shift(block_sum: np.ndarray, running_sum: np.ndarray, key_block_size: int) -> bool:
    """Whether some query needs the block again with a new shift: its weights sum above
    ``key_block_size`` (a score above the shift; under the running maximum no weight exceeds 1, so
    the sums and the overflow bound stay the online softmax's), or NaN, or below 1 for a query that
    had seen no key (a shift above every score it sees)."""
    return not np.all((block_sum <= key_block_size) & ((running_sum > 0) | (block_sum >= 1)))
