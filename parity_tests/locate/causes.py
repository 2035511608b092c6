"""Causes read from the data: what the first diverging value is, next to what it should be."""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "axis_names",
    "describe_scale",
    "mask_causes",
    "named_factor",
    "norm_causes",
    "read_causes",
    "rope_causes",
    "scale_between",
    "tiled_heads_cause",
    "which_norm",
]


def axis_names(shape: tuple[int, ...], sizes: dict[str, int]) -> tuple[str, ...]:
    """A name per axis from the sizes of the run: ``batch``, ``head``, ``head_dim``, ``feature``,
    and for tokens ``query`` and ``key`` (a single token axis is ``token``)."""
    token_axes = [i for i, d in enumerate(shape) if d == sizes.get("tokens")]
    names = []
    for axis, size in enumerate(shape):
        if axis in token_axes and len(token_axes) > 1:
            names.append("key" if axis == token_axes[-1] else "query")
        elif axis in token_axes:
            names.append("token")
        else:  # a name once: with as many heads as sequences, the second such axis is the head's
            names.append(
                next(
                    (
                        n
                        for n in ("batch", "head", "head_dim", "feature")
                        if sizes.get(n) == size and n not in names
                    ),
                    f"axis{axis}",
                )
            )
    return tuple(names)


def _close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    if a.shape != b.shape:
        return False
    finite = np.isfinite(a) & np.isfinite(b)
    if not np.array_equal(np.isfinite(a), np.isfinite(b)):
        return False
    if not finite.any():
        return True
    return float(np.abs(a[finite] - b[finite]).max()) <= atol + rtol * float(np.abs(b[finite]).max())


def named_factor(factor: float, sizes: dict[str, int]) -> str | None:
    """``larger by sqrt(head_dim)``, ``smaller by num_heads``...: ``factor`` as a size of the run (or
    its square root), head_dim first where two are equal; None when it is none."""
    names = {"head_dim": sizes.get("head_dim"), "num_heads": sizes.get("head"), "d_out": sizes.get("feature")}
    for name, size in names.items():
        if not size or size == 1:
            continue
        for form, value in ((f"sqrt({name})", math.sqrt(size)), (name, float(size))):
            if math.isclose(factor, value, rel_tol=1e-3):
                return f"larger by {form}"
            if math.isclose(factor, 1 / value, rel_tol=1e-3):
                return f"smaller by {form}"
    return None


def _describe_factor(factor: float, sizes: dict[str, int], reference_scale: float | None) -> str | None:
    """How a value ``factor`` times the reference's differs. With ``reference_scale`` (the
    reference's value is taken before its own scale, applied later), the factor left once that scale
    is counted, when that one is a size of the run; None when that leaves no difference (a scale
    applied earlier than the reference's)."""
    if reference_scale is not None:
        if math.isclose(factor, reference_scale, rel_tol=1e-3):
            return None
        named = named_factor(factor / reference_scale, sizes)
        if named is not None:
            return f"{named}, the reference's own scale (applied later) counted"
    return named_factor(factor, sizes) or f"{factor:.6g} times the reference"


def describe_scale(scale: float, sizes: dict[str, int]) -> str:
    """``1/sqrt(head_dim)``, ``num_heads``...: a scale by name where it is a size of the run (or the
    inverse of one, or of its square root), else its number."""
    named = named_factor(scale, sizes)
    if named is None:
        return f"{scale:.6g}"
    direction, form = named.split(" by ")
    return form if direction == "larger" else f"1/{form}"


def _factor(expected: np.ndarray, actual: np.ndarray) -> float | None:
    """The least-squares ``f`` in ``actual = f * expected`` over the entries finite on both sides."""
    keep = np.isfinite(expected) & np.isfinite(actual)
    denominator = float(expected[keep] @ expected[keep])
    return float(expected[keep] @ actual[keep]) / denominator if denominator > 0 else None


