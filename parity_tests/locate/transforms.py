"""Causes read as a transformation of the value due: where the candidate's value is no reference
value, it may still be one the reference computes, transformed the way a bug transforms it.

The reference values tried are the diverging one and those computed soon after it (with the steps
of fused operations, ``expand.steps``), against the candidate's shown value and the values its line
computed before it, each laid out as the candidate's value, or its slice the alignment paired the
candidate's value with (a port computing one query row at a time, blamed in its second iteration),
else its first slice (the first sequence, the first head: where a port loops, the first iteration
diverges first). The
transformations: the square root or the square of a statistic per row (a standard deviation for a
variance), the heads in another order along the model width (or a head written at another's
place), a square weight used transposed, an activation or a norm left out, one factor per row that
another eps under a norm's square root makes, NaN where the reference's weights are 0 (a softmax
over entries all hidden). Against the values the line takes: their last two axes transposed, their
numbers in another order, a reduction over another axis, a RoPE rotation applied or left out. The
line's tokens shifted or all the first token's; a scale the reference applies, applied with
another factor. Every cause is named only where the transformation reproduces the line's value
within tolerance.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from parity_tests.locate.activation import which_activation
from parity_tests.locate.align import (
    _LAYOUT,
    _PRODUCTS,
    Alignment,
    ancestors,
    blame_location,
    close,
    layout_classes,
    line_records,
    slicings,
    take_part,
    tolerance_of,
)
from parity_tests.locate.causes import (
    axis_names,
    describe_scale,
    norm_causes,
    rope_causes,
    scale_between,
    which_norm,
)
from parity_tests.locate.layout import atomic, in_layout
from parity_tests.locate.trace import Record

__all__ = ["due_value", "paired_part", "transform_causes"]

_SOON = 12  # the reference values tried: the diverging one and those computed this soon after it


Part = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def paired_part(alignment: Alignment) -> Part | None:
    """``(shape, axes, indices)``: the slice of the reference's counterpart (of ``shape``) that the
    alignment paired the blamed value with (``Alignment.counterpart_part``), None where it paired the
    whole value."""
    if alignment.counterpart_part is None:
        return None
    return (alignment.reference.records[alignment.counterpart].shape, *alignment.counterpart_part)


def due_value(
    value: np.ndarray, shape: tuple[int, ...], rules: dict[int, tuple[int, ...]], part: Part | None = None
) -> np.ndarray | None:
    """``value`` laid out in ``shape`` (see ``layout.in_layout``), or where it holds several values of
    that shape, its slice ``part`` (``paired_part``: where ``value`` has the shape that part is taken
    of) or else its first slice (index 0 along one or two of its atomic axes: ``(B*T, D)`` split into
    ``(B, T, D)``) laid out; None where none fits."""
    whole, size = in_layout(value, shape, rules), int(np.prod(shape))
    if whole is not None or size < 2 or value.size % size or value.size <= size:
        return whole
    if part is not None and value.shape == part[0]:
        paired = in_layout(take_part(value, part[1], part[2]), shape, rules)
        if paired is not None:
            return paired
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
            due = due_value(record.value, mine.shape, alignment.rules, paired_part(alignment))
            if due is not None and due.dtype.kind == "f":
                yield mine, record, due.astype(np.float64)


def _root_or_square(record: Record, due: np.ndarray, actual: np.ndarray, tols) -> str | None:
    """Yours the square root of ``record``'s value ``due``, or its square, where that is a statistic
    per row (its last axis of size 1: a variance or a standard deviation)."""
    if record.shape[-1:] != (1,) or (due < 0).any() or close(due, actual, *tols):
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


def _nan_where_hidden(record: Record, due: np.ndarray, actual: np.ndarray, tols) -> str | None:
    """Yours NaN exactly where the reference's value (``record``'s, ``due``) is 0, equal elsewhere:
    a softmax over entries all hidden (``exp(-inf - max)`` with ``max`` -inf)."""
    nan = np.isnan(actual)
    if not nan.any() or nan.all() or (due[nan] != 0).any() or np.isnan(due).any():
        return None
    if not close(due[~nan], actual[~nan], *tols):
        return None
    return (
        f"NaN where the reference's {record.label} ({record.location}) is 0: yours normalises over "
        "entries that are all hidden (exp(-inf - max) with max -inf): a softmax over the wrong axis, "
        "one whose entries the mask hides together"
    )


def _heads_order(due: np.ndarray, actual: np.ndarray, sizes: dict[str, int], tols) -> str | None:
    """Your head j holding the reference's head ``order[j]`` along the model width, not in order (a
    buffer filled head by head: the heads not written yet, zeros, left out)."""
    heads, width = sizes.get("head"), sizes.get("feature")
    if not heads or heads < 2 or due.shape[-1] != width or close(due, actual, *tols):
        return None
    mine = actual.reshape(*actual.shape[:-1], heads, -1)
    theirs = due.reshape(*due.shape[:-1], heads, -1)
    order = {}
    for j in range(heads):
        if not mine[..., j, :].any() and theirs[..., j, :].any():
            continue  # not written yet
        found = [i for i in range(heads) if close(theirs[..., i, :], mine[..., j, :], *tols)]
        if not found:
            return None
        order[j] = found[0]
    if all(i == j for j, i in order.items()) or len(set(order.values())) < len(order):
        return None
    if len(order) < heads:
        (j, i), *_ = ((j, i) for j, i in order.items() if i != j)
        return (
            f"heads in another order: your head {j} holds the reference's head {i} (heads "
            f"{sorted(set(range(heads)) - set(order))} not written yet): a head written at another "
            "head's place"
        )
    order = [order[j] for j in range(heads)]
    reversed_ = " (reversed)" if order == list(range(heads))[::-1] else ""
    return (
        f"heads in another order{reversed_}: your heads 0..{heads - 1} hold the reference's heads "
        f"{order}, each right: the heads split or merged in the wrong order"
    )


def _rearranged(alignment: Alignment, axes_of) -> str | None:
    """A value of the blamed line rearranges a reference value the line takes (one of the values its
    inputs hold, laid out as it): the last two axes transposed, or the same numbers in another
    order."""
    reference, candidate = alignment.reference, alignment.candidate
    classes = layout_classes(reference, alignment.rules)  # a value named by its step (the queries)
    line = line_records(candidate, alignment.shown)[::-1]
    for mine in (r for r in line if r.value.dtype.kind == "f" and r.value.size > 1 and r.value.ndim >= 2):
        held = [m.reference for s in mine.inputs for m in alignment.matches.get(s, []) if m.kind == "exact"]
        for record in (reference.records[r] for r in dict.fromkeys(held)):
            due = (
                in_layout(record.value, mine.shape, alignment.rules)
                if record.value.dtype.kind == "f"
                else None
            )
            if due is None:
                continue
            due, actual = due.astype(np.float64), mine.value.astype(np.float64)
            tols = tolerance_of(mine, record)
            if close(due, actual, *tols):
                continue
            named = next(
                (x for x in reference.records if x.step and classes[x.index] == classes[record.index]), record
            )
            where = f"the reference's {named.label} ({named.location})"
            if due.shape[-1] == due.shape[-2] and close(np.swapaxes(due, -1, -2), actual, *tols):
                names = axes_of(due.shape)
                return (
                    f"yours is {where} transposed over ({names[-2]}, {names[-1]}): the wrong axes "
                    "transposed or operands swapped"
                )
            if close(np.sort(due, axis=None), np.sort(actual, axis=None), *tols):
                return (
                    f"yours holds {where} in another order: a reshape without the transpose (heads split "
                    "or merged in the wrong order) or axes permuted"
                )
    return None


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


def _left_out(alignment: Alignment) -> str | None:
    """A reference value tried is an activation or a norm of a value the candidate holds, exactly,
    on the way to its shown value (the latest such value first): the step left out (a norm only
    where the blamed statement computes no norm of that value, with another eps say)."""
    reference, candidate = alignment.reference, alignment.candidate
    soon = _soon(alignment)
    shown = candidate.records[alignment.shown]
    rest = [  # the rest of the shown value's statement (x @ wte.T, shown at wte.T)
        r.index
        for r in candidate.records[shown.index + 1 :][: len(shown.inputs) + 8]
        if r.location == shown.location and r.loops == shown.loops and r.calls == shown.calls
    ]
    taken = set().union(*(ancestors(candidate, r) for r in [shown.index, *rest])) - set(rest)
    statement = [*line_records(candidate, shown.index), *(candidate.records[r] for r in rest)]
    computed_from = {x.index: _elementwise_sources(reference, x.index) for x in soon}  # "of it"
    for source in sorted(taken, reverse=True):
        held = [m.reference for m in alignment.matches.get(source, []) if m.kind == "exact"]
        held += [r for r, _, _ in alignment.parts.get(source, [])]
        for given, record in (
            (reference.records[r], x) for r in held for x in soon if r in computed_from[x.index]
        ):
            mine = candidate.records[source].value  # the reference's value, or a slice of it
            due = due_value(record.value, mine.shape, alignment.rules, paired_part(alignment))
            if due is None:
                continue
            where = f"the reference's {given.label} ({candidate.records[source].location}) as it is"
            which = which_activation(due, mine, record)
            if which is not None and not _activation_begun(candidate, source, taken, statement):
                return (
                    f"activation left out: yours goes on with {where}, where the reference computes "
                    f"{which} of it ({record.location})"
                )
            tols = tolerance_of(record, record)
            which = which_norm(due, mine, *tols)
            if which is not None and not _norm_begun(candidate, source, taken, statement, tols):
                return (
                    f"norm left out: yours goes on with {where}, where the reference computes {which} "
                    f"of it ({record.location})"
                )
    return None


def _elementwise_sources(trace, index: int) -> set[int]:
    """The values record ``index`` is computed from through values of its size alone (an
    activation or a norm of a value: elementwise or row by row, the weights and statistics aside)."""
    size, found, frontier = trace.records[index].value.size, set(), [index]
    while frontier:
        current = frontier.pop()
        for source in trace.records[current].inputs:
            if source not in found and trace.records[source].value.size == size:
                found.add(source)
                frontier.append(source)
    return found


def _activation_begun(candidate, source: int, taken: set[int], statement: list[Record]) -> bool:
    """Whether the candidate computes, on the way to the blamed value, a function of its value
    ``source`` entry by entry (a power, a product with a constant, a tanh: an activation of it, right
    or wrong, not left out): an operation of its size taking it and no other value but constants,
    neither a product with a weight nor a layout change."""
    size = candidate.records[source].value.size
    for r in (candidate.records[t] for t in sorted(taken | {r.index for r in statement})):
        others = [s for s in r.inputs if s != source and candidate.records[s].leaf != "constant"]
        name = r.call.split(".")[-1]
        if source in r.inputs and not others and r.value.size == size and name not in (*_PRODUCTS, *_LAYOUT):
            return True
    return False


def _norm_begun(candidate, source: int, taken: set[int], statement: list[Record], tols) -> bool:
    """Whether the candidate begins a norm of its value ``source`` on the way to the blamed value: a
    statistic of it taken (a mean over some axis; not a product with a weight), or the blamed
    statement computing a norm of it (with another eps, say)."""
    mine = candidate.records[source].value
    inside = {source}  # the values computed from it on the way
    for r in (candidate.records[t] for t in sorted(taken | {r.index for r in statement})):
        if source in r.inputs and r.value.size < mine.size and r.call.split(".")[-1] not in _PRODUCTS:
            return True
        if r.index > source and set(r.inputs) & inside:
            inside.add(r.index)
            if any(_row_statistic(candidate, s, mine) for s in r.inputs if s not in inside):
                return True  # divided or multiplied by a statistic per row: a norm, right or wrong
    return any(which_norm(r.value, mine, *tols) for r in statement)


def _row_statistic(candidate, index: int, of: np.ndarray) -> bool:
    """Whether candidate record ``index`` is one number per row of a value like ``of`` (its last axis
    1, the others as ``of``'s) computed from the data (a variance, a mean), not from weights alone."""
    record = candidate.records[index]
    if record.leaf is not None or record.value.ndim != of.ndim or record.value.ndim < 2:
        return False
    if record.shape[-1] != 1 or of.shape[-1] < 2 or record.shape[:-1] != of.shape[:-1]:
        return False
    return bool(
        ancestors(candidate, index)
        & {r.index for r in candidate.records if (r.leaf or "").startswith("input")}
    )


def _tokens_moved(alignment: Alignment, sizes: dict[str, int]) -> str | None:
    """A value of the blamed line is a reference value the diverging one is computed from (or one
    tried) with its tokens moved: shifted along the token axis (token t holding the reference's
    token t + k), or every token holding the reference's first (positions never advanced)."""
    tokens = sizes.get("tokens", 0)
    if tokens < 3:
        return None
    reference = alignment.reference
    diverging = reference.records[alignment.diverging]
    tried = [reference.records[s] for s in diverging.inputs if reference.records[s].leaf is None]
    tried += _soon(alignment)
    line = line_records(alignment.candidate, alignment.shown)[::-1]
    for mine in (r for r in line if r.value.dtype.kind == "f" and tokens in r.shape):
        axis = mine.shape.index(tokens)
        actual = np.moveaxis(mine.value.astype(np.float64), axis, 0)
        for record in tried:
            due = due_value(record.value, mine.shape, alignment.rules, paired_part(alignment))
            if due is None or due.dtype.kind != "f":
                continue
            due = np.moveaxis(due.astype(np.float64), axis, 0)
            tols = tolerance_of(mine, record)
            if close(due, actual, *tols) or not np.isfinite(due).all():
                continue
            where = f"the reference's {record.label} ({record.location})"
            if close(np.broadcast_to(due[:1], due.shape), actual, *tols) and not close(
                due[:1], due[1:2], *tols
            ):
                return (
                    f"every token holds token 0 of {where}: the positions never advance (an index of "
                    "zeros, or one position for all)"
                )
            for k in (*range(1, tokens - 1), *range(-1, 2 - tokens, -1)):
                if close(due[k:] if k > 0 else due[:k], actual[:-k] if k > 0 else actual[-k:], *tols):
                    return (
                        f"tokens shifted by {k:+d}: your token t holds {where} at token t "
                        f"{'+' if k > 0 else '-'} {abs(k)} (positions counted from {k}, an arange from "
                        f"{k} or an offset added)"
                    )
    return None


_REDUCTIONS = {"mean": np.mean, "sum": np.sum, "maximum": np.max, "variance": np.var}


def _reduced_elsewhere(alignment: Alignment, sizes: dict[str, int]) -> str | None:
    """A value of the blamed line reduces a reference value the line takes over one axis (a mean
    with ``keepdims``), where a reference value tried is the same reduction over another axis."""
    reference, candidate = alignment.reference, alignment.candidate
    line = line_records(candidate, alignment.shown)
    own = {r.index for r in line}
    sources = dict.fromkeys(s for r in line for s in r.inputs if s not in own)
    soon = _soon(alignment)
    for mine in (r for r in line[::-1] if r.value.dtype.kind == "f" and 1 in r.shape):
        for source in sources:
            held = [m.reference for m in alignment.matches.get(source, []) if m.kind == "exact"]
            given = reference.records[held[0]] if held else None
            x = candidate.records[source].value
            if given is None or given.shape != x.shape or x.ndim != mine.value.ndim or x.dtype.kind != "f":
                continue
            x, reduced = x.astype(np.float64), mine.value.astype(np.float64)
            axes = [a for a in range(x.ndim) if mine.shape[a] == 1 and x.shape[a] > 1]
            if len(axes) != 1 or any(mine.shape[a] != x.shape[a] for a in range(x.ndim) if a != axes[0]):
                continue
            tols, theirs = tolerance_of(mine, given), given.value.astype(np.float64)
            for name, reduce in _REDUCTIONS.items():
                if not close(reduce(x, axis=axes[0], keepdims=True), reduced, *tols):
                    continue
                for record in soon:
                    other = [b for b in range(x.ndim) if record.shape == (*x.shape[:b], 1, *x.shape[b + 1 :])]
                    other = [b for b in other if b != axes[0] and x.shape[b] > 1]
                    if other and close(reduce(theirs, axis=other[0], keepdims=True), record.value, *tols):
                        names = axis_names(x.shape, sizes)
                        return (
                            f"{name} over the wrong axis: yours is the {name} of the reference's "
                            f"{given.label} over its {names[axes[0]]} axis, the reference's {record.label} "
                            f"({record.location}) over its {names[other[0]]} axis"
                        )
    return None


def _rotated(alignment: Alignment) -> str | None:
    """A value the blamed statement computes (the helpers it calls included) that matches no
    reference value is, by ``rope_causes``, a rotation of a reference value: one a value the
    statement takes holds (the values rotated too), or one tried (the keys' rotation left out)."""
    reference, candidate = alignment.reference, alignment.candidate
    location = blame_location(alignment)
    run = []
    for record in candidate.records[alignment.blamed :]:
        if record.location != location and all(at != location for at, _ in record.stack):
            break
        run.append(record)
    taken = dict.fromkeys(s for r in run for s in r.inputs if s < alignment.blamed)
    held = [
        reference.records[m.reference]
        for s in taken
        for m in alignment.matches.get(s, [])
        if m.kind == "exact"
    ]
    soon = _soon(alignment)
    for mine in reversed(run):
        if mine.value.dtype.kind != "f" or mine.value.ndim < 2 or mine.index in alignment.matches:
            continue
        laid_out = [(r, in_layout(r.value, mine.shape, alignment.rules)) for r in held]
        part = paired_part(alignment)
        laid_out += [(r, due_value(r.value, mine.shape, alignment.rules, part)) for r in soon]
        for record, due in laid_out:
            if due is not None and due.dtype.kind == "f":
                found = rope_causes(
                    due.astype(np.float64), mine.value.astype(np.float64), *tolerance_of(mine, record)
                )
                if found:
                    return found[0]
    used = ancestors(reference, reference.output)
    for given in held:  # a value the statement takes, which the reference rotates before it goes on
        for later in reference.records[given.index + 1 : given.index + 1 + 4 * _SOON]:  # RoPE comes soon
            if later.index not in used or later.shape != given.shape or later.value.dtype.kind != "f":
                continue
            found = rope_causes(
                later.value.astype(np.float64), given.value.astype(np.float64), *tolerance_of(later, given)
            )
            if found and found[0].startswith("RoPE missing"):
                return (
                    f"{found[0]}: this line takes it unrotated, the reference rotates it ({later.location})"
                )
    return None


def _scale_differs(alignment: Alignment, sizes: dict[str, int]) -> str | None:
    """A value of the blamed line is a reference value times a factor it is not due: the value the
    reference's scale makes (``q @ k.T / sqrt(head_dim)``) times a factor other than 1, or a value
    computed before that scale (the queries) times one other than 1 and than the scale (a port may
    scale early)."""
    if not alignment.factors:
        return None
    reference, due_scale = alignment.reference, alignment.factors[0]
    scaling = [
        r
        for r in reference.records
        if r.index in alignment.scaled and not any(s in alignment.scaled for s in r.inputs)
    ]
    before = set().union(*(ancestors(reference, r.index) for r in scaling)) - {r.index for r in scaling}
    tried = scaling + [r for r in reference.records if r.index in before and r.leaf is None]
    tried = [r for r in tried if r.shape[-1:] != (1,)]  # not a statistic per row (a norm's mean)
    line = line_records(alignment.candidate, alignment.shown)[::-1]
    for mine in (r for r in line if r.value.dtype.kind == "f" and r.value.size > 1):
        for record in tried:
            due = due_value(record.value, mine.shape, alignment.rules, paired_part(alignment))
            if due is None or due.dtype.kind != "f":
                continue
            factor = scale_between(
                due.astype(np.float64), mine.value.astype(np.float64), *tolerance_of(mine, record)
            )
            if factor is None or abs(factor - 1) < 1e-3 or abs(factor / due_scale - 1) < 1e-3:
                continue
            where = f"the reference's {record.label} ({record.location})"
            if record in scaling:
                return (
                    f"scale differs: yours is {where} times {describe_scale(factor, sizes)}: scaled by "
                    f"{describe_scale(due_scale * factor, sizes)} where "
                    f"{describe_scale(due_scale, sizes)} is due"
                )
            return (
                f"scale differs: yours is {where} scaled by {describe_scale(factor, sizes)}, where the "
                f"reference scales by {describe_scale(due_scale, sizes)} ({scaling[0].location})"
            )
    return None


def transform_causes(alignment: Alignment, sizes: dict[str, int]) -> list[str]:
    """The causes that the candidate's shown value shows as a transformation of a reference value
    computed at or soon after the diverging one (see the module's docstring); empty where none fits."""
    shown = alignment.candidate.records[alignment.shown]
    if shown.value.dtype.kind != "f":
        return []
    left_out = _left_out(alignment)
    if left_out is not None:
        return [left_out]
    found = (
        _rearranged(alignment, lambda shape: axis_names(shape, sizes))
        or _tokens_moved(alignment, sizes)
        or _reduced_elsewhere(alignment, sizes)
        or _rotated(alignment)
    )
    if found is not None:
        return [found]
    for mine, record, due in _tried(alignment):
        actual, tols = mine.value.astype(np.float64), tolerance_of(mine, record)
        found = (
            _nan_where_hidden(record, due, actual, tols)
            or _root_or_square(record, due, actual, tols)
            or _heads_order(due, actual, sizes, tols)
            or _weight_transposed(record, alignment, actual, tols)
        )
        if found is not None:
            return [found]
        eps = _eps_differs(due, actual, alignment, tols)
        if eps:
            return eps
    found = _scale_differs(alignment, sizes)
    return [] if found is None else [found]
