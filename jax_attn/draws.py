"""``jax.random`` draws made with their last two axes as one: the same bits, compiled faster.

jax.random's generators fill a draw in row-major order (threefry's counter for an entry is its
flat index, whatever the shape), so a draw of shape ``(..., T * S)`` reshaped to ``(..., T, S)``
has the bits of the draw at ``(..., T, S)``. XLA:CPU compiles the counters of fewer axes faster:
a (2, 2, 6, 6) dropout mask's program in 0.4 s against 1.0 s, a (3, 5) mask's in
0.08 s against 0.19 s, almost all of it LLVM's. The leading axes stay, so that a draw whose
batch or heads are sharded is still made shard by shard (a fully flat draw would make every
device compute every entry).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["merged_draw"]


def merged_draw(
    sample: Callable[..., jax.Array], key: jax.Array, shape: tuple[int, ...], **kwargs: Any
) -> jax.Array:
    """``sample(key, shape=shape, **kwargs)`` (a ``jax.random`` function: ``bernoulli``,
    ``uniform``, ``normal``...), drawn with the last two axes merged and reshaped to ``shape``."""
    merged = (*shape[:-2], math.prod(shape[-2:]))  # (..., T * S)
    return sample(key, shape=merged, **kwargs).reshape(shape)
