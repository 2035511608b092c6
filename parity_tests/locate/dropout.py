"""Dropout in train mode: the draws a port is given, and what its dropped entries show.

The reference's keep-mask ``K`` (True = kept, drop rate ``p``) reaches a NumPy port through the
uniform draws of its ``Generator`` (``uniform_draws``): draws that are uniform on ``[0, 1)`` as a
true generator's, conditioned on the port's comparison with the rate giving ``K``. A port reading
them as the reference does (``u >= p`` keeps, or ``u < 1 - p``: ``kept_high``) drops exactly the
reference's entries; one comparing with another threshold, or using its mask the wrong way round,
drops others, as it would with its own draws, and is caught by the values.

What a port's dropped entries show is read by one rule (``share_bound``): among the ``n`` entries
the dropout could drop (nonzero before it), a correct dropout drops a Binomial(n, p) count, and
Hoeffding's inequality gives ``P(|dropped / n - p| >= t) <= 2 exp(-2 n t**2)`` for every ``n`` and
``p``; ``t`` is chosen so that this is ``FALSE_ALARM``. A share outside ``p +- t`` is named in the
cause; with few entries (``t`` too wide to tell ``p`` from ``1 - p``) nothing is said of the share.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FALSE_ALARM", "ambiguous", "dropout_causes", "share_bound", "uniform_draws"]

# the chance that a correct dropout's share of dropped entries falls outside p +- share_bound(n)
FALSE_ALARM = 1e-6
# how far the draws keep from the threshold: float32 rounding never moves one across it
_MARGIN = 2.0**-16


def share_bound(n: int) -> float:
    """``t`` with ``2 exp(-2 n t**2) = FALSE_ALARM``: the share of ``n`` Bernoulli draws lies within
    ``t`` of its probability but with chance ``FALSE_ALARM`` at most (Hoeffding); inf for ``n = 0``."""
    return math.sqrt(math.log(2 / FALSE_ALARM) / (2 * n)) if n > 0 else math.inf


def ambiguous(size: int, p: float) -> bool:
    """Whether a Bernoulli draw of ``size`` entries may not tell a keep-mask (share ``1 - p``) from a
    drop-mask (share ``p``): the two shares within ``2 * share_bound(size)`` of each other (p near 0.5)."""
    return abs(1 - 2 * p) <= 2 * share_bound(size)


def uniform_draws(keep: np.ndarray, p: float, kept_high: bool, rng: np.random.Generator) -> np.ndarray:
    """Uniform draws on ``[0, 1)`` (float64, ``keep``'s shape) whose comparison with the threshold
    gives ``keep``: with ``kept_high`` the threshold is ``p``, kept entries draw above it and dropped
    ones below (``u >= p`` keeps, ``u < p`` drops); otherwise it is ``1 - p``, kept entries below
    (``u < 1 - p`` keeps). Above and below, the draws are uniform (``rng``'s), ``_MARGIN`` of their
    range away from the threshold and the ends, so every entry draws what a true generator could."""
    threshold = p if kept_high else 1 - p
    low = ~keep if kept_high else keep
    w = _MARGIN + (1 - 2 * _MARGIN) * rng.random(keep.shape)
    return np.where(low, threshold * w, threshold + (1 - threshold) * w)


def _drop_rate(given: np.ndarray, dropped: np.ndarray, keywords: dict) -> float | None:
    """The reference dropout's rate: its ``p=`` keyword, else read from its scale ``1 / (1 - p)``."""
    if isinstance(keywords.get("p"), float):
        return keywords["p"]
    kept = (given != 0) & (dropped != 0)
    if not kept.any():
        return None
    return float(1 - 1 / np.median(dropped[kept] / given[kept]))


def dropout_causes(
    given: np.ndarray, expected: np.ndarray, actual: np.ndarray, keywords: dict, rtol: float, atol: float
) -> list[str]:
    """What a port's value shows where the reference's dropout turns ``given`` (its attention
    weights) into ``expected``: the share of the entries it could drop (``given != 0``) that
    ``actual`` zeroes, where it lies outside ``p +- share_bound(n)`` ("drops 80% of the entries
    where p = 0.2"), and the one factor the kept entries are scaled by, where it is not
    ``1 / (1 - p)`` (p, 1 - p, or none at all named). Empty where the shapes differ or nothing shows."""
    if not (given.shape == expected.shape == actual.shape) or given.dtype.kind != "f":
        return []
    given, actual = given.astype(np.float64), actual.astype(np.float64)
    p = _drop_rate(given, expected.astype(np.float64), keywords)
    live = (given != 0) & np.isfinite(given) & np.isfinite(actual)
    n = int(live.sum())
    if p is None or n == 0:
        return []
    causes = []
    dropped = int((live & (actual == 0)).sum())
    share, bound = dropped / n, share_bound(n)
    if abs(share - p) > bound:
        if abs(share - (1 - p)) <= bound:
            why = "the keep-mask used the wrong way round (or drawn with p where 1 - p is due)?"
        else:
            why = "its mask drawn with another rate?"
        causes.append(
            f"drops {share:.0%} of the entries where p = {p:.3g} ({dropped} of the {n} it could drop; a "
            f"dropout at this rate drops {max(p - bound, 0):.0%} to {min(p + bound, 1):.0%} of them, other "
            f"shares with chance < {FALSE_ALARM:g}): {why}"
        )
    kept = live & (actual != 0)
    if kept.any():
        factor = float(np.median(actual[kept] / given[kept]))
        due = 1 / (1 - p) if p < 1 else math.inf
        close = np.abs(actual[kept] - factor * given[kept]) <= atol + rtol * np.abs(factor * given[kept])
        if close.all() and abs(factor / due - 1) > 1e-3:
            scale = f"where dropout scales them by 1/(1 - p) = {due:.4g}, p = {p:.3g}"
            if abs(factor - 1) <= 1e-3:
                causes.append(f"the kept entries are not rescaled {scale}")
            else:
                named = next(
                    (f" = {k}" for k, v in (("p", p), ("1 - p", 1 - p)) if abs(factor / v - 1) <= 1e-3), ""
                )
                causes.append(f"the kept entries are scaled by {factor:.4g}{named} {scale}")
    return causes
