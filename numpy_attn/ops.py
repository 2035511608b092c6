"""The building blocks every layer is made of, in NumPy: the math alone.

These functions trust their arguments (``numpy_attn`` checks each public call once, at its door);
``jax_attn/ops.py`` is the same file in JAX. Axis letters: see the package's docstring.
"""

from __future__ import annotations

import numpy as np

from numpy_attn.steps import Steps


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """torch's ``nn.Linear``: ``x @ weight.T + bias``.

    Args: x ``(..., D)``; weight ``(F, D)``, torch's layout; bias ``(F,)`` or None.
    Returns: ``(..., F)``.
    """
    out = x @ weight.T  # (..., F)
    return out if bias is None else out + bias


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype scores and softmax are computed in: float32 for float16 and bfloat16 (whose
    scores can exceed float16's range), the input's dtype otherwise."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``exp(x) / sum(exp(x))`` along ``axis``, each slice lowered by its maximum first.

    Half precision is computed in float32 and cast back. A slice whose every entry is ``-inf``
    (every key hidden) gives zeros, where ``torch.softmax`` gives NaN.
    Returns: an array of x's shape and dtype.
    """
    x_acc = x.astype(compute_dtype(x.dtype), copy=False)
    # at least the lowest finite value: a fully masked slice's exp(-inf - lowest) = 0
    x_max = x_acc.max(axis=axis, keepdims=True, initial=np.finfo(x_acc.dtype).min)
    with np.errstate(over="ignore"):  # x - max below the dtype's range is -inf, whose exp is 0
        unnormalized = np.exp(x_acc - x_max)
    denominator = unnormalized.sum(axis=axis, keepdims=True)  # >= 1, the maximum's exp(0) being in it
    denominator = np.where(denominator == 0, 1, denominator)  # but a fully masked slice's 0
    return (unnormalized * (1 / denominator)).astype(x.dtype, copy=False)  # as torch's CPU kernel


def softmax_naive(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The notes' ``exp(x) / exp(x).sum()``: overflows to NaN for large inputs (kept to show it)."""
    return np.exp(x) / np.sum(np.exp(x), axis=axis, keepdims=True)


def causal_mask(num_queries: int, num_keys: int | None = None, offset: int = 0) -> np.ndarray:
    """The causal mask, True = hidden: query t, at position ``offset + t``, may not see key s > offset + t.

    With ``offset=0`` and T = S this is the notes' ``torch.triu(torch.ones(T, S), diagonal=1)``,
    built from the shapes; a KV cache's new queries sit at ``offset`` = the tokens cached before.
    Returns: bool ``(T, S)``.

    >>> causal_mask(3).astype(int)
    array([[0, 1, 1],
           [0, 0, 1],
           [0, 0, 0]])
    """
    num_keys = num_queries if num_keys is None else num_keys
    query_positions = offset + np.arange(num_queries)[:, None]  # (T, 1)
    return np.arange(num_keys)[None, :] > query_positions  # (T, S)


def draw_keep_mask(rng: np.random.Generator, p: float, shape: tuple[int, ...]) -> np.ndarray:
    """A bool keep-mask of ``shape`` (True = keep), each entry kept with probability ``1 - p``."""
    return rng.random(shape) >= p


def dropout(
    x: np.ndarray,
    p: float,
    *,
    rng: np.random.Generator | None = None,
    keep_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Inverted dropout: entries of ``x`` zeroed with probability ``p``, the rest scaled by ``1 / (1 - p)``.

    ``keep_mask`` (bool, x's shape, True = keep) fixes which entries survive (a mask taken from
    torch reproduces its training-mode run); otherwise ``rng`` draws one. With neither, this is
    the identity: evaluation mode.
    Returns: an array of x's shape and dtype.
    """
    if keep_mask is None:
        if rng is None:
            return x
        keep_mask = draw_keep_mask(rng, p, x.shape)
    return x * keep_mask / (1 - float(p))  # float: a NumPy p would set the dtype


_dropout = dropout  # for scaled_dot_product_attention, whose argument ``dropout`` is the rate


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, T, E) -> (B, N, T, H)``: the notes' ``view(b, T, N, H).transpose(1, 2)``."""
    b, num_tokens, d_out = x.shape
    x = x.reshape(b, num_tokens, num_heads, d_out // num_heads)  # (B, T, N, H)
    return x.swapaxes(1, 2)  # (B, N, T, H)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """``(B, N, T, H) -> (B, T, E)``: the notes' ``transpose(1, 2).contiguous().view(b, T, E)``."""
    b, num_heads, num_tokens, head_dim = x.shape
    x = x.swapaxes(1, 2)  # (B, T, N, H)
    return x.reshape(b, num_tokens, num_heads * head_dim)  # (B, T, E)


def scaled_dot_product_attention(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    dropout: float | None = None,
    rng: np.random.Generator | None = None,
    attn_keep_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, Steps]:
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values``, as the notes compute it.

    Args:
        queries ``(..., T, H)``, keys ``(..., S, H)``, values ``(..., S, Hv)``.
        mask: bool, broadcastable to ``(..., T, S)``, True = hidden; or None.
        dropout: the probability of dropping a weight (see ``dropout``), or None for a layer
            without attention dropout (its steps then have no ``attn_weights_dropped``).
    Returns:
        ``(context_vec (..., T, Hv), steps)``: ``attn_scores``, ``masked_scores`` (with a mask),
        ``attn_weights``, ``attn_weights_dropped`` (with ``dropout``).

    Half-precision scores and softmax are computed in float32 (their dot products can exceed
    float16's range), the weights cast back. A query whose every key is hidden gets zeros.
    """
    dtype, compute = queries.dtype, compute_dtype(queries.dtype)
    queries, keys = queries.astype(compute, copy=False), keys.astype(compute, copy=False)
    attn_scores = queries @ keys.swapaxes(-1, -2)  # (..., T, S)
    steps = Steps(attn_scores=attn_scores)
    if mask is not None:
        attn_scores = steps["masked_scores"] = np.where(mask, -np.inf, attn_scores)  # (..., T, S)
    attn_weights = softmax(attn_scores / keys.shape[-1] ** 0.5, axis=-1)  # (..., T, S)
    steps["attn_weights"] = attn_weights = attn_weights.astype(dtype, copy=False)
    if dropout is not None:
        attn_weights = _dropout(attn_weights, dropout, rng=rng, keep_mask=attn_keep_mask)
        steps["attn_weights_dropped"] = attn_weights
    context_vec = attn_weights @ values  # (..., T, Hv)
    return context_vec, steps
