"""Align two traces by their values and find where the candidate first goes wrong.

Every candidate value is compared with every reference value of the same size (a cheap
fingerprint first) in the candidate's layout (``layout.in_layout``), in float64 with the dtype
table's tolerance. A match is exact, or soft where a legitimate difference remains: a scale the
reference itself applies elsewhere (queries pre-scaled instead of scores), or a finite fill
(``-1e9``, ``finfo.min``) where the reference has ``-inf``. A value is *good* when it matches or
when something computed from it on the way to the output matches (a legitimate intermediate the
reference never holds); the first value on the way to the output that is not good is where the
candidate goes wrong, and likewise for the reference. When that value is computed from a value
that holds another reference value than the one expected there (values projected with the key
weights, operands swapped), the line that produced the misrouted value is blamed instead.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from parity_tests.locate.layout import in_layout, split_rules
from parity_tests.locate.trace import Record, Trace
from parity_tests.tolerances import tolerance_for

__all__ = [
    "Alignment",
    "Match",
    "align",
    "ancestors",
    "blame_location",
    "close",
    "hides",
    "layout_classes",
    "line_inputs",
    "line_records",
    "match_values",
    "once",
    "scale_left_out",
    "slicings",
    "take_part",
    "tolerance_of",
]

_VERY_NEGATIVE = -1e4  # a fill at or below this (-1e9, finfo.min) stands for -inf


@dataclass(frozen=True)
class Match:
    """A candidate value holds reference record ``reference``'s numbers: ``kind`` is ``"exact"``
    (same layout or a legitimate layout change), ``"scale"`` (times ``scale``), ``"fill"`` (a
    finite fill for ``-inf``) or ``"negated"`` (a boolean mask of the other convention)."""

    reference: int
    kind: str
    scale: float = 1.0


@dataclass
class Alignment:
    """``matches[c]``: what candidate record ``c`` matches; ``blamed``: the candidate record where
    the candidate first goes wrong; ``diverging``: the first reference record no candidate value
    reproduces; ``shown``: the value of the blamed line shown in the report (its last operation's);
    ``counterpart``: the reference record the shown value should have equalled; ``scaled``: the
    reference records computed after its scale was applied; ``parts``: for a candidate value that
    holds no reference value whole, the parts it holds as ``(reference record, axes, indices)`` (one
    head of the reference's values, computed in a loop over heads, or one batch entry's head in a
    loop over both); ``factors``: the scales the
    reference applies (those its ``scaled`` records are computed after); ``counterpart_part``:
    ``(axes, indices)`` where the shown value should have equalled that slice of the counterpart
    (one head's value in a loop over heads); ``unwritten``: the blamed buffer (``np.zeros``) whose
    writes never covered it, the shown value being what the last write made of it; ``unmasked_scores``:
    where the blamed value is a fused attention call hiding nothing (torch's
    ``scaled_dot_product_attention`` without ``is_causal`` or a mask), the scores it computed inside,
    set against the reference's first masked value (``counterpart``); ``stopped``: the step of a
    fused reference operation the blamed value equals, where the operation's result is due
    (``_through_steps``); ``steps[c]``: the steps of fused reference operations (``Record.expands``)
    candidate record ``c`` holds, whole or as a slice, where it holds no other reference value;
    ``residual``: the reference's sum (a residual connection) the blamed value should have been
    added into; ``swapped``: the blamed value is a split binding two operands the wrong way round;
    ``scaled_parts``: ``(candidate record, reference record)`` of the slices held at a scale;
    ``weights``: ``(the reference weight the blamed value takes, the one due there)`` where it takes
    another layer's weights (``_other_weights``); ``taken``: the value of another variable the
    blamed one takes (its numbers used right elsewhere); ``repeated[c]``: the slice candidate record
    ``c`` holds as the same line did in an earlier iteration of its loop (``_repeated``), no longer
    among its ``parts``; ``duplicate``: ``(held, due, original)`` where the blamed value holds the
    reference's ``held`` (its keys) a second time, computed apart from candidate record
    ``original``, where its sibling ``due`` (its values) is due and held nowhere (``_duplicated``);
    ``settled``: the reference records past the softmax its scale is applied before (``_settled``)."""

    reference: Trace
    candidate: Trace
    rules: dict[int, tuple[int, ...]]
    matches: dict[int, list[Match]] = field(default_factory=dict)
    output_ok: bool = False
    blamed: int | None = None
    diverging: int | None = None
    counterpart: int | None = None
    verified: list[int] = field(default_factory=list)
    good: set[int] = field(default_factory=set)
    rerouted_from: int | None = None
    shown: int | None = None
    scaled: set[int] = field(default_factory=set)
    parts: dict[int, list[tuple[int, tuple[int, ...], tuple[int, ...]]]] = field(default_factory=dict)
    factors: list[float] = field(default_factory=list)
    counterpart_part: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    unwritten: int | None = None
    unmasked_scores: np.ndarray | None = None
    stopped: int | None = None
    steps: dict[int, list[int]] = field(default_factory=dict)
    residual: int | None = None
    swapped: bool = False
    scaled_parts: set[tuple[int, int]] = field(default_factory=set)
    weights: tuple[int, int] | None = None
    taken: int | None = None
    repeated: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    duplicate: tuple[int, int, int] | None = None
    settled: set[int] = field(default_factory=set)


def _comparable(record: Record) -> bool:
    return record.value.dtype.kind in "fcb" and record.value.size > 0


def tolerance_of(a: Record, b: Record) -> tuple[float, float]:
    return _tolerance(a.dtype, b.dtype)


@functools.cache
def _tolerance(*dtypes: str) -> tuple[float, float]:
    """``(rtol, atol)`` between values of dtypes named ``dtypes``, any but a float's as float64."""
    return tolerance_for(
        *(d if d in ("float16", "bfloat16", "float32", "float64") else "float64" for d in dtypes)
    )


def close(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float, fill: bool = False) -> bool:
    """``|actual - expected| <= atol + rtol * max|expected|`` over finite entries, NaN and inf at the
    same places; with ``fill``, entries at or below -1e4 on both sides count as equal."""
    e, a = np.asarray(expected), np.asarray(actual)
    if e.dtype.kind != "f" or a.dtype.kind != "f":
        e, a = e.astype(np.float64), a.astype(np.float64)
    if fill:
        low_e, low_a = e <= _VERY_NEGATIVE, a <= _VERY_NEGATIVE
        if not np.array_equal(low_e, low_a):
            return False
        e, a = np.where(low_e, 0.0, e), np.where(low_a, 0.0, a)
    finite = np.isfinite(e)
    if not np.array_equal(finite, np.isfinite(a)):
        return False
    if not finite.all():
        if not np.array_equal(e[~finite], a[~finite], equal_nan=True):
            return False
        e, a = e[finite], a[finite]
    if e.size == 0:
        return True
    difference = np.abs(a.astype(np.float64) - e)  # in float64: the two may differ in precision
    return float(difference.max()) <= atol + rtol * float(np.abs(e).max())


@dataclass(frozen=True)
class _Fingerprint:
    """Layout-invariant summaries of a value: a pair can only match when these agree."""

    nan: int
    posinf: int
    neginf: int
    low: int  # entries at or below -1e4 (-inf included): masked positions, whatever the fill
    total: float  # sum of the finite entries
    largest: float  # max |finite entry|
    largest_kept: float  # max |entry| over the finite entries above -1e4


def _fingerprint(value: np.ndarray) -> _Fingerprint:
    row = _table(value.reshape(1, -1))
    return _Fingerprint(*(field[0].item() for field in row))


def _table(rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """The fingerprint of each row of a 2-D array, field by field (``_Fingerprint``'s order)."""
    v = rows if rows.dtype.kind == "f" else rows.astype(np.float64)
    finite = np.isfinite(v)
    low = v <= _VERY_NEGATIVE
    empty = v.shape[1] == 0
    if finite.all():  # no NaN nor inf to count or leave out
        none = np.zeros(len(v), dtype=np.intp)
        magnitude, kept = np.abs(v), np.ascontiguousarray(v)
        counts = (none, none, none)
    else:
        magnitude, kept = np.where(finite, np.abs(v), 0.0), np.where(finite, v, 0.0)
        counts = (np.isnan(v).sum(1), (v == np.inf).sum(1), (v == -np.inf).sum(1))
    return (
        *counts,
        low.sum(1),
        kept.sum(1, dtype=np.float64),
        np.zeros(len(v)) if empty else magnitude.max(1).astype(np.float64),
        np.zeros(len(v)) if empty else np.where(low, 0.0, magnitude).max(1).astype(np.float64),
    )


def _worth_comparing(
    fc: _Fingerprint,
    table: tuple[np.ndarray, ...],
    size: int,
    c_kind: str,
    r_kinds: np.ndarray,
    tolerances: tuple[np.ndarray, np.ndarray],
    legit: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """The rows of ``table`` (reference values or slices of ``size`` entries, of dtype kinds
    ``r_kinds``) whose fingerprint lets candidate fingerprint ``fc`` hold them: ``_match``'s test,
    for all rows at once. ``tolerances``: each row's ``(rtol, atol)``; ``legit``: each row's
    legitimate scales (a 2-D array, NaN-padded) and whether it has any."""
    nan, posinf, neginf, low, total, largest, largest_kept = table
    rtol, atol = tolerances
    bound = atol + rtol * largest
    hit = (
        (nan == fc.nan) & (posinf == fc.posinf) & (neginf == fc.neginf)
        & (np.abs(fc.largest - largest) <= bound)
        & (np.abs(fc.total - total) <= size * bound + 1e-9)
    )  # fmt: skip
    if c_kind == "b":  # or a mask of the other convention: a float row of zeros and ones
        ones = (nan == 0) & (posinf == 0) & (neginf == 0) & ((largest == 0) | (largest == 1))
        return hit | (r_kinds == "b") | ((r_kinds == "f") & ones)
    if c_kind == "f":
        floating = (r_kinds == "f") & (low == fc.low)
        hit |= floating & (fc.low > 0)
        factors, some = legit
        if some.any():
            near = (
                np.abs(fc.largest_kept - factors * largest_kept[:, None])
                <= 1e-3 * fc.largest_kept + atol[:, None]
            )
            hit |= floating & some & near.any(axis=1)
    return hit


def _scale_between(reference: _Fingerprint, value: _Fingerprint) -> float | None:
    """The positive ``s`` with ``value = s * reference`` if any, from their largest unmasked entries
    (the comparison that follows decides whether it holds)."""
    if reference.largest_kept == 0 or value.largest_kept == 0:
        return None
    return value.largest_kept / reference.largest_kept


def _reference_scales(
    trace: Trace, rules: dict[int, tuple[int, ...]], prints: dict, side: str = "r"
) -> tuple[list[float], set[int], set[int]]:
    """Scales the reference applies on the way to its attention weights (a value ``s`` times its
    input, that a softmax or a product of two computed values takes a few operations on: the
    scores' scale or the queries', never GELU's ``0.5 * x``), or ``H**-0.5`` for the head sizes
    ``H`` its reshapes show when it applies none (an opaque reference); and the records computed
    after a scale was applied (the scaling records and what they feed), and those where no scale is
    pending (``_settled``). ``side`` is the trace's key in ``prints``: ``"c"`` reads the candidate's."""
    scales, scaling = [], set()
    consumers: dict[int, list[int]] = {}
    for record in trace.records:
        for source in record.inputs:
            consumers.setdefault(source, []).append(record.index)
    weights = _weight_derived(trace) | {r.index for r in trace.records if r.leaf is not None}
    for record in trace.records:
        for source in record.inputs:
            r = trace.records[source].value
            if r.shape == record.value.shape and (side, record.index) in prints and r.dtype.kind == "f":
                s = _scale_between(prints[(side, source)], prints[(side, record.index)])
                if (
                    s is not None
                    and abs(s - 1) > 1e-3
                    and close(s * r, record.value, 1e-5, 1e-6, True)
                    and _feeds_attention(trace, record.index, consumers, weights)
                ):
                    scales.append(s)
                    scaling.add(record.index)
    if not scales:
        scales = [h**-0.5 for parts in rules.values() if len(parts) == 2 for h in parts[-1:]]
    scaled: set[int] = set()
    for record in trace.records:
        if record.index in scaling or any(source in scaled for source in record.inputs):
            scaled.add(record.index)
    return scales, scaled, _settled(trace, scaling, scaled)


def _settled(trace: Trace, scaling: set[int], scaled: set[int]) -> set[int]:
    """The records computed from a softmax of scaled values (the attention weights, and all that
    follows from them: the context, the residual stream, the next layers), ``scaling`` the records
    applying the scales: no scale applied before that softmax is pending past it, so a value there
    that is the reference's times a scale's factor is wrong, not scaled at another place (GELU
    without its 0.5 where the scores' scale is 0.5). Empty where the reference scales again after
    such a softmax (a train-mode dropout's ``1 / (1 - p)``): a scale may be pending there."""
    settled: set[int] = set()
    for record in trace.records:
        name = record.call.split(".")[0]
        softmax = "softmax" in name and record.expands is None and any(s in scaled for s in record.inputs)
        if softmax or any(s in settled for s in record.inputs):
            settled.add(record.index)
    return set() if scaling & settled else settled


def _feeds_attention(trace: Trace, index: int, consumers: dict[int, list[int]], weights: set[int]) -> bool:
    """Whether record ``index`` goes, within four operations, into a softmax or into a product of
    two values that are not weights (``q @ k.T``)."""
    frontier, seen = [index], {index}
    for _ in range(4):
        following = []
        for current in frontier:
            for consumer in consumers.get(current, []):
                record = trace.records[consumer]
                name = record.call.split(".")[0]
                computed = [s for s in record.inputs if s not in weights]
                if "softmax" in name or (name in _PRODUCTS and len(computed) >= 2):
                    return True
                if consumer not in seen:
                    seen.add(consumer)
                    following.append(consumer)
        frontier = following
    return False


def _legitimate(r: int, c: int, scales) -> list[float]:
    """The scales a candidate value ``c`` may hold reference value ``r`` at (see ``_match``)."""
    factors, scaled, scaled_c, settled = scales
    if r in settled:  # past the softmax: no scale pending
        return []
    if r in scaled:
        return [] if c in scaled_c else [1 / f for f in factors]
    return factors


def _match(
    c: Record,
    r: Record,
    rules,
    scales,
    fingerprints,
    part: np.ndarray | None = None,
    fr: _Fingerprint | None = None,
) -> Match | None:
    """How candidate record ``c`` holds reference record ``r``'s numbers, if it does. The
    fingerprints decide which comparisons are worth making; the comparisons decide. ``scales``
    is ``(factors, scaled, scaled_c, settled)``: a candidate value may hold ``r`` times a factor
    where ``r`` is computed before the reference's scale (the candidate scales earlier), or divided
    by it where ``r`` is among ``scaled`` and ``c`` is not among ``scaled_c`` (the candidate scales
    later: it has not scaled yet), never scaled twice, and at no scale where ``r`` is among
    ``settled`` (past the softmax the scale is applied before). With ``part`` (a slice of ``r``'s value),
    whether ``c`` holds that part (``fr`` its fingerprint)."""
    scales = _legitimate(r.index, c.index, scales)
    value = r.value if part is None else part
    if c.value.size != value.size or not _comparable(r):
        return None
    rtol, atol = tolerance_of(c, r)
    fc = fingerprints[("c", c.index)]
    if fr is None:
        fr = fingerprints[("r", r.index)] if part is None else _fingerprint(part)
    bound = atol + rtol * fr.largest
    exact = (
        (fc.nan, fc.posinf, fc.neginf) == (fr.nan, fr.posinf, fr.neginf)
        and abs(fc.largest - fr.largest) <= bound
        and abs(fc.total - fr.total) <= c.value.size * bound + 1e-9
    )
    negated = c.value.dtype == bool and r.value.dtype.kind in "bf"
    floating = c.value.dtype.kind == "f" and r.value.dtype.kind == "f" and fc.low == fr.low
    fill = floating and fc.low > 0
    scaled = floating and any(
        abs(fc.largest_kept - s * fr.largest_kept) <= 1e-3 * fc.largest_kept + atol for s in scales
    )
    if not (exact or negated or fill or scaled):
        return None
    view = in_layout(value, c.shape, rules)
    if view is None:
        return None
    if exact and close(view, c.value, rtol, atol):
        return Match(r.index, "exact")
    if negated and np.isin(view, (0, 1)).all() and np.array_equal(c.value, view == 0):
        return Match(r.index, "negated")  # a keep-mask for a hide-mask: the two conventions
    if fill and close(view, c.value, rtol, atol, fill=True):
        return Match(r.index, "fill")
    if not scaled:
        return None
    s = _scale_between(fr, fc)
    if s is None or not any(abs(s / legit - 1) < 1e-3 for legit in scales):
        return None
    return Match(r.index, "scale", s) if close(s * view, c.value, rtol, atol, fill=True) else None


def ancestors(trace: Trace, start: int) -> set[int]:
    """``start`` and every record it is computed from."""
    seen, stack = set(), [start]
    while stack:
        index = stack.pop()
        if index not in seen:
            seen.add(index)
            stack.extend(trace.records[index].inputs)
    return seen


def _good(trace: Trace, matched: set[int]) -> tuple[set[int], set[int]]:
    """(records on the way to the output, those of them that are good)."""
    if trace.output is None:
        return set(), set()
    on_path = ancestors(trace, trace.output)
    consumers: dict[int, list[int]] = {}
    for record in trace.records:
        for source in record.inputs:
            consumers.setdefault(source, []).append(record.index)
    good: set[int] = set()
    derived = _weight_derived(trace)
    for index in sorted(on_path, reverse=True):
        record = trace.records[index]
        if (
            record.leaf is not None
            or index in matched
            or not _comparable(record)
            or index in derived
            or any(c in good for c in consumers.get(index, []))
        ):
            good.add(index)
    return on_path, good


def _parting(value: np.ndarray) -> bool:
    """Whether a value may be where the reference's and a port's values part: floats, but not a
    mask (zeros and one very negative or infinite fill alone)."""
    if value.dtype.kind != "f":
        return False
    hidden = ~np.isfinite(value) | (value <= _VERY_NEGATIVE)
    return not (hidden.any() and (value[~hidden] == 0).all() and len(np.unique(value[hidden])) == 1)


def _data_dependent(trace: Trace) -> set[int]:
    """The records computed from the inputs (not from weights and constants alone)."""
    found: set[int] = set()
    for record in trace.records:
        if (record.leaf or "").startswith("input") or any(s in found for s in record.inputs):
            found.add(record.index)
    return found


def _weight_derived(trace: Trace) -> set[int]:
    """Records computed from weights alone (a kernel transposed, a fused weight split): a layout
    choice of the port, checked where the weights are used, never blamed by themselves."""
    kind: dict[int, set[str]] = {}
    for record in trace.records:
        if record.leaf is not None:
            kind[record.index] = {
                "input"
                if record.leaf.startswith("input")
                else "constant"
                if record.leaf == "constant"
                else "weight"
            }
        else:
            kind[record.index] = (
                set().union(*(kind[s] for s in record.inputs)) if record.inputs else {"constant"}
            )
    return {r.index for r in trace.records if r.leaf is None and kind[r.index] == {"weight"}}


def layout_classes(trace: Trace, rules) -> list[int]:
    """Each reference record's class: records that are layout changes of their input share one."""
    classes = list(range(len(trace.records)))
    for record in trace.records:
        for source in record.inputs:
            s = trace.records[source]
            if s.value.size == record.value.size and s.value.dtype == record.value.dtype:
                view = in_layout(s.value, record.shape, rules)
                if view is not None and np.array_equal(view, record.value, equal_nan=True):
                    classes[record.index] = classes[source]
                    break
    return classes


def match_values(reference: Trace, candidate: Trace) -> Alignment:
    """The alignment's ``rules``, ``matches`` and ``scaled``: which reference values each candidate
    value holds (no divergence placed: the candidate may have no output, having raised)."""
    pairs = [
        (t.records[s].shape, r.shape)
        for t in (reference, candidate)
        for r in t.records
        for s in r.inputs
        if t.records[s].value.size == r.value.size
    ]
    rules = split_rules(pairs)
    fingerprints = {("r", r.index): _fingerprint(r.value) for r in reference.records if _comparable(r)}
    fingerprints.update({("c", c.index): _fingerprint(c.value) for c in candidate.records if _comparable(c)})
    factors, scaled, settled = _reference_scales(reference, rules, fingerprints)
    scales = (factors, scaled, _reference_scales(candidate, rules, fingerprints, "c")[1], settled)
    matcher = _Matcher(reference, rules, scales, fingerprints)
    result = Alignment(
        reference, candidate, rules, scaled=scaled, factors=factors if scaled else [], settled=settled
    )
    step = lambda r: reference.records[r].expands is not None  # noqa: E731
    weights = _weight_derived(candidate)  # a kernel transposed: never held in parts
    numpy = candidate.framework == "numpy"
    for c in candidate.records:
        if not _comparable(c):
            continue
        found = matcher.whole(c) or _broadcast(c, matcher)
        real = [m for m in found if not step(m.reference)]
        if real:
            result.matches[c.index] = real
        elif c.leaf is None and c.index not in weights and c.value.size > 1 and (c.loops or numpy):
            parts = matcher.parts(c)  # a slice is one run of a loop (a head, a sequence, a chunk)
            moved = [s for s in c.inputs if candidate.records[s].leaf is None]
            if (
                c.call.split(".")[0] in (*_LAYOUT, "stop_gradient")
                and moved
                and not any(s in result.matches or s in result.parts or s in result.steps for s in moved)
            ):
                parts = []  # a layout change holds what its input holds: nothing here
            if c.value.size > 1 and (c.value == c.value.flat[0]).all():
                parts = []  # all ones (a one-hot row's sum) equal any slice of ones: no evidence
            if [p for p in parts if not step(p[0])]:
                result.parts[c.index] = [p[:3] for p in parts if not step(p[0])]
                result.scaled_parts |= {(c.index, p[0]) for p in parts if p[3] == "scale"}
            elif [p for p in parts if step(p[0]) and p[3] != "scale"]:
                result.steps[c.index] = [p[0] for p in parts if step(p[0]) and p[3] != "scale"]
        held = [m.reference for m in found if step(m.reference) and m.kind != "scale"]
        if not real and held:  # a step at another scale is no step of the same computation
            result.steps[c.index] = held
    return result


def once(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``value``, or where it has more entries than ``shape`` holds and repeats along some axes (a
    mask broadcast over the batch), one copy of it."""
    if value.size == math.prod(shape) or value.size < 2:
        return value
    repeated = [
        a for a in range(value.ndim) if value.shape[a] > 1 and (value == value.take([0], axis=a)).all()
    ]
    copy = value[tuple(0 if a in repeated else slice(None) for a in range(value.ndim))]
    return copy if copy.size == math.prod(shape) else value


def _broadcast(c: Record, matcher: _Matcher) -> list[Match]:
    """What a value repeating along some axes holds once (a mask built per batch row, ``(B, 1, T, S)``
    of one ``(T, S)``): the matches of one of its copies."""
    value = c.value
    if value.size < 2 or c.leaf is not None:
        return []
    repeated = [
        a for a in range(value.ndim) if value.shape[a] > 1 and (value == value.take([0], axis=a)).all()
    ]
    if not repeated or value.dtype.kind not in "fb":
        return []
    once = value[tuple(0 if a in repeated else slice(None) for a in range(value.ndim))]
    copy = Record(c.index, c.op, once, c.dtype, c.location)
    whole = matcher.fingerprints[("c", c.index)]
    matcher.fingerprints[("c", c.index)] = _fingerprint(once)
    found = matcher.whole(copy)
    matcher.fingerprints[("c", c.index)] = whole
    return found


@dataclass
class _Table:
    """Reference values (or slices of them) of one size, for ``_Matcher``: their fingerprints
    field by field (``_Fingerprint``'s order) and what each row's comparison needs, as arrays."""

    records: list[Record]
    fields: tuple[np.ndarray, ...]
    kinds: np.ndarray  # dtype kinds
    dtypes: np.ndarray  # index of each row's dtype name in ``names``
    names: list[str]
    in_scaled: np.ndarray
    rows: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # slices
    bounds: dict[tuple[str, bool], tuple] = field(default_factory=dict)  # see ``_Matcher._bounds``
    columns: list[list] | None = None  # ``fields`` as Python numbers, made when a row is first read

    def fingerprint(self, row: int) -> _Fingerprint:
        """Row ``row``'s fingerprint."""
        if self.columns is None:
            self.columns = [column.tolist() for column in self.fields]
        return _Fingerprint(*(column[row] for column in self.columns))


class _Matcher:
    """Which reference values (or slices of them) a candidate value holds: the fingerprints of every
    reference value of a size, and of every slice of a value along some axes, in one table per size,
    so that only the pairs whose fingerprints agree are compared."""

    def __init__(self, reference: Trace, rules, scales, fingerprints) -> None:
        self.reference, self.rules, self.scales, self.fingerprints = reference, rules, scales, fingerprints
        self.by_size: dict[int, list[Record]] = {}
        for r in reference.records:
            if _comparable(r):
                self.by_size.setdefault(r.value.size, []).append(r)
        self.tables: dict[int, _Table] = {}  # whole values by size
        self.slices: dict[int, _Table] = {}  # slices by size

    def _table(self, records: list[Record], fields: tuple[np.ndarray, ...], rows=None) -> _Table:
        names = sorted({r.dtype for r in records})
        return _Table(
            records,
            fields,
            np.array([r.value.dtype.kind for r in records]),
            np.array([names.index(r.dtype) for r in records], dtype=int),
            names,
            np.array([r.index in self.scales[1] for r in records], dtype=bool),
            rows or [],
        )

    def _hits(self, c: Record, table: _Table, size: int) -> np.ndarray:
        tolerances, legit = self._bounds(c, table)
        fc = self.fingerprints[("c", c.index)]
        hits = _worth_comparing(fc, table.fields, size, c.value.dtype.kind, table.kinds, tolerances, legit)
        return np.flatnonzero(hits)

    def _bounds(
        self, c: Record, table: _Table
    ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """``_worth_comparing``'s ``tolerances`` and ``legit`` of ``table``'s rows for candidate
        record ``c``: they depend on its dtype and on whether it is among the candidate's scaled
        records alone, so they are computed once for each of those and kept in ``table.bounds``."""
        factors, _, scaled_c, _ = self.scales
        key = (c.dtype, c.index in scaled_c)
        if key not in table.bounds:
            tolerances = [tolerance_of(c, Record(0, "", np.zeros(0), name, "")) for name in table.names]
            rtol = np.array([t[0] for t in tolerances])[table.dtypes]
            atol = np.array([t[1] for t in tolerances])[table.dtypes]
            width = max(len(factors), 1)
            forward = np.array(list(factors) + [np.nan] * (width - len(factors)))
            legit = np.where(table.in_scaled[:, None], 1 / forward[None, :], forward[None, :])
            some = np.full(len(table.records), bool(factors)) & ~(table.in_scaled & key[1])
            table.bounds[key] = ((rtol, atol), (legit, some))
        return table.bounds[key]

    def whole(self, c: Record) -> list[Match]:
        size = c.value.size
        if size not in self.by_size:
            return []
        if size not in self.tables:
            records = self.by_size[size]
            prints = [self.fingerprints[("r", r.index)] for r in records]
            columns = zip(
                *((f.nan, f.posinf, f.neginf, f.low, f.total, f.largest, f.largest_kept) for f in prints),
                strict=True,
            )
            self.tables[size] = self._table(records, tuple(np.array(column) for column in columns))
        table = self.tables[size]
        found = [
            _match(c, table.records[row], self.rules, self.scales, self.fingerprints)
            for row in self._hits(c, table, size)
        ]
        return [m for m in found if m is not None]

    def parts(self, c: Record) -> list[tuple[int, tuple, tuple, str]]:
        """``(reference record, axes, indices, kind)`` for each slice (one index along one axis, or along
        two: a loop over batch and heads, of a computed reference value ``n`` times ``c``'s size)
        that ``c`` holds."""
        table = self._slice_table(c.value.size)
        if table is None:
            return []
        found = []
        reduced = _reduces(c.call)
        for row in self._hits(c, table, c.value.size):
            r, axes, indices = table.rows[row]
            record = table.records[row]
            if reduced and not _reduces(record.call) and record.expands is None:
                continue  # a row's maximum is no slice of the scores it was taken over
            part = take_part(record.value, axes, indices)
            fr = table.fingerprint(row)
            match = _match(c, record, self.rules, self.scales, self.fingerprints, part, fr)
            if match is not None:
                found.append((r, axes, indices, match.kind))
        return found

    def _slice_table(self, size: int) -> _Table | None:
        """Every slice of ``size`` entries of a computed reference value, along one or two axes."""
        if size not in self.slices:
            rows, records, tables = [], [], []
            for whole, candidates in self.by_size.items():
                n = whole // max(size, 1)
                if n < 2 or whole != n * size:
                    continue
                for r in candidates:
                    if r.leaf is not None:
                        continue
                    for axes in slicings(r.shape, n):
                        shape = tuple(r.shape[a] for a in axes)
                        moved = np.moveaxis(r.value, axes, tuple(range(len(axes))))
                        tables.append(_table(moved.reshape(n, -1)))
                        rows += [(r.index, axes, idx) for idx in itertools.product(*map(range, shape))]
                        records += [r] * n
            fields = tuple(np.concatenate(column) for column in zip(*tables, strict=True)) if tables else ()
            self.slices[size] = self._table(records, fields, rows) if rows else None
        return self.slices[size]


def take_part(value: np.ndarray, axes: tuple[int, ...], indices: tuple[int, ...]) -> np.ndarray:
    """``value[..., indices[0], ..., indices[1], ...]``: one index along each of ``axes``."""
    for axis, index in sorted(zip(axes, indices, strict=True), reverse=True):
        value = np.take(value, index, axis=axis)
    return value


_MOST_RUNS = 512  # a loop over more than this many slices (a model's features) is no port's


def slicings(shape: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    """The axes (one, or two: a loop over batch and heads) whose sizes multiply to ``n``."""
    if n > _MOST_RUNS:
        return []
    single = [(a,) for a, size in enumerate(shape) if size == n]
    pairs = [
        (a, b)
        for a in range(len(shape))
        for b in range(a + 1, len(shape))
        if shape[a] > 1 and shape[b] > 1 and shape[a] * shape[b] == n
    ]
    return single + pairs


def _covered(result: Alignment, besides: frozenset[int] = frozenset()) -> set[int]:
    """The reference records whose every slice along some axes some candidate value holds (one not
    among ``besides``)."""
    seen: dict[tuple[int, tuple], set[tuple]] = {}
    for c, parts in result.parts.items():
        for r, axes, indices in parts if c not in besides else ():
            seen.setdefault((r, axes), set()).add(indices)
    shape = lambda r: result.reference.records[r].shape  # noqa: E731
    return {r for (r, axes), found in seen.items() if len(found) == math.prod(shape(r)[a] for a in axes)}


def _whole_or_parts(result: Alignment, index: int) -> list[int]:
    """The reference records candidate record ``index`` holds, whole or as a slice."""
    whole = [m.reference for m in result.matches.get(index, [])]
    return whole + [r for r, _, _ in result.parts.get(index, [])]


def _steps_of(result: Alignment, index: int) -> set[int]:
    """The fused reference operations (their records) a step of which candidate record ``index``
    holds."""
    return {result.reference.records[r].expands for r in result.steps.get(index, [])}


_LAYOUT = {  # operations that only move, select or copy numbers, in NumPy, JAX and torch
    "reshape", "transpose", "swapaxes", "squeeze", "expand_dims", "ravel", "flatten", "getitem", "split",
    "stack", "concatenate", "hstack", "vstack", "moveaxis", "broadcast_in_dim", "slice", "dynamic_slice",
    "gather", "copy", "convert_element_type", "view", "permute", "contiguous", "unsqueeze", "__getitem__",
    "astype", "array", "asarray", "setitem", "rev", "pad",
}  # fmt: skip
_PRODUCTS = {
    "matmul",
    "dot",
    "einsum",
    "tensordot",
    "dot_general",
    "bmm",
    "linear",
    "addmm",
    "inner",
    "outer",
}


def _reduces(call: str) -> bool:
    """Whether an operation reduces over axes (a sum, a maximum, a mean)."""
    name = call.replace("reduce_", "").split(".")
    return name[-1] == "reduce" or name[0] in (
        "max",
        "min",
        "sum",
        "mean",
        "var",
        "std",
        "amax",
        "amin",
        "prod",
    )


def _computes(call: str) -> bool:
    """Whether an operation computes new numbers elementwise or by reduction (not a layout change, not
    a product of two values: the kind of operation that finishes a softmax or a norm)."""
    name = call.split(".")[0]
    return name not in _LAYOUT and name not in _PRODUCTS


def _through_steps(result: Alignment, bad_c: list[int]) -> int | None:
    """Where the first wrong value holds a step of a fused reference operation (the row maximum of
    a softmax written over lines), check the lines going on from it one by one: blame the first value
    that holds no step of the operation and computes from the operation's values (its inputs or the
    steps held), a completion gone wrong; where those values go on to be reshaped or multiplied with
    another instead, the last value holding a step stops short (``stopped``). Returns the operation's
    record (the value the blamed one should equal), or None where the first wrong value holds no step."""
    candidate, reference = result.candidate, result.reference
    first = result.blamed
    operations = _steps_of(result, first)
    if not operations:
        return None
    operation = min(operations)
    taken = set(reference.records[operation].inputs)
    territory = {first} | {
        c for c in set(result.matches) | set(result.parts) if set(_whole_or_parts(result, c)) & taken
    }
    last = first
    for index in bad_c:
        record = candidate.records[index]
        if index <= first:
            continue
        if operation in _steps_of(result, index):
            territory.add(index)
            last = last if record.call.split(".")[0] in _LAYOUT else index  # where it was computed
            continue
        if not set(record.inputs) & territory:
            continue  # another branch
        if _computes(record.call):
            result.blamed = index
            return operation
        break
    result.blamed, result.stopped = last, last
    return operation


def _reproduced(result: Alignment, candidates: set[int], besides: frozenset[int] = frozenset()) -> set[int]:
    """The reference records that ``candidates`` (candidate records) hold whole, or that the
    candidate's values (but those ``besides``) hold slice by slice, and those only rearranged
    (``view``, ``transpose``: every number kept) into such records."""
    found = {m.reference for c in candidates for m in result.matches.get(c, [])} | _covered(result, besides)
    records = result.reference.records
    for record in reversed(records):  # a value only rearranged into one held is held too: the
        if record.index in found and record.call in _REARRANGE and record.inputs:  # keys a loop over
            source = records[record.inputs[0]]  # heads holds one head at a time, after ``view``
            if source.leaf is None and source.value.size == record.value.size:
                found.add(source.index)
    return found


_REARRANGE = {"view", "reshape", "transpose", "permute", "contiguous", "swapaxes", "moveaxis", "flatten"}


def _repeated(result: Alignment) -> None:
    """An operation in a ``jax.lax.scan`` body whose every iteration holds the same slices of
    reference values (the first chunk's mask for every chunk): from its second iteration on, the
    slice is taken again where another is due, and held no more (``repeated``)."""
    by_line: dict[tuple, list[int]] = {}  # one operation of a line: the runs of one record
    for index in result.parts:
        record = result.candidate.records[index]
        if record.loops and record.loops[-1].target == "scan":  # Python loops: see _reroute_part
            by_line.setdefault((record.location, record.call, record.shape), []).append(index)
    for indexes in by_line.values():
        runs = {result.candidate.records[i].loops for i in indexes}
        held = {frozenset(result.parts[i]) for i in indexes}
        if len(runs) < 2 or len(held) != 1:
            continue
        part = min(next(iter(held)))
        for index in sorted(indexes)[1:]:
            del result.parts[index]
            result.repeated[index] = part


def align(reference: Trace, candidate: Trace) -> Alignment:
    """Match the candidate's values to the reference's and place the first divergence on each side."""
    result = match_values(reference, candidate)
    _repeated(result)
    out_c, out_r = candidate.records[candidate.output], reference.records[reference.output]
    result.output_ok = out_c.shape == out_r.shape and close(
        out_r.value, out_c.value, *tolerance_of(out_c, out_r)
    )
    matched_c = {c for c, found in result.matches.items() if candidate.records[c].leaf is None}
    used = ancestors(candidate, candidate.output)  # a value feeding no output reproduces nothing
    matched_r = _reproduced(result, matched_c & used)
    matched_c |= set(result.parts)
    # a step of a fused operation is verified, not good by itself
    result.verified = sorted(i for i in matched_c | set(result.steps) if i in used)
    path_c, good_c = _good(candidate, matched_c)
    path_r, good_r = _good(reference, matched_r)
    result.good = good_c
    if result.output_ok:
        return result
    bad_c = sorted(path_c - good_c)
    bad_r = sorted(path_r - good_r)
    on_data = _data_dependent(reference)  # a mask built from positions alone parts from no data
    # neither a mask (a port may hold it in another form: additive, inverted, per sequence) nor
    # integers (token ids, positions: indices a port may never hold as arrays) are where the values
    # part; a mask is where a mask bug's counterpart is (below)
    values = [r for r in bad_r if r in on_data and _parting(reference.records[r].value)]
    first = next((r for r in bad_r if r in on_data), bad_r[0]) if bad_r else reference.output
    result.diverging = values[0] if values else first
    filled = {  # an array's value before a write into part of it of wrong numbers computed from others
        record.inputs[0]  # (not a mask's fill: -inf written where a mask says, whatever came before)
        for record in candidate.records
        if record.written is not None
        and record.written not in good_c
        and candidate.records[record.written].inputs
        and not (candidate.records[record.written].value <= _VERY_NEGATIVE).all()
        and len(record.inputs) == 2
    }
    result.blamed = next((i for i in bad_c if i not in filled), bad_c[0]) if bad_c else candidate.output
    classes = layout_classes(reference, result.rules)
    operation = _through_steps(result, bad_c)
    result.counterpart = _counterpart(result, result.blamed, bad_r, classes)
    if (
        operation is not None
        and in_layout(
            reference.records[operation].value, candidate.records[result.blamed].shape, result.rules
        )
        is not None
    ):
        result.counterpart = operation
    result.unmasked_scores = _unmasked_scores(candidate, result.blamed)
    result.weights = _other_weights(result)
    duplicate = None
    if result.unmasked_scores is None and result.weights is None:
        duplicate = _duplicated(result, classes)
    if duplicate is not None:  # a value computed again from the wrong weights: its line
        result.rerouted_from, result.blamed = result.blamed, duplicate[0]
        result.duplicate = duplicate[1:]
        result.diverging = _in_layout_of(result, duplicate[2], candidate.records[duplicate[0]].shape)
        result.counterpart = result.diverging
        _due_part(result, duplicate[0], duplicate[1], duplicate[2])
    elif result.unmasked_scores is None and result.weights is None:  # a call hiding nothing is to
        _reroute(result, bad_r, classes)  # blame, not the inputs it takes
    if result.rerouted_from is None and result.unmasked_scores is None:
        _reroute_part(result, bad_r, classes)
    result.shown = result.blamed
    line = candidate.records[result.blamed].location
    # a NumPy statement is one step: what the blamed line's own sub-expressions reproduce, its value
    # may still be held against (``s = q @ k.T / hd`` is the scores, scaled wrong)
    stack = candidate.records[result.blamed].stack[1:]  # its call site: a helper's other calls are not it
    on_line = frozenset(
        r.index
        for r in candidate.records
        if r.location == line and r.stack[1:] == stack and candidate.framework == "numpy"
    )
    elsewhere = _reproduced(result, matched_c & used - on_line, on_line)
    unmatched = sorted(i for i in path_r - elsewhere if reference.records[i].leaf is None)
    if result.rerouted_from is None:  # show the blamed line's result, not its first operation
        result.shown = _statement_end(candidate, result.blamed, set(bad_c))
        result.counterpart = _counterpart(result, result.shown, unmatched, classes)
        fed = _fed_counterpart(result, result.shown, unmatched)
        if fed is not None:
            result.counterpart = fed
        shown = candidate.records[result.shown].value
        expected = once(reference.records[result.counterpart].value, shown.shape)
        if (
            in_layout(expected, shown.shape, result.rules) is None
            or (expected.dtype == bool) != (shown.dtype == bool)  # a mask for a float value
        ):  # another value's counterpart: one head of a value the shown one should have equalled
            part = _part_counterpart(result, result.shown, unmatched, classes)
            if part is not None:
                result.counterpart, result.counterpart_part = part[0], part[1:]
    uses = [use for _, _, use in _finished_weights(result)] if result.weights is not None else []
    shape = candidate.records[result.shown].shape
    uses = [u for u in uses if in_layout(reference.records[u].value, shape, result.rules) is not None]
    if uses and result.rerouted_from is None:  # another layer's weights: the statement's value due is the
        result.counterpart = max(uses)  # reference's last operation taking the weights due
    unfinished = _unfinished(candidate, result.blamed)
    if unfinished is not None:  # a buffer its loop left part unwritten: show what the writes made
        result.shown, result.unwritten = unfinished, result.blamed
        shape = candidate.records[unfinished].shape
        written = [  # the reference values the writes hold slices of, whole
            r
            for r, _, _ in result.parts.get(candidate.records[unfinished].written, [])
            if in_layout(reference.records[r].value, shape, result.rules) is not None
        ]
        result.counterpart = (written or [_counterpart(result, unfinished, unmatched, classes)])[0]
        result.diverging = result.counterpart
    kinds = {
        _parting(v.value) for v in (reference.records[result.counterpart], candidate.records[result.shown])
    }
    if result.counterpart in path_r and result.counterpart < result.diverging and len(kinds) == 1:
        result.diverging = result.counterpart  # (not a mask found for a value the port computes)
    if result.unmasked_scores is not None:  # the mask the call never applied: the first value hiding entries
        masked = [i for i in sorted(path_r) if i >= result.diverging and hides(reference.records[i].value)]
        if masked:
            result.diverging = result.counterpart = masked[0]
    line = blame_location(result)
    last = result.blamed if result.unwritten is None else result.shown  # a buffer: its loop's last write
    result.verified = [i for i in result.verified if i < last and candidate.records[i].location != line]
    return result


def hides(value: np.ndarray) -> bool:
    """Whether ``value`` hides entries: a float value with any at or below -1e4 (-inf included)."""
    return value.dtype.kind == "f" and bool((value <= _VERY_NEGATIVE).any())


def _unmasked_scores(trace: Trace, index: int) -> np.ndarray | None:
    """The scores ``q @ k^T * scale`` of a fused attention call (torch's ``scaled_dot_product_attention``,
    captured as one operation) given its query, key and value alone, when its output equals attention
    over them hiding nothing (no ``is_causal``, no mask); None for any other value. ``scale`` is the
    call's ``scale=`` (by default ``1/sqrt(E)``); the batch dimensions of query, key and value broadcast
    (a key and value head shared by every query head), and the scores have the broadcast shape."""
    record = trace.records[index]
    if record.op != "scaled_dot_product_attention" or len(record.inputs) != 3:
        return None
    q, k, v = (trace.records[s].value.astype(np.float64) for s in record.inputs)
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        return None  # not (..., L, E), (..., S, E), (..., S, Ev)
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        return None
    scale = record.keywords.get("scale")
    scores = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    output = weights / weights.sum(-1, keepdims=True) @ v
    if output.shape != record.shape or not close(output, record.value, *tolerance_of(record, record)):
        return None
    return scores


def _unfinished(trace: Trace, buffer: int) -> int | None:
    """The last write into ``buffer``, a constant array (``np.zeros``) the writes of a loop never
    covered (its value still feeds them: see ``capture_numpy``), if it is one."""
    value, last = trace.records[buffer].value, None
    if value.size == 0 or not (value == value.flat[0]).all():
        return None
    while True:
        write = next(
            (r for r in trace.records if r.written is not None and r.inputs[:1] == ((last or buffer),)),
            None,
        )
        if write is None:
            return last
        last = write.index


def scale_left_out(alignment: Alignment) -> int | None:
    """The reference value the blamed value is computed from unscaled, where the value it should
    have equalled is the reference's scaling of that one (the reference's scale never applied), or
    where its line takes a value holding a scaled reference value without that scale (the port
    scales later, in principle, but never does)."""
    reference, candidate = alignment.reference, alignment.candidate
    target = reference.records[alignment.counterpart]
    classes = layout_classes(reference, alignment.rules)
    if target.index in alignment.scaled and not any(s in alignment.scaled for s in target.inputs):
        used = {
            m.reference
            for s in candidate.records[alignment.blamed].inputs
            for m in alignment.matches.get(s, [])
        }
        found = [
            s
            for s in target.inputs
            if reference.records[s].leaf is None and any(classes[s] == classes[u] for u in used)
        ]
        if found:
            return found[0]
    sources = line_inputs(candidate, alignment.blamed)
    unscaled = [
        m.reference
        for s in sources
        for m in alignment.matches.get(s, [])
        if m.kind == "scale" and m.reference in alignment.scaled
    ]
    unscaled += [
        r  # a part held scaled: before the reference's own scale where it is not among the scaled
        for s in sources
        for r, _, _ in alignment.parts.get(s, [])
        if (s, r) in alignment.scaled_parts and r in alignment.scaled
    ]
    return unscaled[0] if unscaled and candidate.records[alignment.blamed].call not in _PRODUCTS else None


def _statement_end(trace: Trace, index: int, bad: set[int]) -> int:
    """The last of ``bad`` computed by the same run of record ``index``'s statement: the records
    after it while the statement runs (its line in their stack: helpers it calls included), in its
    call and loop iteration."""
    first = trace.records[index]
    last = index
    for record in trace.records[index + 1 :]:
        if not any(location == first.location for location, _ in record.stack) and record.location != "?":
            break
        same = (
            record.location == first.location and record.calls == first.calls and record.loops == first.loops
        )
        if same and record.index in bad:
            last = record.index
    return last


def _unscaled_product(result: Alignment) -> int | None:
    """Where the port never applies the scale the reference applies to a product (``q @ k.T``, then
    times ``1/sqrt(head_dim)``), carrying the product on unscaled: the candidate record holding the
    product, whose statement left the scale out; None otherwise (a scale the reference applies to
    any other value, left out, shows where its absence first does)."""
    reference, candidate = result.reference.records, result.candidate
    path = ancestors(candidate, result.blamed)
    scaled_exactly = any(
        m.reference in result.scaled and m.kind != "scale" for c in path for m in result.matches.get(c, [])
    ) or any(
        r in result.scaled and (c, r) not in result.scaled_parts
        for c in path
        for r, _, _ in result.parts.get(c, [])
    )
    unscaled = any(
        m.reference in result.scaled and m.kind == "scale" for c in path for m in result.matches.get(c, [])
    ) or any((c, r) in result.scaled_parts for c in path for r, _, _ in result.parts.get(c, []))
    if scaled_exactly or not unscaled:
        return None
    for record in reference:
        if record.index in result.scaled and not any(s in result.scaled for s in record.inputs):
            for product in (s for s in record.inputs if reference[s].call.split(".")[0] in _PRODUCTS):
                holders = [c for c in path if product in _whole_or_parts(result, c)]
                if holders:
                    return max(holders)
    return None


def blame_location(result: Alignment) -> str:
    """The ``path:line`` to blame for the blamed candidate record. A misrouted value: the line in
    the consuming function that produced it (the call ``linear(params, "W_query", x)`` rather than
    the helper's body); a value a residual was not added to: its line in the innermost function
    the consumer shares (``x = attn(ln_1(x))`` in the block, not the attention's last line). The
    first value a helper call computes, when that helper is called once or computes right
    elsewhere, or takes an argument the reference scales first: the call site (its arguments are
    wrong, not its body). A value taking another variable's numbers: its line in the function that
    computed them (the call passing the wrong argument, not the helper using it). A value computed
    again from the wrong weights (``duplicate``): where its stack parts from the value it duplicates
    (the call ``split("W_key")`` where both run one helper's line). A product the port never
    scales where the reference does: the line of the product (``_unscaled_product``)."""
    records = result.candidate.records
    product = _unscaled_product(result) if result.rerouted_from is None else None
    record = records[result.blamed if product is None else product]
    stack = record.stack
    if not stack or product is not None:
        return record.location
    if result.weights is not None:  # another layer's weights: chosen where the helper is called
        return stack[1][0] if len(stack) > 1 else stack[0][0]
    if result.taken is not None and result.rerouted_from is None:  # another variable passed to a helper
        produced = {(fn, loc.rsplit(":", 1)[0]) for loc, fn in records[result.taken].stack}
        for loc, fn in stack:
            if (fn, loc.rsplit(":", 1)[0]) in produced:
                return loc
    if result.duplicate is not None:  # computed again where the original is: a helper's call site
        other = records[result.duplicate[2]].stack
        if other[:1] == stack[:1]:  # where the two calls part (both on one line: the call)
            parting = [f for i, f in enumerate(stack[1:], 1) if i >= len(other) or other[i] != f]
            return (parting or stack[1:2] or stack)[0][0]
        return stack[0][0]
    if result.rerouted_from is not None and records[result.rerouted_from].stack:
        consumers = records[result.rerouted_from].stack
        for consumer in consumers if result.residual is not None else consumers[:1]:
            same = [
                loc
                for loc, fn in stack
                if fn == consumer[1] and loc.rsplit(":", 1)[0] == consumer[0].rsplit(":", 1)[0]
            ]
            if same:
                return same[0]
        return stack[0][0]
    if len(stack) > 1:
        function = stack[0][1]
        # a call: its frames' call ids, else its callers' lines and its torch module (one line in
        # a loop over blocks calls each block's GELU module)
        call_of = lambda r: r.calls[: len(r.stack)] if r.calls else (r.stack[1:], r.module)  # noqa: E731
        calls: dict[tuple, list[Record]] = {}
        derived = _weight_derived(result.candidate)  # a weight transposed: no value the call computes
        for other in records:
            if (
                len(other.stack) > 1
                and other.stack[0][1] == function
                and other.leaf is None
                and other.index not in derived
            ):
                calls.setdefault(call_of(other), []).append(other)
        first_in_call = calls.get(call_of(record), [None])[0] is record
        elsewhere = [
            first[0].index in result.good for call, first in calls.items() if call != call_of(record)
        ]
        left_out = scale_left_out(result) is not None  # the scale is due before the call
        if first_in_call and (not elsewhere or any(elsewhere) or left_out):
            return stack[1][0]
    return stack[0][0]


def _input_classes(result: Alignment, record: Record, classes: list[int]) -> set[int]:
    sources = line_inputs(result.candidate, record.index)
    return {classes[m.reference] for s in sources for m in result.matches.get(s, [])}


def _counterpart(result: Alignment, blamed: int, bad_r: list[int], classes: list[int]) -> int:
    """The reference value the blamed candidate value should have equalled: among the diverging
    reference values it can be laid out as, the one computed from most of the same values, the
    earliest on ties; else the reference's output for the candidate's output (which should equal
    it, whatever values before it were found equal), for any other the reference value its line
    holds in its layout (``_held_by_line``: a dropout left on, set against the values it drops),
    else the first diverging reference value. A value computed from one that holds a reference value
    unscaled (the candidate scales later) should equal that value. The values a value is computed
    from are those its line takes from other lines (``line_inputs``). A value only reordering its
    input (a reshape) should equal the value chosen, in its shape, where that input holds it (the
    right numbers in the wrong order), else the value chosen consumes that its input holds (``v``
    split without the transpose: the values' transpose)."""
    record = result.candidate.records[blamed]
    unscaled = [
        m.reference
        for source in line_inputs(result.candidate, blamed)
        for m in result.matches.get(source, [])
        if m.kind == "scale"
        and m.reference in result.scaled
        and result.reference.records[m.reference].shape == record.shape
    ]
    if unscaled:
        return unscaled[0]
    compatible = [
        r
        for r in bad_r
        if in_layout(once(result.reference.records[r].value, record.shape), record.shape, result.rules)
        is not None
    ]
    alike = [
        r
        for r in compatible
        if (result.reference.records[r].value.dtype == bool) == (record.value.dtype == bool)
    ]
    compatible = alike or compatible  # a float mask is held against the float mask, not the boolean
    if not compatible:
        if blamed == result.candidate.output:
            return result.reference.output
        held = _held_by_line(result, record, classes)
        return held if held is not None else (bad_r or [result.reference.output])[0]
    ours = _input_classes(result, record, classes)
    shared = [len(ours & {classes[s] for s in result.reference.records[r].inputs}) for r in compatible]
    chosen = result.reference.records[compatible[shared.index(max(shared))]]
    own = [result.candidate.records[s].value for s in record.inputs]
    reshuffle = (
        record.written is None  # a write filling the whole array copies, it does not reorder
        and len(own) == 1
        and own[0].size == record.value.size
        and np.array_equal(np.sort(own[0], axis=None), np.sort(record.value, axis=None), equal_nan=True)
    )
    # the numbers ours reorders, where its input holds reference values: on a NumPy line that input
    # may be the line's own (``(w @ v).reshape(b, t, d)``, whose line takes ``v``, not the product)
    moved = {classes[m.reference] for m in result.matches.get(record.inputs[0], [])} if reshuffle else set()
    if classes[chosen.index] in moved:  # the value due's numbers in another order: that value, in the
        same = [  # form that has ours's shape (the heads merged: the view, not the product)
            r
            for r in compatible
            if classes[r] == classes[chosen.index] and result.reference.records[r].shape == record.shape
        ]
        return (same or [chosen.index])[0]
    for source in chosen.inputs if reshuffle else ():  # ours reorders its input: the value it consumes
        earlier = result.reference.records[source]
        if (
            earlier.leaf is None
            and classes[source] in (moved or ours)
            and earlier.value.size == record.value.size
            and in_layout(earlier.value, record.shape, result.rules) is not None
            and all(m.reference != source for m in result.matches.get(blamed, []))
        ):
            return source
    return chosen.index


def _fed_counterpart(result: Alignment, shown: int, unmatched: list[int]) -> int | None:
    """Where a NumPy statement computes what the reference computes in several operations (a GELU
    written on one line): the value the reference feeds to the operation taking the weights that
    the statement's value is fed to (the GELU's output, which the next linear layer takes), where
    that value is computed from the counterpart chosen by the values taken (the GELU's first
    product), is not reproduced, and has the statement's layout; None otherwise."""
    candidate, reference = result.candidate, result.reference.records
    if candidate.framework != "numpy":
        return None
    chosen, record = result.counterpart, candidate.records[shown]
    weights = {
        m.reference
        for consumer in candidate.records[shown + 1 :]
        if shown in consumer.inputs
        for s in consumer.inputs
        for m in result.matches.get(s, [])
        if reference[m.reference].leaf is not None and not reference[m.reference].leaf.startswith("input")
    }
    fed = [
        s
        for r in reference
        if r.expands is None and set(r.inputs) & weights
        for s in r.inputs
        if reference[s].leaf is None
    ]
    fed = [
        s
        for s in dict.fromkeys(fed)
        if s in unmatched
        and s != chosen
        and chosen in ancestors(result.reference, s)
        and in_layout(once(reference[s].value, record.shape), record.shape, result.rules) is not None
    ]
    return fed[0] if len(fed) == 1 else None


def line_inputs(trace: Trace, index: int) -> list[int]:
    """The values record ``index`` is computed from: for NumPy, whose statements are the steps of
    a port, the inputs of its line up to it that come from other lines (the values a statement
    takes, whatever sub-expressions it computes on the way); else its own inputs."""
    if trace.framework != "numpy":
        return list(trace.records[index].inputs)
    line = line_records(trace, index)
    own = {r.index for r in line}
    return list(dict.fromkeys(s for r in line for s in r.inputs if s not in own))


def line_records(trace: Trace, index: int) -> list[Record]:
    """The records of one run of record ``index``'s line up to it: those before it on its line, back
    to the first record of another line or of another call of its function (a helper's line run
    from two call sites in a row: ``linear(linear(x))``; a constant read on the line has no call)."""
    start, record = index, trace.records[index]

    def same_run(other: Record) -> bool:
        if other.location != record.location:
            return False
        return not (other.stack and record.stack) or (other.stack, other.calls) == (
            record.stack,
            record.calls,
        )

    while start > 0 and same_run(trace.records[start - 1]):
        start -= 1
    return trace.records[start : index + 1]


def _held_by_line(result: Alignment, record: Record, classes: list[int]) -> int | None:
    """The reference value that the values of ``record``'s line up to it, or the values the line
    takes from other lines, hold in ``record``'s layout, the latest computed (the first record of
    its layout class): what the line should have left as it was where no diverging reference value
    has its layout (the reference computes nothing there, as an eval-mode dropout); None when none
    holds one."""
    reference = result.reference.records
    line = line_records(result.candidate, record.index)
    held = [
        m.reference
        for index in {r.index for r in line} | {s for r in line for s in r.inputs}
        for m in result.matches.get(index, [])
        if reference[m.reference].leaf is None
        and in_layout(reference[m.reference].value, record.shape, result.rules) is not None
    ]
    if not held:
        return None
    return classes.index(classes[max(held)])


def _used_well(result: Alignment, first: int, found: set[int], found_of) -> bool:
    """Whether the numbers ``first`` produced (through its layout changes) also feed a good value:
    then they were produced right, and the line consuming them in the wrong place is to blame."""
    records = result.candidate.records
    consumers: dict[int, list[int]] = {}
    for record in records[first:]:
        for source in record.inputs:
            consumers.setdefault(source, []).append(record.index)
    chain, frontier = {first}, [first]
    while frontier:
        for consumer in consumers.get(frontier.pop(), []):
            if consumer not in chain and found_of(consumer) & found:
                chain.add(consumer)
                frontier.append(consumer)
    return any(c in result.good and c not in chain for link in chain for c in consumers.get(link, []))


def _reroute(result: Alignment, bad_r: list[int], classes: list[int]) -> None:
    """Blame the producer of a misrouted input: one holding a reference value of another class than
    every input of the reference value the blamed one should have equalled, or, when one of those
    inputs is missing, the one holding another input's value at its place (by operand position:
    ``einsum(k, k)`` for ``einsum(q, k)``), else of two inputs holding the same value the later
    computed; unless those numbers also feed a good value (then the consumer picked the wrong
    variable), or they are computed once and the value due is computed nowhere, where a step left
    out between them and their use is to blame: the consumer's (a norm left out), or, where the
    reference adds another value to them there (a residual left out), the statement that computed
    them (``residual``). Operands swapped
    where they are split from one value (``k, q, v = split(qkv)``) blame the split (``swapped``)."""
    candidate, reference = result.candidate, result.reference
    blamed = candidate.records[result.blamed]
    target = reference.records[result.counterpart]
    expected = [classes[s] for s in target.inputs]
    found_of = lambda index: {classes[r] for r in _whole_or_parts(result, index)}  # noqa: E731

    def origin(index: int, found: set[int]) -> int:
        while True:  # back to the first line that produced these numbers
            earlier = [
                s
                for s in candidate.records[index].inputs
                if found_of(s) & found and candidate.records[s].leaf is None
            ]
            if not earlier:
                return index
            index = earlier[0]

    if not any(found_of(s) & set(expected) for s in blamed.inputs):
        _residual_before(result, blamed, target, classes, found_of, origin)
        return  # the counterpart is not the blamed value's: nothing else to reroute against
    split = _swapped_split(result, blamed, expected, found_of)
    if split is not None:
        result.rerouted_from, result.blamed, result.swapped = result.blamed, split, True
        return

    origins = {
        s: origin(s, found_of(s)) for s in blamed.inputs if found_of(s) and candidate.records[s].leaf is None
    }
    misrouted = [origins[s] for s in origins if not found_of(s) & set(expected)]
    covered = set().union(*(found_of(s) for s in blamed.inputs))
    sums = ("add", "add_")
    if (
        target.call in sums
        and blamed.call not in sums
        and len(expected) == 2
        and len(covered & set(expected)) == 1
        and all(_parting(result.reference.records[e].value) for e in set(expected) - covered)
    ):  # (the term left out no additive mask: a port may apply that by masked_fill or where)
        result.residual = target.index  # one of a sum's terms taken for the sum: the other never added
        result.rerouted_from = result.blamed
        result.blamed = next(origins[s] for s in origins if found_of(s) & set(expected))
        return
    if not misrouted and set(expected) - covered:
        positional = [
            origins[s]
            for position, s in enumerate(blamed.inputs)
            if s in origins and position < len(expected) and expected[position] not in found_of(s)
        ]
        if blamed.call.split(".")[0] not in _PRODUCTS or len(blamed.inputs) != len(expected):
            positional = []  # operands by position: in products alone (a mask's place in a where varies)
        by_value: dict[frozenset[int], list[int]] = {}
        for source, first in origins.items():
            by_value.setdefault(frozenset(found_of(source)), []).append(first)
        twice = [max(firsts) for firsts in by_value.values() if len(set(firsts)) > 1]
        misrouted = positional if len(positional) == 1 else twice
    well = [first for first in misrouted if _used_well(result, first, found_of(first), found_of)]
    misrouted = [first for first in misrouted if first not in well]
    if not misrouted:
        result.taken = well[0] if well else None  # the consumer took the wrong variable
        return
    first = misrouted[0]
    held = found_of(first)
    missing = set(expected) - covered
    elsewhere = [
        c.index
        for c in candidate.records
        if c.leaf is None
        and (
            (found_of(c.index) & held and origin(c.index, found_of(c.index)) != first)
            or found_of(c.index) & missing
        )
    ]
    if not elsewhere:  # computed once, the value due nowhere: a step left out between
        result.residual = _residual(result, target, first, classes)
        if result.residual is None:
            return
    result.rerouted_from, result.blamed = result.blamed, first
    result.counterpart = (
        result.residual if result.residual is not None else _counterpart(result, first, bad_r, classes)
    )


def _families(trace: Trace, classes: list[int]) -> list[int]:
    """Each reference record's family: its layout class, joined with the values it only copies or
    rearranges (``clone``, ``view``, ``transpose``: one computed input of its size), whatever the
    split rules say (a ``view`` into heads where the batch's tokens number the features)."""
    family = list(classes)

    def root(index: int) -> int:
        while family[index] != index:
            index = family[index]
        return index

    for record in trace.records:
        computed = [s for s in record.inputs if trace.records[s].leaf is None]
        if (
            record.call.split(".")[0] in (*_LAYOUT, "clone")
            and len(computed) == 1
            and trace.records[computed[0]].value.size == record.value.size
        ):
            family[root(record.index)] = root(computed[0])
    return [root(i) for i in range(len(family))]


def _duplicated(result: Alignment, classes: list[int]) -> tuple[int, int, int, int] | None:
    """``(candidate record, held, due, original)``: a value computed from the wrong weights (``v =
    x @ W_key.T``). The reference computes two sibling values, ``held`` and ``due`` (its keys and
    values: one operation of one shape on the same inputs but for weights); the port holds
    ``held`` (whole, or a head of it) in values computed apart (none from another), and ``due``
    nowhere, whole or in part; the numbers of all of them but one line's feed a value holding
    another reference value (``original``'s: the keys reach the scores), that line's (the
    candidate record, its first to reach the first wrong value) feed none. None otherwise: a port
    computing the keys twice holds the values as well, or uses both copies as keys; a reference
    whose siblings are equal (queries, keys and values all ``x``, or tied weights) has any copy
    hold both; where two siblings are held nowhere (or every copy's use is wrong) which one a copy
    stands for is not told."""
    reference, candidate = result.reference, result.candidate
    family = _families(reference, classes)

    def holds(index: int) -> set[int]:  # the families candidate record ``index`` holds, whole or a part
        found = [m.reference for m in result.matches.get(index, [])]
        found += [p[0] for p in result.parts.get(index, [])]
        return {family[r] for r in found if reference.records[r].leaf is None}

    held_anywhere = {f for c in candidate.records if c.leaf is None for f in holds(c.index)}
    held_anywhere |= {family[r] for steps in result.steps.values() for r in steps}
    used_r = ancestors(reference, reference.output)

    def data(record: Record) -> list[int]:  # its inputs but weights
        records = reference.records
        return [s for s in record.inputs if records[s].leaf is None or records[s].leaf.startswith("input")]

    def siblings(record: Record) -> list[Record]:
        return [
            other
            for other in reference.records
            if other.leaf is None
            and other.index in used_r
            and other.call == record.call
            and other.shape == record.shape
            and data(other) == data(record)
            and family[other.index] != family[record.index]
        ]

    consumers: dict[int, list[int]] = {}
    for record in candidate.records:
        for source in record.inputs:
            consumers.setdefault(source, []).append(record.index)
    for due in reference.records:
        if due.leaf is not None or due.index not in used_r or family[due.index] in held_anywhere:
            continue
        for held in siblings(due):
            if family[held.index] not in held_anywhere:
                continue
            if [s for s in siblings(held) if family[s.index] not in held_anywhere] != [due]:
                continue  # another sibling missing too: which one a copy stands for is not told
            found = _duplicate_of(result, family, family[held.index], holds, consumers)
            if found is not None:
                return found[0], held.index, due.index, found[1]
    return None


def _duplicate_of(
    result: Alignment, family: list[int], held: int, holds, consumers: dict[int, list[int]]
) -> tuple[int, int] | None:
    """``(suspect, original)`` for ``_duplicated``: of the candidate's values computing reference
    family ``held`` (whole or a head of it; not copies: reshapes, slices), computed apart, those of
    one line alone feed, through their copies, no value holding another reference value; the
    first of them that reaches the first wrong value (``blamed``), and the first of the others."""
    candidate = result.candidate
    holders = [c.index for c in candidate.records if c.leaf is None and held in holds(c.index)]

    def copied(index: int) -> bool:  # a layout change of a holder
        record = candidate.records[index]
        return (
            record.call.split(".")[0] in _LAYOUT
            and bool(record.inputs)
            and candidate.records[record.inputs[0]].leaf is None
            and held in holds(record.inputs[0])
        )

    origins: list[int] = []
    for c in holders:  # computed apart: neither a copy nor computed from another (a loop's w @ v)
        if not copied(c) and not any(o in ancestors(candidate, c) for o in origins):
            origins.append(c)
    calls: dict[int, tuple] = {}  # one call of a line: its stack, and which of its runs in one
    runs: dict[tuple, int] = {}  # iteration of its loops it is (a helper called twice on one line)
    for c in origins:
        record = candidate.records[c]
        run = (record.stack, record.calls, record.loops)
        calls[c] = (record.stack, record.calls, runs.get(run, 0))
        runs[run] = runs.get(run, 0) + 1
    line = calls.__getitem__
    lines = set(calls.values())
    if len(lines) < 2:
        return None
    wrong: dict[tuple, list[int]] = {}
    right: list[int] = []
    for origin in origins:
        copies, frontier, used_well = {origin}, [origin], False
        while frontier:
            for consumer in consumers.get(frontier.pop(), []):
                record = candidate.records[consumer]
                if consumer in copies:
                    continue
                if (
                    record.call.split(".")[0] in _LAYOUT
                    and record.inputs[0] in copies
                    and record.value.size <= candidate.records[record.inputs[0]].value.size
                ):
                    copies.add(consumer)
                    frontier.append(consumer)
                elif holds(consumer) - {held}:
                    used_well = True
        if used_well:
            right.append(origin)
        else:
            wrong.setdefault(line(origin), []).append(origin)
    before = ancestors(candidate, result.blamed)
    reaching = [c for c in next(iter(wrong.values()), []) if c in before]
    if len(wrong) != 1 or not right or not reaching:
        return None
    return reaching[0], right[0]


def _due_part(result: Alignment, suspect: int, held: int, due: int) -> None:
    """Where the duplicate ``suspect`` holds one head of the reference's ``held``: the same head of
    ``due`` (of the layout of the part held) is its counterpart (``counterpart_part``)."""
    records = result.reference.records
    family = _families(result.reference, layout_classes(result.reference, result.rules))
    for r, axes, indices in result.parts.get(suspect, []):
        if family[r] != family[held] or suspect in result.matches:
            continue
        shape = records[r].shape
        alike = [x.index for x in records[due:] if family[x.index] == family[due] and x.shape == shape]
        if alike:
            result.counterpart, result.counterpart_part = alike[0], (axes, indices)
            return


def _in_layout_of(result: Alignment, index: int, shape: tuple[int, ...]) -> int:
    """Reference record ``index``, or where it cannot be laid out as ``shape`` the first value only
    copying or rearranging it that can (its heads split), else ``index``."""
    records = result.reference.records
    family = _families(result.reference, layout_classes(result.reference, result.rules))
    for record in records[index:]:
        if family[record.index] == family[index] and in_layout(record.value, shape, result.rules) is not None:
            return record.index
    return index


def _other_weights(result: Alignment) -> tuple[int, int] | None:
    """``(held, due)``: the blamed value takes a weight holding the reference's weight ``held`` where
    the reference operation it should have equalled (or whose step it should have held) takes
    another of that shape, ``due`` (a norm's weight from the first norm for the second); None
    otherwise."""
    candidate, reference = result.candidate, result.reference.records
    target = reference[result.counterpart]
    target = reference[target.expands] if target.expands is not None else target
    due = [
        s
        for s in target.inputs
        if reference[s].leaf not in (None, "constant") and not reference[s].leaf.startswith("input")
    ]
    for source in candidate.records[result.blamed].inputs:
        record = candidate.records[source]
        if record.leaf is None or record.leaf == "constant" or record.leaf.startswith("input"):
            continue
        held = [
            m.reference for m in result.matches.get(source, []) if reference[m.reference].leaf is not None
        ]
        if held and not set(held) & set(due):
            same = [s for s in due if reference[s].shape == record.shape]
            if same:
                return held[0], same[0]
    finished = _finished_weights(result)
    return finished[0][:2] if finished else None


def _finished_weights(result: Alignment) -> list[tuple[int, int, int]]:
    """``(held, due, use)`` for each weight the blamed statement takes (its run of its line: a norm
    written on one line) that holds the reference's weight ``held`` the reference is done with
    (every operation taking it comes before the first diverging value), where the reference takes
    ``due``, a weight of its shape that no value of the port is computed from, at or after that
    value (``use``: its first operation there): the right formula on another layer's weights (the
    second norm given the first norm's scale and shift). Empty otherwise."""
    candidate, reference = result.candidate, result.reference.records
    blamed = candidate.records[result.blamed]
    run = [
        r
        for r in candidate.records
        if (r.location, r.stack, r.calls, r.loops)
        == (blamed.location, blamed.stack, blamed.calls, blamed.loops)
    ]
    consumers: dict[int, list[int]] = {}
    for record in reference:
        for source in record.inputs:
            consumers.setdefault(source, []).append(record.index)
    used_r = ancestors(result.reference, result.reference.output)
    derived = _weight_derived(candidate)

    def weights(index: int) -> set[int]:  # the weight leaves a value of weights alone comes from
        record = candidate.records[index]
        if record.leaf is not None:
            return {index} if record.leaf != "constant" and not record.leaf.startswith("input") else set()
        return set().union(*(weights(s) for s in record.inputs)) if index in derived else set()

    def leaves(index: int) -> list[int]:  # the reference weights a candidate leaf holds
        return [m.reference for m in result.matches.get(index, []) if reference[m.reference].leaf is not None]

    read = {  # the reference weights the port computes any value from
        r
        for c in candidate.records
        if c.leaf is None
        for s in c.inputs
        for w in weights(s)
        for r in leaves(w)
    }
    taken = {w for record in run for s in record.inputs for w in weights(s)}
    found = []
    for leaf in sorted(taken):
        held = leaves(leaf)
        if not held or any(u >= result.diverging for h in held for u in consumers.get(h, [])):
            continue
        due = [
            r.index
            for r in reference
            if r.leaf not in (None, "constant")
            and not r.leaf.startswith("input")
            and r.shape == candidate.records[leaf].shape
            and r.index not in read
            and r.index in used_r
            and any(u >= result.diverging for u in consumers.get(r.index, []))
        ]
        if due:
            use = min(due, key=lambda r: min(u for u in consumers[r] if u >= result.diverging))
            first = min(u for u in consumers[use] if u >= result.diverging)
            found.append((held[0], use, first))
    return found


def _residual_before(
    result: Alignment, blamed: Record, target: Record, classes: list[int], found_of, origin
) -> None:
    """Where the blamed value takes none of the values its counterpart takes, but one of its inputs
    holds a term of a sum (a residual connection) that the counterpart takes (the mean of the second
    norm computed from the attention's output, the residual never added): blame the statement that
    computed that term (``residual``), as ``_reroute`` does where the sum itself is due. Only where
    the term's numbers are computed once and feed no good value, the sum is held nowhere, and its
    other term is a value, not an additive mask."""
    candidate, reference = result.candidate, result.reference.records
    held_anywhere = {
        classes[r] for c in candidate.records if c.leaf is None for r in _whole_or_parts(result, c.index)
    }
    for source in blamed.inputs:
        found = found_of(source)
        if not found or candidate.records[source].leaf is not None:
            continue
        first = origin(source, found)
        total = _residual(result, target, first, classes)
        if total is None or classes[total] in held_anywhere:
            continue
        others = [s for s in reference[total].inputs if classes[s] not in found]
        if len(others) != 1 or not _parting(reference[others[0]].value):
            continue
        again = [
            c.index
            for c in candidate.records
            if c.leaf is None and found_of(c.index) & found and origin(c.index, found_of(c.index)) != first
        ]
        if again or _used_well(result, first, found, found_of):
            continue
        result.residual, result.rerouted_from, result.blamed = total, result.blamed, first
        result.counterpart = total
        return


def _residual(result: Alignment, target: Record, first: int, classes: list[int]) -> int | None:
    """The reference's sum of the value ``first`` holds and another (a residual connection), where
    ``target`` (the value the consumer should have equalled) takes that sum; None if it takes none."""
    reference = result.reference.records
    held = {classes[r] for r in _whole_or_parts(result, first)}
    for source in target.inputs:
        record = reference[source]
        if record.call.split(".")[0] in ("add", "add_") and len(record.inputs) == 2:
            if any(classes[s] in held for s in record.inputs):
                return source
    return None


def _swapped_split(result: Alignment, blamed: Record, expected: list[int], found_of) -> int | None:
    """Where the blamed value takes two operands holding the reference's two operands swapped, and
    both come by layout changes alone from one value, split from it on one line (``k, q, v =
    np.split(qkv, 3)``): the first record of that split (the names were bound the wrong way round
    there); None otherwise (operands computed apart are swapped where they are used)."""
    computed = [s for s in blamed.inputs if result.candidate.records[s].leaf is None]
    if len(computed) != 2 or len(expected) != 2 or expected[0] == expected[1]:
        return None
    first, second = (found_of(s) for s in computed)
    if not (expected[1] in first and expected[0] in second and expected[0] not in first):
        return None
    chains = [_layout_chain(result.candidate, s) for s in computed]
    shared = set(chains[0]) & set(chains[1])
    if not shared:
        return None
    root = max(shared)  # the last value both come from; each chain's record before it is split from it
    children = [chain[chain.index(root) - 1] for chain in chains if chain.index(root) > 0]
    if len(children) != 2 or children[0] == children[1]:
        return None
    locations = {result.candidate.records[c].location for c in children}
    return min(children) if len(locations) == 1 else None


def _layout_chain(trace: Trace, index: int) -> list[int]:
    """``index`` and the records it comes from by layout changes alone (a split, a reshape, a
    transpose), back to the first value that computed its numbers, which ends the list."""
    chain = [index]
    while True:
        record = trace.records[index]
        computed = [s for s in record.inputs if trace.records[s].leaf is None]
        if record.call.split(".")[0] not in _LAYOUT or len(computed) != 1:
            return chain
        index = computed[0]
        chain.append(index)


def _reroute_part(result: Alignment, bad_r: list[int], classes: list[int]) -> None:
    """In a loop over heads: blame the producer of an input holding a part (one head) of a reference
    value that an earlier value of the same line already held, where the reference value's parts
    are not all held (``v[:, :, 0:hd]`` in every iteration: one head's values used for all), unless
    those numbers also feed a good value."""
    candidate = result.candidate
    covered = _covered(result)
    for source in candidate.records[result.blamed].inputs:
        record = candidate.records[source]
        held = {p for p in result.parts.get(source, []) if p[0] not in covered}
        earlier = [
            other
            for other in result.parts
            if other < source and candidate.records[other].location == record.location
        ]
        if held and any(held & set(result.parts[other]) for other in earlier):
            if not _used_well(result, source, set(), lambda index: set()):
                result.rerouted_from, result.blamed = result.blamed, source
                result.counterpart = _counterpart(result, source, bad_r, classes)
                return


def _part_counterpart(
    result: Alignment, shown: int, unmatched: list[int], classes: list[int]
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """``(reference record, axes, indices)``: the slice the shown value should have equalled where its
    inputs hold parts of one index (one head, or one batch entry's head) alone, or where they hold
    none, the values its line takes from other lines (a softmax's last operation, whose inputs are
    the line's own): among the unmatched reference values with a slice of its layout, the one
    computed from most of the values those inputs hold parts of; where none is, the unmatched value
    the inputs hold a part of itself (a line normalising again weights already equal to the
    reference's, as a query's row of a causal softmax is when that row keeps one key)."""
    record = result.candidate.records[shown]
    held = [p for s in line_inputs(result.candidate, shown) for p in result.parts.get(s, [])]
    if not held:
        line = line_records(result.candidate, shown)
        taken = {s for r in line for s in r.inputs} - {r.index for r in line}
        held = [p for s in sorted(taken) for p in result.parts.get(s, [])]
    if len({indices for _, _, indices in held}) != 1:
        return None
    indices, ours = held[0][2], {classes[r] for r, _, _ in held}
    loop = tuple(result.reference.records[held[0][0]].shape[a] for a in held[0][1])  # the slices' count
    best, best_shared = None, 0
    for r in unmatched:
        value = result.reference.records[r].value
        n = value.size // max(record.value.size, 1)
        shared = len(ours & {classes[s] for s in result.reference.records[r].inputs})
        if n < 2 or value.size != n * record.value.size or shared <= best_shared:
            continue
        for axes in slicings(value.shape, n):
            if len(axes) != len(indices) or tuple(value.shape[a] for a in axes) != loop:
                continue  # sliced along another axis than the parts held (a query row is no head_dim)
            if any(i >= value.shape[a] for a, i in zip(axes, indices, strict=True)):
                continue
            if in_layout(take_part(value, axes, indices), record.shape, result.rules) is not None:
                best, best_shared = (r, axes, indices), shared
                break
    if best is not None:
        return best
    for r, axes, parts in held:
        value = take_part(result.reference.records[r].value, axes, parts)
        if r in unmatched and in_layout(value, record.shape, result.rules) is not None:
            return r, axes, parts
    return None
