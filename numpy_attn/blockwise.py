"""Blockwise attention: the same result as ``scaled_dot_product_attention`` in O(T) memory.

Queries are taken ``block_size`` at a time and keys ``block_size`` at a time; a running maximum
``m``, a running sum ``l`` and a running output ``acc`` per query (the "online softmax") replace
the (T, S) weight matrix, and key blocks that the causal mask hides entirely are skipped, which
halves the work of causal attention. Only (block_size, block_size) scores exist at any time.
``blockwise_self_attention`` runs it one head at a time from the layer input, projecting each
head's queries, keys and values as it goes (the multi-head layers' blockwise path).
"""

from __future__ import annotations

import numpy as np

from numpy_attn.implementation import DEFAULT_BLOCK_SIZE
from numpy_attn.linear import linear
from numpy_attn.validation import NUMPY_FLOATS, check_blockwise_args, check_self_attention_args

__all__ = ["DEFAULT_BLOCK_SIZE", "blockwise_attention", "blockwise_self_attention"]



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

    Shapes: queries ``(..., T, H)``, keys and values ``(..., S, H)``; returns ``(..., T, H)``.
    ``causal`` hides key s from query t when s > t (T = S); ``padding_mask`` is bool ``(B, S)``,
    True = padding (hidden), for 4-D ``(B, N, T, H)`` inputs. A query whose every key is hidden
    gets a zero output, as in ``scaled_dot_product_attention``. Dropout on the (normalised)
    weights: ``attn_keep_mask`` (bool ``(..., T, S)``, True = keep) is sliced per block; ``rng``
    draws a mask per block (other draws than the reference path's).
    """
    num_queries, num_keys = queries.shape[-2], keys.shape[-2]
    check_blockwise_args(
        num_queries=num_queries, num_keys=num_keys, causal=causal, block_size=block_size,
        dropout=dropout, attn_keep_mask=attn_keep_mask, keep_shape=(*queries.shape[:-1], num_keys),
    )  # fmt: skip
    scale = 1 / queries.shape[-1] ** 0.5
    hidden_keys = None if padding_mask is None else padding_mask[:, None, None, :]  # (B, 1, 1, S)
    dropping = dropout is not None and (rng is not None or attn_keep_mask is not None)
    # laid out in memory as queries are (order "K"): for heads split from (B, T, E) projections,
    # (B, T, N, H) memory, so that merging the heads back is a view, not a copy
    context_vec = np.empty_like(queries, shape=queries.shape[:-1] + values.shape[-1:])
    for q0 in range(0, num_queries, block_size):
        q1 = min(q0 + block_size, num_queries)
        query_block = queries[..., q0:q1, :] * np.asarray(scale, queries.dtype)  # (..., tq, H)
        running_max = np.full((*query_block.shape[:-1], 1), -np.inf, dtype=queries.dtype)
        running_sum = np.zeros_like(running_max)
        acc = np.zeros(query_block.shape[:-1] + values.shape[-1:], dtype=queries.dtype)
        last_key = q1 if causal else num_keys  # keys after the block's last query are all hidden
        for k0 in range(0, min(last_key, num_keys), block_size):
            k1 = min(k0 + block_size, num_keys)
            scores = query_block @ np.swapaxes(keys[..., k0:k1, :], -1, -2)  # (..., tq, tk)
            hidden = None
            if causal and k1 - 1 > q0:  # a block on the diagonal
                hidden = np.arange(k0, k1)[None, :] > np.arange(q0, q1)[:, None]  # (tq, tk)
            if hidden_keys is not None:
                block_padding = hidden_keys[..., k0:k1]
                hidden = block_padding if hidden is None else hidden | block_padding
            if hidden is not None:
                np.copyto(scores, -np.inf, where=hidden)
            block_max = np.maximum(running_max, scores.max(axis=-1, keepdims=True))
            safe_max = np.where(block_max == -np.inf, 0, block_max)  # nothing seen yet: no shift
            correction = np.exp(running_max - safe_max)
            np.subtract(scores, safe_max, out=scores)
            np.exp(scores, out=scores)  # unnormalised weights of this block
            running_sum = running_sum * correction + scores.sum(axis=-1, keepdims=True)
            if dropping:
                keep = (
                    attn_keep_mask[..., q0:q1, k0:k1]
                    if attn_keep_mask is not None
                    else rng.random(scores.shape) >= dropout
                )
                scores = scores * keep / (1 - dropout)
            acc = acc * correction + scores @ values[..., k0:k1, :]
            running_max = block_max
        # the reciprocal of the sum, as in softmax; a query that saw no key keeps a zero output
        context_vec[..., q0:q1, :] = acc * (1 / np.where(running_sum == 0, 1, running_sum))
    return context_vec


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
    """Multi-head self-attention of ``x`` projected by the stacked QKV ``weight``, block by block.

    ``weight`` is ``(3E, D)`` in torch's layout (the rows of W_query, then W_key, then W_value:
    note 003's ``Wqkv``), ``bias`` ``(3E,)`` or None; x is ``(B, T, D)``; returns the heads'
    context merged, ``(B, T, E)``. Equal to ``merge_heads(blockwise_attention(*(split_heads(p,
    num_heads) for p in split_projection(x, weight, bias)), ...))`` with the same arguments
    (other dropout draws from ``rng``), but one head at a time: each head's queries, keys and
    values are projected ``(B, T, 3H)`` at a time, so that no ``(B, T, 3E)`` projection is
    stored, and its context is written into the merged ``(B, T, E)`` array.
    """
    check_self_attention_args(
        x, weight, bias, num_heads=num_heads, padding_mask=padding_mask, floating=NUMPY_FLOATS
    )
    batch, num_tokens, d_in = x.shape
    head_dim = weight.shape[0] // (3 * num_heads)
    check_blockwise_args(
        num_queries=num_tokens, num_keys=num_tokens, causal=causal, block_size=block_size,
        dropout=dropout, attn_keep_mask=attn_keep_mask,
        keep_shape=(batch, num_heads, num_tokens, num_tokens),
    )  # fmt: skip
    # (3E, D) -> (N, 3H, D): head n's query, key and value rows, next to each other
    head_weights = np.swapaxes(weight.reshape(3, num_heads, head_dim, d_in), 0, 1)
    head_weights = head_weights.reshape(num_heads, 3 * head_dim, d_in)
    head_biases = None if bias is None else np.swapaxes(bias.reshape(3, num_heads, head_dim), 0, 1)
    context_vec = np.empty((batch, num_tokens, num_heads * head_dim), x.dtype)
    for n in range(num_heads):
        head_bias = None if head_biases is None else head_biases[n].reshape(-1)  # (3H,)
        projected = linear(x, head_weights[n], head_bias)[:, None]  # (B, 1, T, 3H)
        head_context = blockwise_attention(
            *np.split(projected, 3, axis=-1),  # queries, keys, values: 3 x (B, 1, T, H)
            causal=causal, padding_mask=padding_mask, dropout=dropout, rng=rng,
            attn_keep_mask=None if attn_keep_mask is None else attn_keep_mask[:, n : n + 1],
            block_size=block_size,
        )  # fmt: skip  # (B, 1, T, H)
        context_vec[..., n * head_dim : (n + 1) * head_dim] = head_context[:, 0]
    return context_vec
