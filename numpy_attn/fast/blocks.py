"""What the blockwise paths of numpy_attn and jax_attn share: a call as heads cut into blocks
(``Heads``), the blocks' sizes, and the token-major layout heads are read and written in. Each
framework's ``blockwise.py`` holds its loops. NumPy or JAX arrays alike (array methods only)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def fit_block_size(block_size: int, length: int) -> int:
    """The block size used on a sequence of ``length``: as few blocks as ``block_size`` allows, cut
    as equal as possible, so none exceeds the sequence and the last is short by less than a row per
    block (1000 tokens, ``block_size=512``: two blocks of 500; 6 tokens: one block of 6)."""
    num_blocks = max(1, -(-length // block_size))
    return max(1, -(-length // num_blocks))


def token_major(x: Any) -> Any:
    """``(..., T, H) -> (B, T, N, H)``, B the first leading axis (1 for ``(T, H)``), N the others:
    for ``(B, N, T, H)`` heads split from ``(B, T, E)`` projections, a view of those."""
    batch = x.shape[0] if x.ndim > 2 else 1
    return x.reshape(batch, math.prod(x.shape[1:-2]), *x.shape[-2:]).swapaxes(1, 2)


def from_token_major(context_vec: Any, queries: Any) -> Any:
    """``(B, T, N, Hv)`` back to the queries' layout ``(..., T, Hv)``: ``token_major``'s inverse."""
    return context_vec.swapaxes(1, 2).reshape(*queries.shape[:-1], context_vec.shape[-1])


def head_weights(weight: Any, bias: Any, num_heads: int) -> tuple[Any, Any]:
    """The stacked QKV ``weight (3E, D)`` (torch's rows of W_query, W_key, W_value) by head,
    ``(N, 3H, D)``: head n's query, key and value rows together; its bias ``(3E,)`` as ``(N, 3H)``."""
    d_in, head_dim = weight.shape[1], weight.shape[0] // (3 * num_heads)
    weights = weight.reshape(3, num_heads, head_dim, d_in).swapaxes(0, 1)  # (N, 3, H, D)
    if bias is not None:
        bias = bias.reshape(3, num_heads, head_dim).swapaxes(0, 1).reshape(num_heads, 3 * head_dim)  # (N, 3H)
    return weights.reshape(num_heads, 3 * head_dim, d_in), bias  # (N, 3H, D)


@dataclass(frozen=True)
class Heads:
    """One blockwise call as the loops see it: ``num_heads`` heads of ``batch`` sequences,
    ``num_queries`` queries against ``num_keys`` keys, values of ``head_dim`` features, in ``dtype``;
    what hides keys (``causal``; ``padding_mask`` bool ``(B, S)``, True = padding); dropout on the
    weights (``dropout``, drawn from ``random``, a NumPy ``Generator`` or a JAX key, or ``keep_mask``,
    bool, True = keep, of ``(B, N, T, S)`` elements); the ``block_size``."""

    batch: int
    num_heads: int
    num_queries: int
    num_keys: int
    head_dim: int
    dtype: Any
    causal: bool
    padding_mask: Any
    dropout: float | None
    random: Any
    keep_mask: Any
    block_size: int

    @classmethod
    def of_attention(cls, queries: Any, keys: Any, values: Any, *options: Any) -> Heads:
        """``blockwise_attention``'s heads: queries ``(..., T, H)``, keys and values ``(..., S, H)``;
        B the first leading axis (1 for ``(T, H)``), N the others (as ``token_major``)."""
        batch, num_heads = (queries.shape[0] if queries.ndim > 2 else 1), math.prod(queries.shape[1:-2])
        shape = queries.shape[-2], keys.shape[-2], values.shape[-1]
        return cls(batch, num_heads, *shape, queries.dtype, *options)

    @classmethod
    def of_self_attention(cls, x: Any, weight: Any, num_heads: int, *options: Any) -> Heads:
        """``blockwise_self_attention``'s heads: x ``(B, T, D)``, weight ``(3E, D)``."""
        batch, num_tokens, _ = x.shape
        head_dim = weight.shape[0] // (3 * num_heads)
        return cls(batch, num_heads, num_tokens, num_tokens, head_dim, x.dtype, *options)

    @property
    def empty(self) -> bool:
        """Whether there is no block (no key, query, sequence or head): the context is zeros."""
        return 0 in (self.batch, self.num_heads, self.num_queries, self.num_keys, self.head_dim)

    @property
    def dropping(self) -> bool:
        """Whether the weights are dropped: a rate, and a random source or a keep-mask."""
        return self.dropout is not None and (self.random is not None or self.keep_mask is not None)

    def keep_mask_by_head(self, xp: Any) -> Any:
        """The keep-mask as an ``xp`` (numpy or jax.numpy) array ``(B, N, T, S)``, or None."""
        if self.keep_mask is None:
            return None
        return xp.asarray(self.keep_mask).reshape(self.batch, self.num_heads, self.num_queries, self.num_keys)
