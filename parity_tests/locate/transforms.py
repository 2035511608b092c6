"""Causes read as a transformation of the value due: where the candidate's value is no reference
value, it may still be one the reference computes, transformed the way a bug transforms it.

The reference values tried are the diverging one and those computed soon after it (with the steps
of fused operations, ``expand.steps``), against the candidate's shown value and the values its line
computed before it, each laid out as the candidate's value, or its first slice
(the first sequence, the first head: where a port loops, the first iteration diverges first). The
transformations: the square root or the square (a standard deviation for a variance), the heads in
another order along the model width, a square weight used transposed, an activation left out, one
factor per row that another eps under a norm's square root makes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from parity_tests.locate.activation import which_activation
from parity_tests.locate.align import (
    Alignment,
    ancestors,
    close,
    line_records,
    slicings,
    take_part,
    tolerance_of,
)
from parity_tests.locate.causes import norm_causes
from parity_tests.locate.layout import atomic, in_layout
from parity_tests.locate.trace import Record

__all__ = ["due_value", "transform_causes"]

_SOON = 12  # the reference values tried: the diverging one and those computed this soon after it


def due_value(
    value: np.ndarray, shape: tuple[int, ...], rules: dict[int, tuple[int, ...]]
) -> np.ndarray | None:
    """``value`` laid out in ``shape`` (see ``layout.in_layout``), or where it holds several values of
    that shape, its first slice (index 0 along one or two of its atomic axes: ``(B*T, D)`` split into
    ``(B, T, D)``) laid out; None where neither fits."""
    whole, size = in_layout(value, shape, rules), int(np.prod(shape))
    if whole is not None or size < 2 or value.size % size or value.size <= size:
        return whole
    n, value = value.size // size, atomic(value, rules)
    for axes in slicings(value.shape, n):
        part = in_layout(take_part(value, axes, (0,) * len(axes)), shape, rules)
        if part is not None:
            return part
    return None


def _soon(alignment: Alignment) -> list[Record]:
    """The reference values tried: the diverging one, those computed soon after it, their steps."""
    reference = alignment.reference
    used = ancestors(reference, reference.output)
    soon = [r for r in reference.records[alignment.diverging :] if r.leaf is None][:_SOON]
    return [r for r in soon if r.index in used or r.expands in {s.index for s in soon}]


def _tried(alignment: Alignment) -> Iterator[tuple[Record, Record, np.ndarray]]:
    """``(yours, reference record, its value laid out as yours)``: the shown value, then the values
    its line computed before it (a NumPy statement's sub-expressions: ``variance + eps`` in
    ``(x - mean) / (variance + eps)``), each against the reference values tried."""
    line = line_records(alignment.candidate, alignment.shown)[::-1]
    soon = _soon(alignment)
    for mine in (r for r in line if r.value.dtype.kind == "f" and r.value.size > 1):
        for record in soon:
            due = due_value(record.value, mine.shape, alignment.rules)
            if due is not None and due.dtype.kind == "f":
                yield mine, record, due.astype(np.float64)


def _root_or_square(record: Record, due: np.ndarray, actual: np.ndarray, tols) -> str | None:
    """Yours the square root of ``record``'s value ``due``, or its square."""
    if (due < 0).any() or close(due, actual, *tols):
        return None
    where = f"the reference's {record.label} ({record.location})"
    if close(np.sqrt(due), actual, *tols):
        return f"yours is the square root of {where}: a standard deviation where the variance is due"
    if close(due**2, actual, *tols):
        return f"yours is the square of {where}: a variance where the standard deviation is due"
    return None


def _eps_differs(due: np.ndarray, actual: np.ndarray, alignment: Alignment, tols) -> list[str]:
    """Yours the reference's value times one factor per row, where that factor times a reference
    value of one entry per row, ``1/sqrt(mean square + eps)``, is the same with another eps (a
    norm's eps)."""
    if due.shape[-1] < 2 or close(due, actual, *tols):
        return []
    with np.errstate(all="ignore"):
        factor = (due * actual).sum(-1, keepdims=True) / (due * due).sum(-1, keepdims=True)
    if not np.isfinite(factor).all() or not close(factor * due, actual, *tols):
        return []
    for record in _soon(alignment):
        scale = due_value(record.value, factor.shape, alignment.rules)
        if scale is not None and scale.dtype.kind == "f" and (scale > 0).all():
            found = norm_causes(scale.astype(np.float64), scale * factor)
            if found:
                return found
    return []


