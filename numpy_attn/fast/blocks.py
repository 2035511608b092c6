"""What the blockwise paths of numpy_attn and jax_attn share, written once: how a call becomes
heads cut into blocks (``Heads``), the blocks' sizes, and the token-major layout the heads are
read and written in. Each framework's ``blockwise.py`` holds its loops over the blocks.

The functions take NumPy or JAX arrays alike (array methods only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Heads", "fit_block_size", "from_token_major", "head_weights", "token_major"]


def fit_block_size(block_size: int, length: int) -> int:
    """The block size used on a sequence of ``length``: as few blocks as ``block_size`` allows,
    cut as equal as possible, so that a block never exceeds the sequence and the last one is
    short by less than one row per block (1000 tokens, ``block_size=512``: two blocks of 500;
    6 tokens, ``block_size=10**9``: one block of 6; jax_attn pads fewer than a row per block)."""
    num_blocks = max(1, -(-length // block_size))
    return max(1, -(-length // num_blocks))


def token_major(x: Any) -> Any:
    """``(..., T, H) -> (B, T, N, H)``: ``(B, N, T, H)`` swapped (a view of heads split from
    ``(B, T, E)`` projections), ``(B, T, H)`` and ``(T, H)`` with unit axes; more leading axes
    are folded into N."""
    if x.ndim == 2:
        return x[None, :, None, :]
    if x.ndim == 3:
        return x[:, :, None, :]
    return x.reshape(x.shape[0], -1, *x.shape[-2:]).swapaxes(1, 2)


def from_token_major(context_vec: Any, queries: Any, values: Any) -> Any:
    """``(B, T, N, Hv)`` back to the queries' layout, ``(..., T, Hv)`` (the inverse of
    ``token_major``; for ``(B, N, T, Hv)`` a view of memory laid out as merged heads)."""
    if queries.ndim == 2:
        return context_vec[0, :, 0]
    if queries.ndim == 3:
        return context_vec[:, :, 0]
    return context_vec.swapaxes(1, 2).reshape(*queries.shape[:-1], values.shape[-1])


def head_weights(weight: Any, bias: Any, num_heads: int) -> tuple[Any, Any]:
    """The stacked QKV ``weight`` ``(3E, D)`` (torch's layout: the rows of W_query, W_key, W_value)
    regrouped by head: ``(N, 3H, D)``, head n's query, key and value rows next to each other, and
    its ``(3E,)`` bias as ``(N, 3H)`` (None without a bias)."""
    d_in, head_dim = weight.shape[1], weight.shape[0] // (3 * num_heads)
    weights = weight.reshape(3, num_heads, head_dim, d_in).swapaxes(0, 1)  # (N, 3, H, D)
    biases = None if bias is None else bias.reshape(3, num_heads, head_dim).swapaxes(0, 1)  # (N, 3, H)
    return weights.reshape(num_heads, 3 * head_dim, d_in), None if biases is None else biases.reshape(
        num_heads, -1
    )


@dataclass(frozen=True)
class Heads:
    """One blockwise call, as every head's loops see it: ``num_heads`` heads of ``batch``
    sequences, ``num_queries`` queries against ``num_keys`` keys whose values have ``head_dim``
    features, in ``dtype``; what hides keys (``causal``; ``padding_mask`` bool ``(B, S)``, True =
    padding); dropout on the weights (``dropout``, drawn from ``random``, a NumPy ``Generator`` or
    a JAX key, or taken from ``keep_mask``, bool, True = keep, of ``(B, N, T, S)`` elements); and
    the ``block_size``."""

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
    def of_attention(cls, queries: Any, keys: Any, values: Any, **options: Any) -> Heads:
        """The heads of ``blockwise_attention(queries, keys, values, **options)``: queries
        ``(..., T, H)``, keys and values ``(..., S, H)``, the leading axes read as ``token_major``
        reads them (B the first, 1 for ``(T, H)`` queries; N the others)."""
        batch = queries.shape[0] if queries.ndim > 2 else 1
        num_heads = math.prod(queries.shape[1:-2])
        return cls(
            batch, num_heads, queries.shape[-2], keys.shape[-2], values.shape[-1], queries.dtype, **options
        )

    @classmethod
    def of_self_attention(cls, x: Any, weight: Any, num_heads: int, **options: Any) -> Heads:
        """The heads of ``blockwise_self_attention(x, weight, num_heads=num_heads, **options)``:
        x ``(B, T, D)``, weight ``(3E, D)``."""
        batch, num_tokens, _ = x.shape
        return cls(
            batch, num_heads, num_tokens, num_tokens, weight.shape[0] // (3 * num_heads), x.dtype, **options
        )

    @property
    def empty(self) -> bool:
        """Whether there is no block to cut (no key, query, batch row or head): the context is zeros."""
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
