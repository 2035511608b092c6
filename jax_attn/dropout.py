"""Inverted dropout, deterministic unless a key or a keep-mask is passed in."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpy_attn.validation import check_dropout, check_keep_mask

from jax_attn.checks import check_jax_operands, check_key
from jax_attn.draws import merged_draw

__all__ = ["draw_keep_mask", "dropout", "unchecked_dropout"]


def dropout(
    x: jax.Array,
    p: float,
    *,
    key: jax.Array | None = None,
    keep_mask: jax.Array | None = None,
) -> jax.Array:
    """``unchecked_dropout`` of a floating array ``x`` (TypeError for a non-array, another
    framework's tensor, a non-floating dtype, float64 without 64-bit mode)."""
    check_jax_operands(x=x)
    return unchecked_dropout(x, p, key=key, keep_mask=keep_mask)


def unchecked_dropout(
    x: jax.Array,
    p: float,
    *,
    key: jax.Array | None = None,
    keep_mask: jax.Array | None = None,
) -> jax.Array:
    """Zero entries of ``x`` with probability ``p`` and scale the rest by ``1 / (1 - p)``; ``x``
    is not checked (the layers have), ``p``, the randomness and ``keep_mask`` are.

    ``keep_mask`` (bool, ``x``'s shape, True = keep) fixes which entries survive, e.g. a mask
    taken from torch to reproduce a training-mode run; otherwise ``key`` (a ``jax.random`` key)
    draws one. With neither, this is the identity (evaluation mode). ``p`` lies in [0, 1) and
    is static under ``jax.jit``.
    """
    check_dropout("p", p)
    p = float(p)  # a NumPy scalar would set the result's dtype (np.float64: float32 x -> float64)
    check_key(key)
    if keep_mask is None:
        if key is None:
            return x
        keep_mask = draw_keep_mask(key, p, x.shape)
    check_keep_mask("keep_mask", keep_mask, x.shape)
    return jnp.asarray(x) * keep_mask / (1 - p)


def draw_keep_mask(key: jax.Array, p: float, shape: tuple[int, ...]) -> jax.Array:
    """A bool mask of ``shape``, True = keep, each entry kept with probability ``1 - p``: the bits
    of ``jax.random.bernoulli(key, 1 - p, shape)``, drawn by ``merged_draw`` (compiled faster)."""
    return merged_draw(jax.random.bernoulli, key, shape, p=1 - p)
