"""Inverted dropout, deterministic unless randomness or a keep-mask is passed in."""

from __future__ import annotations

import numpy as np

from numpy_attn.validation import check_dropout, check_keep_mask, check_rng

__all__ = ["dropout"]


def dropout(
    x: np.ndarray,
    p: float,
    *,
    rng: np.random.Generator | None = None,
    keep_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Zero entries of ``x`` with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    ``keep_mask`` (bool, ``x``'s shape, True = keep) fixes which entries survive, e.g. a mask
    taken from torch to reproduce a training-mode run; otherwise ``rng`` draws one. With neither,
    this is the identity (evaluation mode). ``p`` lies in [0, 1).
    """
    check_dropout("p", p)
    check_rng(rng)
    if keep_mask is None:
        if rng is None:
            return x
        keep_mask = rng.random(x.shape) >= p
    check_keep_mask("keep_mask", keep_mask, x.shape)
    return x * keep_mask / (1 - p)
