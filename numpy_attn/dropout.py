"""Inverted dropout, deterministic unless randomness or a keep-mask is passed in."""

from __future__ import annotations

import numpy as np

from numpy_attn.validation import NUMPY_FLOATS, check_dropout, check_keep_mask, check_operands, check_rng

__all__ = ["draw_keep_mask", "dropout", "unchecked_dropout"]


def dropout(
    x: np.ndarray,
    p: float,
    *,
    rng: np.random.Generator | None = None,
    keep_mask: np.ndarray | None = None,
) -> np.ndarray:
    """``unchecked_dropout`` of a floating array ``x`` (TypeError for a non-array, another
    framework's tensor, a non-floating dtype)."""
    check_operands(NUMPY_FLOATS, x=x)
    return unchecked_dropout(x, p, rng=rng, keep_mask=keep_mask)


def unchecked_dropout(
    x: np.ndarray,
    p: float,
    *,
    rng: np.random.Generator | None = None,
    keep_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Zero entries of ``x`` with probability ``p`` and scale the rest by ``1 / (1 - p)``; ``x``
    is not checked (the layers have), ``p``, the randomness and ``keep_mask`` are.

    ``keep_mask`` (bool, ``x``'s shape, True = keep) fixes which entries survive, e.g. a mask
    taken from torch to reproduce a training-mode run; otherwise ``rng`` draws one. With neither,
    this is the identity (evaluation mode). ``p`` lies in [0, 1).
    """
    check_dropout("p", p)
    p = float(p)  # a NumPy scalar would set the result's dtype (np.float64: float32 x -> float64)
    check_rng(rng)
    if keep_mask is None:
        if rng is None:
            return x
        keep_mask = draw_keep_mask(rng, p, x.shape)
    check_keep_mask("keep_mask", keep_mask, x.shape)
    return x * keep_mask / (1 - p)


def draw_keep_mask(rng: np.random.Generator, p: float, shape: tuple[int, ...]) -> np.ndarray:
    """A bool mask of ``shape``, True = keep, each entry kept with probability ``1 - p``: one
    uniform draw per entry, in row-major order, kept where it is at least ``p``."""
    return rng.random(shape) >= p
