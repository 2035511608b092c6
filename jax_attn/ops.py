"""The building blocks every layer is made of, in JAX: the math alone.

These functions trust their arguments (``jax_attn`` checks each public call once, at its door);
``numpy_attn/ops.py`` is the same file in NumPy. Axis letters: see numpy_attn's docstring.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from numpy_attn.ops import compute_dtype
from numpy_attn.steps import Steps


def linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """torch's ``nn.Linear``: ``x @ weight.T + bias``. As ``numpy_attn.linear``."""
    out = x @ weight.T  # (..., F)
    return out if bias is None else out + bias


def softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``exp(x) / sum(exp(x))`` along ``axis``, each slice lowered by its maximum first. As
    ``numpy_attn.softmax``."""
    x_acc = rounded(x.astype(compute_dtype(x.dtype)))  # the maximum is of the values exponentiated
    # at least the lowest finite value: a fully masked slice's exp(-inf - lowest) = 0
    x_max = jnp.max(x_acc, axis=axis, keepdims=True, initial=jnp.finfo(x_acc.dtype).min)
    unnormalized = jnp.exp(x_acc - jax.lax.stop_gradient(x_max))
    denominator = unnormalized.sum(axis=axis, keepdims=True)  # >= 1, the maximum's exp(0) being in it
    denominator = jnp.where(denominator == 0, 1, denominator)  # but a fully masked slice's 0
    return (unnormalized * (1 / denominator)).astype(x.dtype)  # as torch's CPU kernel


def rounded(x: jax.Array) -> jax.Array:
    """``x`` itself (NaN stays NaN), rounded to its dtype before any use: a select XLA cannot see
    through. Under ``jax.jit`` XLA recomputes a cheap ``x`` (``s / 8 ** 0.5``; a matmul over a head
    of size 1) in each fusion that reads it, and may fuse it into ``x - max`` as one FMA, unrounded:
    exp then sees other values than the maximum was taken of, and past |x| = 2**31 (float32)
    ``x - max`` exceeds 88, exp overflows and the softmax is NaN. Returns: x, same shape and dtype."""
    return jnp.where(x == x, x, jnp.nan)


def softmax_naive(x: jax.Array, axis: int = -1) -> jax.Array:
    """The notes' ``exp(x) / exp(x).sum()``: overflows to NaN for large inputs (kept to show it)."""
    return jnp.exp(x) / jnp.sum(jnp.exp(x), axis=axis, keepdims=True)


def causal_mask(num_queries: int, num_keys: int | None = None, offset: int | jax.Array = 0) -> jax.Array:
    """The causal mask, True = hidden: query t, at position ``offset + t``, may not see key s > offset + t.

    With ``offset=0`` and T = S this is the notes' ``torch.triu(torch.ones(T, S), diagonal=1)``,
    built from the shapes; a KV cache's new queries sit at ``offset`` = the tokens cached before
    (a traced value under ``jax.jit``).
    Returns: bool ``(T, S)``.
    """
    num_keys = num_queries if num_keys is None else num_keys
    query_positions = offset + jnp.arange(num_queries)[:, None]  # (T, 1)
    return jnp.arange(num_keys)[None, :] > query_positions  # (T, S)


def draw_keep_mask(key: jax.Array, p: float, shape: tuple[int, ...]) -> jax.Array:
    """A bool keep-mask of ``shape`` (True = keep), each entry kept with probability ``1 - p``: the
    bits of ``jax.random.bernoulli``, drawn with the last two axes merged (compiled faster)."""
    merged = (*shape[:-2], math.prod(shape[-2:]))  # (..., T * S): the same bits, in row-major order
    return jax.random.bernoulli(key, 1 - p, merged).reshape(shape)


def dropout(
    x: jax.Array, p: float, *, key: jax.Array | None = None, keep_mask: jax.Array | None = None
) -> jax.Array:
    """Inverted dropout: entries of ``x`` zeroed with probability ``p``, the rest scaled by ``1 / (1 - p)``.
    As ``numpy_attn.dropout``; ``key`` (a ``jax.random`` key) in place of ``rng``."""
    if keep_mask is None:
        if key is None:
            return x
        keep_mask = draw_keep_mask(key, p, x.shape)
    return x * keep_mask / (1 - float(p))  # float: a NumPy p would set the dtype


_dropout = dropout  # for scaled_dot_product_attention, whose argument ``dropout`` is the rate


def split_heads(x: jax.Array, num_heads: int) -> jax.Array:
    """``(B, T, E) -> (B, N, T, H)``: the notes' ``view(b, T, N, H).transpose(1, 2)``."""
    b, num_tokens, d_out = x.shape
    x = x.reshape(b, num_tokens, num_heads, d_out // num_heads)  # (B, T, N, H)
    return x.swapaxes(1, 2)  # (B, N, T, H)


def merge_heads(x: jax.Array) -> jax.Array:
    """``(B, N, T, H) -> (B, T, E)``: the notes' ``transpose(1, 2).contiguous().view(b, T, E)``."""
    b, num_heads, num_tokens, head_dim = x.shape
    x = x.swapaxes(1, 2)  # (B, T, N, H)
    return x.reshape(b, num_tokens, num_heads * head_dim)  # (B, T, E)


def scaled_dot_product_attention(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array | None = None,
    *,
    dropout: float | None = None,
    key: jax.Array | None = None,
    attn_keep_mask: jax.Array | None = None,
) -> tuple[jax.Array, Steps]:
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``, as the notes compute it. As
    ``numpy_attn.scaled_dot_product_attention``; ``key`` (a ``jax.random`` key) in place of ``rng``; its
    mask's True = hidden (``jax.nn`` and Flax use the opposite)."""
    dtype, compute = queries.dtype, compute_dtype(queries.dtype)
    queries, keys = queries.astype(compute), keys.astype(compute)
    attn_scores = jnp.einsum("...th,...sh->...ts", queries, keys)  # (..., T, S)
    steps = Steps(attn_scores=attn_scores)
    if mask is not None:
        attn_scores = steps["masked_scores"] = jnp.where(mask, -jnp.inf, attn_scores)  # (..., T, S)
    attn_weights = softmax(attn_scores / keys.shape[-1] ** 0.5, axis=-1)  # (..., T, S)
    steps["attn_weights"] = attn_weights = attn_weights.astype(dtype)
    if dropout is not None:
        attn_weights = _dropout(attn_weights, dropout, key=key, keep_mask=attn_keep_mask)
        steps["attn_weights_dropped"] = attn_weights
    context_vec = attn_weights @ values  # (..., T, Hv)
    return context_vec, steps