def scale_between(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> float | None:
    """``f`` where ``actual`` is ``f * expected``: the same entries hidden (``-inf`` or a large
    negative fill), the others within tolerance of ``f`` times the reference's, ``f`` not 0; else
    None."""
    hidden = _hidden(expected)
    if expected.shape != actual.shape or not np.array_equal(hidden, _hidden(actual)) or hidden.all():
        return None
    e, a = expected[~hidden], actual[~hidden]
    factor = _factor(e, a)
    if factor is None or abs(factor) < 1e-6:  # 0 times the reference is no scale
        return None
    return factor if _close(factor * e, a, rtol, atol) else None


def _diagonal(shape: tuple[int, ...], row: int | None = None, k: int = 0) -> np.ndarray:
    """True where key = query + ``k``, in ``shape``: over its last two axes (query, key), or with
    ``row``, over its last axis alone (the keys of query ``row``: one row of a (query, key) value)."""
    if row is None:
        return np.broadcast_to(np.eye(*shape[-2:], k, dtype=bool), shape)
    return np.broadcast_to(np.arange(shape[-1]) == row + k, shape)


def _causal(shape: tuple[int, ...], row: int | None = None) -> np.ndarray:
    """True where the key comes after its query (a causal mask, True = hidden), as ``_diagonal``."""
    if row is None:
        return np.broadcast_to(np.triu(np.ones(shape[-2:], dtype=bool), 1), shape)
    return np.broadcast_to(np.arange(shape[-1]) > row, shape)


def _one_diagonal(difference: np.ndarray, row: int | None = None) -> int | None:
    """``k`` where ``difference`` (over its last two axes, or with ``row`` its last axis alone: see
    ``_diagonal``) is True on the ``k``-th diagonal alone."""
    if difference.ndim < (1 if row is not None else 2) or not difference.any():
        return None
    rows, columns = (1, difference.shape[-1]) if row is not None else difference.shape[-2:]
    first = 0 if row is None else row
    for k in range(1 - rows - first, columns - first):
        if np.array_equal(difference, _diagonal(difference.shape, row, k)):
            return k
    return None


def _off_by(offset: int) -> str:
    words = {0: "the diagonal (each token itself)", 1: "the next token (key = query + 1)"}
    where = words.get(offset, f"the diagonal key = query {'+' if offset > 0 else '-'} {abs(offset)}")
    return f"causal mask off by {'one' if abs(offset) <= 1 else abs(offset)}: {where}"


def mask_causes(expected: np.ndarray, actual: np.ndarray, row: int | None = None) -> list[str]:
    """What two boolean masks of one shape that hide where True (the reference's, the candidate's)
    show; with ``row``, both are the keys of query ``row`` alone (no transposition shows in one
    row)."""
    if np.array_equal(expected, ~actual):
        return ["mask inverted: the positions hidden are those the reference keeps"]
    if (
        row is None
        and expected.shape[-1] == expected.shape[-2]
        and np.array_equal(np.swapaxes(expected, -1, -2), actual)
    ):
        return [
            "mask transposed: the keys hidden are those on the other side of the diagonal "
            "(triu where tril is due, or query and key axes swapped)"
        ]
    offset = _one_diagonal(expected ^ actual, row)
    if offset is None:
        return []
    return [f"{_off_by(offset)} {'is hidden too' if (actual & ~expected).any() else 'is not hidden'}"]


def _dropped(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> str | None:
    """What a dropout left on shows: ``actual`` is ``expected`` with some of its nonzero entries
    zeroed and the others scaled by one ``1/(1 - p)`` above 1; None when it is not."""
    if not (np.isfinite(expected).all() and np.isfinite(actual).all()):
        return None
    live = expected != 0
    dropped, kept = live & (actual == 0), live & (actual != 0)
    if not dropped.any() or not kept.any():
        return None
    factor = _factor(expected[kept], actual[kept])
    if (
        factor is None
        or factor <= 1 + 1e-3
        or not _close(np.where(dropped, 0, factor * expected), actual, rtol, atol)
    ):
        return None
    return (
        f"entries dropped: yours equals the reference's value with {int(dropped.sum())} of {int(live.sum())} "
        f"nonzero entries zeroed and the others scaled by 1/(1 - p), p = {1 - 1 / factor:.3g}: a dropout "
        "left on where the reference drops none (call model.eval() or pass deterministic=True)"
    )


def _hidden(value: np.ndarray) -> np.ndarray:
    return ~np.isfinite(value) | (value <= -1e4)


def _weak_fill(
    expected: np.ndarray, actual: np.ndarray, hidden: np.ndarray, rtol: float, atol: float
) -> float | None:
    """The one value yours holds where the reference hides (``hidden``), where that value does not
    hide and yours equals the reference's elsewhere; None otherwise."""
    filled = actual[hidden]
    if not filled.size or _hidden(filled).any() or not (filled == filled.flat[0]).all():
        return None
    fill = float(filled.flat[0])
    return fill if _close(np.where(hidden, fill, expected), actual, rtol, atol) else None


def read_causes(
    expected: np.ndarray,
    actual: np.ndarray,
    axes: tuple[str, ...],
    sizes: dict[str, int],
    rtol: float,
    atol: float,
    masks: bool = False,
    reference_scale: float | None = None,
    causal_fix: str = "pass is_causal=True or a mask",
    hides: tuple[bool | None, bool | None] = (None, None),
    row: int | None = None,
) -> list[str]:
    """Causes that the numbers show: ``actual`` is ``expected`` with entries dropped, transposed,
    scaled, masked the other way, shifted by a bias, normalised over another axis, or the same
    numbers in another order. The causes read from a diagonal or a transposition take the last two
    axes for (query, key); with ``row``, both values are one query row of such a value, its keys
    last (a port computing attention one query at a time): the diagonal is then key ``row``, and no
    transposition is read (one row shows none).
    ``masks``: the candidate hides entries somewhere on the way to its output (then "no mask
    applied" is not said: its value is compared before its mask or after its exp);
    ``reference_scale``: the scale the reference applies after ``expected`` (see
    ``_describe_factor``); ``causal_fix``: how the missing causal mask is passed, in the words of the
    port's framework; ``hides``: for two boolean masks, whether True hides an entry in the
    reference's and in the candidate's (as their uses show: ``masked_fill(mask, -inf)`` hides where
    True, ``where(mask, scores, -inf)`` where False), None where unknown: then the masks are
    compared in either sense."""
    causes = []
    if expected.dtype.kind == "f" and actual.dtype.kind == "f" and expected.shape == actual.shape:
        decoder = rope_causes(expected, actual, rtol, atol) + tiled_heads_cause(expected, actual, rtol, atol)
        decoder += norm_causes(expected, actual)
        if decoder:
            return decoder
    if expected.dtype == bool or actual.dtype == bool or expected.shape != actual.shape:
        if expected.shape == actual.shape and expected.ndim >= (1 if row is not None else 2):
            e, a = expected.astype(bool), actual.astype(bool)
            if None not in hides:  # both masks as "True: hidden"
                return mask_causes(e if hides[0] else ~e, a if hides[1] else ~a, row)
            diagonal = _diagonal(e.shape, row)
            if np.array_equal(e, ~a):
                causes.append("mask inverted: True here means the opposite of the reference's mask")
            elif np.array_equal(e ^ a, diagonal) or np.array_equal(~e ^ a, diagonal):
                causes.append("causal mask off by one: the diagonal (each token itself) differs")
            elif (offset := _one_diagonal(e ^ a, row)) is not None or (
                offset := _one_diagonal(~e ^ a, row)
            ) is not None:
                causes.append(f"{_off_by(offset)} is hidden in one mask and not in the other")
        return causes
    dropped = _dropped(expected, actual, rtol, atol)
    if dropped is not None:
        return [dropped]
    if row is None and expected.ndim >= 2 and expected.shape[-1] == expected.shape[-2]:
        swapped = np.swapaxes(expected, -1, -2)
        factor = _factor(swapped, actual) or 1.0  # a scale the reference applies later, say
        if _close(factor * swapped, actual, rtol, atol):
            causes.append(
                f"your values equal the reference's transposed over ({axes[-2]}, {axes[-1]}): "
                "operands swapped or the wrong axis transposed"
            )
    hidden_e, hidden_a = _hidden(expected), _hidden(actual)
    zeros_e, zeros_a = expected == 0, actual == 0
    for label, e, a in (("-inf", hidden_e, hidden_a), ("zero", zeros_e, zeros_a)):
        if e.any() and not np.array_equal(e, a) and e.ndim >= (1 if row is not None else 2):
            rows = ~e.all(axis=-1, keepdims=True) & ~a.all(axis=-1, keepdims=True)
            square = row is None and e.shape[-1] == e.shape[-2]
            if np.array_equal((e ^ a) | ~rows, np.ones_like(e)) or np.array_equal(a & rows, ~e & rows):
                causes.append("mask inverted: the positions hidden are those the reference keeps")
            elif square and np.array_equal(np.swapaxes(e, -1, -2), a):
                causes += mask_causes(e, a)  # the mask transposed
            elif label == "-inf" and (fill := _weak_fill(expected, actual, e, rtol, atol)) is not None:
                causes.append(
                    f"masked with {fill:g} where the reference has -inf: the positions are filled with a "
                    "value softmax does not hide (fill with -inf or a large negative number)"
                )
            elif np.array_equal(a & ~e, _diagonal(e.shape, row) & ~e):
                causes.append("causal mask off by one: the diagonal (each token itself) is hidden too")
            elif (offset := _one_diagonal(e ^ a, row)) is not None:
                causes.append(f"{_off_by(offset)} {'is hidden too' if (a & ~e).any() else 'is not hidden'}")
            elif not a.any() and not masks:
                causal = (square or row is not None) and np.array_equal(e, _causal(e.shape, row))
                missing = f", every key after its query: the causal mask is missing ({causal_fix})"
                causes.append(f"no mask applied: the reference has {label} entries here" + missing * causal)
            break
    keep = np.isfinite(expected) & np.isfinite(actual)
    factor = _factor(expected, actual)
    hidden = _hidden(actual)  # yours hides what the reference does, or nothing (before its mask)
    same_hidden = np.array_equal(_hidden(expected), hidden) or (masks and not hidden.any())
    if same_hidden and factor is not None and abs(factor) > 1e-6:  # 0 times the reference: no scale
        if abs(factor - 1) > 1e-3 and _close(
            factor * np.where(keep, expected, 0), np.where(keep, actual, 0), rtol, atol
        ):
            described = _describe_factor(factor, sizes, reference_scale)
            causes += [f"scale differs: yours is {described}"] if described else []
    difference = np.where(keep, actual - expected, 0)
    nan = np.isnan(actual) & ~np.isnan(expected)  # no bias makes NaN
    if expected.ndim >= 2 and np.abs(difference).max() > atol and not nan.any():
        flat = difference.reshape(-1, difference.shape[-1])
        if np.allclose(flat, flat[:1], rtol=0, atol=atol + rtol * float(np.abs(expected[keep]).max())):
            causes.append(
                "differs by one constant vector along the last axis: a bias missing, added twice "
                "or taken from another layer"
            )
    # NaN where the reference's entry is 0: 0/0, a group normalised over entries all hidden
    rest = actual[~np.isnan(actual)]
    if (
        expected.ndim >= 2
        and rest.size
        and (expected[np.isnan(actual)] == 0).all()
        and np.isfinite(rest).all()
        and (rest >= 0).all()
    ):
        over = actual.sum(axis=-2)  # NaN for a group holding a NaN
        groups = over[~np.isnan(over)]
        if (
            groups.size
            and np.allclose(groups, 1, atol=1e-4)
            and not np.allclose(actual.sum(axis=-1), 1, atol=1e-4)
        ):
            causes.append(
                f"normalised over the {axes[-2]} axis instead of the {axes[-1]} axis: softmax over "
                "the wrong axis"
            )
    if not causes and np.allclose(
        np.sort(expected, axis=None),
        np.sort(actual, axis=None),
        rtol=0,
        atol=atol + rtol * float(np.abs(expected[np.isfinite(expected)]).max(initial=0.0)),
    ):
        causes.append(
            "the reference's numbers in another order: a reshape without the transpose (heads split "
            "or merged in the wrong order) or axes permuted"
        )
    return causes


# --- modern decoders: RoPE, grouped-query heads, RMSNorm -------------------------------------------


def _geometric_base(freq: np.ndarray) -> float | None:
    """The RoPE base b of inverse frequencies ``b ** (-2i / H)`` (``freq[0] == 1``, H = 2 len), or None
    when ``freq`` is not of that form."""
    n = freq.size
    if n < 2 or not np.isfinite(freq).all() or not (0 < freq[1] < 1) or abs(freq[0] - 1) > 1e-5:
        return None
    if not np.allclose(freq, freq[1] ** np.arange(n), rtol=1e-4, atol=0):
        return None
    return float(freq[1] ** -n)


def _frequency_causes(expected: np.ndarray, actual: np.ndarray) -> list[str]:
    """1-D values: RoPE inverse frequencies of another base, or positions shifted."""
    mine, theirs = _geometric_base(actual), _geometric_base(expected)
    if mine is not None and theirs is not None and not np.isclose(mine, theirs, rtol=1e-3):
        return [
            f"RoPE base differs: yours are the inverse frequencies base ** (-2i/H) of base {mine:.6g}, "
            f"the reference's of base {theirs:.6g}"
        ]
    if mine is not None and theirs is None and abs(expected[0] - actual[0]) <= 1e-5 * abs(actual[0]):
        return [
            f"RoPE frequencies not scaled: yours are base ** (-2i/H) of base {mine:.6g} as they are, the "
            "reference's are scaled (Llama 3's frequency scaling: rope_freq / rope_scaling missing)"
        ]
    ramp = expected.size >= 2 and np.allclose(np.diff(expected), 1, rtol=0, atol=1e-6)
    shift = actual - expected
    if ramp and np.allclose(shift, shift[0], rtol=0, atol=1e-6) and abs(shift[0]) >= 0.5:
        k = float(shift[0])
        return [
            f"positions off by {k:+g}: yours start at {actual[0]:g}, the reference's at {expected[0]:g} "
            "(an arange from 1, or an offset added or left out)"
        ]
    return []


def _rotation_angles(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> np.ndarray | None:
    """The angles ``(T, H/2)`` that rotate each half-split pair ``(x[i], x[i + H/2])`` of ``expected``
    into ``actual``'s, the same for every leading index; None when ``actual`` is no such rotation."""
    if expected.ndim < 2 or expected.shape[-1] % 2 or expected.shape[-2] < 2:
        return None
    if not (np.isfinite(expected).all() and np.isfinite(actual).all()):
        return None
    half = expected.shape[-1] // 2
    e1, e2, a1, a2 = expected[..., :half], expected[..., half:], actual[..., :half], actual[..., half:]
    cross = (e1 * a2 - e2 * a1).reshape(-1, *e1.shape[-2:]).sum(axis=0)
    dot = (e1 * a1 + e2 * a2).reshape(-1, *e1.shape[-2:]).sum(axis=0)
    angles = np.arctan2(cross, dot)  # (T, H/2): least squares over the leading indices
    c, s = np.cos(angles), np.sin(angles)
    rotated = np.concatenate([e1 * c - e2 * s, e1 * s + e2 * c], axis=-1)
    if not _close(rotated, actual, rtol, atol):
        return None
    return angles


def _wrap(angles: np.ndarray) -> np.ndarray:
    return (angles + np.pi) % (2 * np.pi) - np.pi


def rope_causes(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> list[str]:
    """What RoPE bugs show: ``actual`` is ``expected`` with each half-split pair rotated by angles
    ``delta[t, i]``: in proportion to the position t (``t * c_i``) with ``c_0 = 1``: a rotation the
    reference does not apply (values rotated too); ``c_0 = -1``: the rotation left out; ``c_0 = 0``:
    the frequencies differ (another base); the same for every position: positions shifted."""
    if expected.ndim == 1 and expected.shape == actual.shape and expected.size >= 2:
        return _frequency_causes(expected.astype(np.float64), actual.astype(np.float64))
    angles = _rotation_angles(expected, actual, rtol, atol)
    if angles is None or np.abs(angles).max() < 1e-3:
        return []
    tokens = np.arange(angles.shape[0])[:, None]
    tol = 1e-3 + 1e-3 * tokens
    step = angles[1]  # (H/2,): the angle per position, where proportional
    if np.abs(angles[0]).max() < 1e-3 and (np.abs(_wrap(angles - tokens * step)) < tol).all():
        if abs(step[0] - 1) < 1e-3:
            return [
                "RoPE applied where the reference applies none: yours is the reference's value rotated by "
                "position x frequency (the rotation applied to the values too, or twice)"
            ]
        if abs(step[0] + 1) < 1e-3:
            return [
                "RoPE missing: yours is the reference's value rotated back by position x frequency, the "
                "value before its rotation"
            ]
        if abs(step[0]) < 1e-3:
            return [
                "RoPE frequencies differ: yours is the reference's value rotated by position x (your "
                "frequency - the reference's), 0 for the first pair only (frequency 1 in any base): another "
                "RoPE base (theta), or another frequency scaling"
            ]
    k = float(angles[0, 0])  # k x frequency 1, the first pair's
    if (
        (np.abs(_wrap(angles - angles[0])) < 1e-3).all()
        and round(k) != 0
        and abs(k - round(k)) < 1e-3
        and (angles.shape[1] == 1 or np.ptp(angles[0]) > 1e-3)  # not one angle for every pair: a sign
    ):
        return [
            f"RoPE positions off by {round(k):+d}: yours is the reference's value rotated by "
            f"{round(k):+d} x frequency at every position (positions shifted for these rows only)"
        ]
    return []


def tiled_heads_cause(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> list[str]:
    """Key/value heads expanded in tile order where the reference repeats each (repeat_interleave)."""
    if expected.ndim < 3:
        return []
    heads = expected.shape[1]
    for size in range(2, heads):  # query heads per key/value head
        if heads % size:
            continue
        groups = heads // size
        kept = expected[:, ::size]  # (B, G, ...): the key/value heads
        if not _close(np.repeat(kept, size, axis=1), expected, rtol, atol):
            continue
        if _close(np.tile(kept, (1, size) + (1,) * (expected.ndim - 2)), actual, rtol, atol):
            return [
                f"key/value heads in tile order: your head n holds group n % {groups} (np.tile / jnp.tile), "
                f"the reference's group n // {size} (repeat_interleave / np.repeat: each key/value head "
                "repeated for its query heads)"
            ]
    return []


def which_norm(value: np.ndarray, of: np.ndarray, rtol: float, atol: float) -> str | None:
    """``"a layer norm"`` where ``value`` is ``(of - mean) / sqrt(variance + eps) * weight + bias``
    over the last axis (one weight and bias per feature, fitted; eps 1e-5 or 1e-6), ``"an RMS
    norm"`` where it is ``of / sqrt(mean square + eps) * weight``; None otherwise, and where the
    numbers cannot tell: fewer than three rows (a weight and a bias fit any two), a feature of
    ``value`` the same in every row, a row of ``of`` the same in every feature."""
    if value.shape != of.shape or of.ndim < 2 or of.shape[-1] < 2 or value.dtype.kind != "f":
        return None
    x, y = of.reshape(-1, of.shape[-1]).astype(np.float64), value.reshape(-1, of.shape[-1]).astype(np.float64)
    if x.shape[0] < 3 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return None
    if (np.ptp(y, axis=0) <= atol + rtol * np.abs(y).max()).any() or (np.ptp(x, axis=-1) == 0).any():
        return None  # a feature the same in every row (a weight of 0 fits it), or a row with no spread
    centred = x - x.mean(-1, keepdims=True)
    for eps in (1e-5, 1e-6):
        n = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps)
        dn, dy = n - n.mean(0), y - y.mean(0)  # least squares per feature: y = weight * n + bias
        with np.errstate(all="ignore"):
            weight = (dn * dy).sum(0) / (dn * dn).sum(0)
        fitted = weight * n + (y.mean(0) - weight * n.mean(0))
        if np.isfinite(fitted).all() and _close(fitted, y, rtol, atol):
            return "a layer norm"
        n = x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
        with np.errstate(all="ignore"):
            weight = (n * y).sum(0) / (n * n).sum(0)
        if np.isfinite(weight).all() and _close(weight * n, y, rtol, atol):
            return "an RMS norm"
    return None


def norm_causes(expected: np.ndarray, actual: np.ndarray) -> list[str]:
    """RMSNorm bugs: a (1 + weight) offset, or another eps under the square root."""
    if expected.ndim < 2 or not (np.isfinite(expected).all() and np.isfinite(actual).all()):
        return []
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    difference = a - e
    mean_square = np.mean(difference**2, axis=-1)
    if np.abs(difference).max() > 0 and np.allclose(mean_square, 1, rtol=1e-3, atol=0):
        with np.errstate(divide="ignore", invalid="ignore"):
            weight = e / difference
        flat = weight.reshape(-1, weight.shape[-1])
        if np.isfinite(flat).all() and np.allclose(flat, flat[:1], rtol=1e-3, atol=1e-4):
            return [
                "(1 + weight) offset: yours minus the reference's is the normalised value (mean square 1), "
                "yours multiplies by 1 + weight (Gemma's RMSNorm) where the reference multiplies by weight"
            ]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (a / e).reshape(-1, e.shape[-1])
    if (
        e.shape[-1] > 1
        and np.allclose(np.mean(e**2, axis=-1), 1, rtol=1e-3, atol=0)
        and np.isfinite(ratio).all()
        and np.allclose(ratio, ratio[:1], rtol=1e-4, atol=1e-6)
        and not np.allclose(ratio[0], 1, rtol=1e-4, atol=0)
    ):
        return [
            "yours is the reference's normalised value times one factor per feature, not its weight: a "
            "(1 + weight) offset (Gemma's RMSNorm) or another weight"
        ]
    if (e > 0).all() and (a > 0).all() and e.shape[-1] == 1 and not np.allclose(e, a, rtol=1e-9, atol=0):
        shift = 1 / a**2 - 1 / e**2  # 1/rsqrt(v + eps)^2 = v + eps
        if np.allclose(shift, np.median(shift), rtol=0.05, atol=0) and 0 < abs(np.median(shift)) < 1e-2:
            c = float(np.median(shift))
            which = "larger" if c > 0 else "smaller"
            return [
                f"eps differs: yours is 1/sqrt(mean square + eps) with eps {which} by {abs(c):.2g} than the "
                "reference's (the norm's eps)"
            ]
    return []