def _heads_order(due: np.ndarray, actual: np.ndarray, sizes: dict[str, int], tols) -> str | None:
    """Your head j holding the reference's head ``order[j]`` along the model width, not in order."""
    heads, width = sizes.get("head"), sizes.get("feature")
    if not heads or heads < 2 or due.shape[-1] != width or close(due, actual, *tols):
        return None
    mine = actual.reshape(*actual.shape[:-1], heads, -1)
    theirs = due.reshape(*due.shape[:-1], heads, -1)
    order = []
    for j in range(heads):
        found = [i for i in range(heads) if close(theirs[..., i, :], mine[..., j, :], *tols)]
        if not found:
            return None
        order.append(found[0])
    if sorted(order) != list(range(heads)):
        return None
    reversed_ = " (reversed)" if order == list(range(heads))[::-1] else ""
    return (
        f"heads in another order{reversed_}: your heads 0..{heads - 1} hold the reference's heads "
        f"{order}, each right: the heads split or merged in the wrong order"
    )


def _weight_transposed(record: Record, alignment: Alignment, actual: np.ndarray, tols) -> str | None:
    """A product of the reference's with a square weight, where yours is it with the weight transposed."""
    reference = alignment.reference
    for source in record.inputs:
        weight = reference.records[source]
        if weight.leaf is None or weight.value.ndim != 2 or weight.value.shape[0] != weight.value.shape[1]:
            continue
        w = weight.value.astype(np.float64)
        for other in record.inputs:
            x = reference.records[other].value
            if other == source or x.ndim < 1 or x.shape[-1] != w.shape[0] or x.dtype.kind != "f":
                continue
            x = x.astype(np.float64)
            for used, wrong in ((x @ w, x @ w.T), (x @ w.T, x @ w)):
                rest = (record.value - used).reshape(-1, w.shape[1])  # the bias, where the record is
                if not close(np.broadcast_to(rest[:1], rest.shape), rest, *tols):  # the product plus one
                    continue
                rest = rest.reshape(record.shape)
                due = due_value(rest + wrong, actual.shape, alignment.rules)
                if due is not None and close(due, actual, *tols):
                    return (
                        f"weight transposed: yours is the reference's {record.label} ({record.location}) "
                        f"with {weight.leaf} transposed: an (out, in) weight used as (in, out) or the "
                        "other way round (square, so no shape error shows it)"
                    )
    return None


def _activation_left_out(alignment: Alignment) -> str | None:
    """A reference value tried is an activation of a value the candidate holds, exactly, on the way
    to its shown value (the latest such value first)."""
    reference, candidate = alignment.reference, alignment.candidate
    soon = _soon(alignment)
    for source in sorted(ancestors(candidate, alignment.shown), reverse=True):
        held = [m.reference for m in alignment.matches.get(source, []) if m.kind == "exact"]
        held += [r for r, _, _ in alignment.parts.get(source, [])]
        for given, record in ((reference.records[r], x) for r in held for x in soon if r < x.index):
            mine = candidate.records[source].value  # the reference's value, or a slice of it
            due = due_value(record.value, mine.shape, alignment.rules)
            which = None if due is None else which_activation(due, mine, record)
            if which is not None:
                return (
                    f"activation left out: yours goes on with the reference's {given.label} "
                    f"({candidate.records[source].location}) as it is, where the reference computes "
                    f"{which} of it ({record.location})"
                )
    return None


def transform_causes(alignment: Alignment, sizes: dict[str, int]) -> list[str]:
    """The causes that the candidate's shown value shows as a transformation of a reference value
    computed at or soon after the diverging one (see the module's docstring); empty where none fits."""
    shown = alignment.candidate.records[alignment.shown]
    if shown.value.dtype.kind != "f":
        return []
    left_out = _activation_left_out(alignment)
    if left_out is not None:
        return [left_out]
    for mine, record, due in _tried(alignment):
        actual, tols = mine.value.astype(np.float64), tolerance_of(mine, record)
        found = (
            _root_or_square(record, due, actual, tols)
            or _heads_order(due, actual, sizes, tols)
            or _weight_transposed(record, alignment, actual, tols)
        )
        if found is not None:
            return [found]
        eps = _eps_differs(due, actual, alignment, tols)
        if eps:
            return eps
    return []
