"""``locate``: run a reference and a candidate port, capture every value both compute, align them
and report the first line where the candidate diverges."""

from __future__ import annotations

import inspect
import linecache
import os
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from parity_tests.locate.activation import activation_cause
from parity_tests.locate.align import (
    _PRODUCTS,
    Alignment,
    align,
    ancestors,
    blame_location,
    hides,
    layout_classes,
    line_records,
    match_values,
    once,
    scale_left_out,
    take_part,
    tolerance_of,
)
from parity_tests.locate.causes import (
    axis_names,
    describe_scale,
    mask_causes,
    read_causes,
    rope_causes,
    scale_between,
)
from parity_tests.locate.dropout import ambiguous, dropout_causes
from parity_tests.locate.expand import stopped_short
from parity_tests.locate.layout import in_layout
from parity_tests.locate.report import LocateReport
from parity_tests.locate.run import capture, framework_of, source_file, unwrapped
from parity_tests.locate.trace import Raised, Record, Trace, is_user_file
from parity_tests.locate.transforms import due_value, paired_part, transform_causes

__all__ = [
    "compare_traces",
    "drawn_inputs",
    "locate",
    "locate_runs",
    "locate_shapes",
    "raised_report",
    "sizes_of",
]


def locate(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    inputs: Any,
    *,
    params: Mapping[str, Any] | None = None,
    reference_framework: str | None = None,
    candidate_framework: str | None = None,
    train: bool = False,
) -> LocateReport:
    """Compare ``candidate`` with ``reference`` line by line, neither instrumented.

    Each is a torch module or function, a JAX function, jitted callable or NNX module, or a NumPy function
    (the framework is read from the callable, or given); ``inputs`` is one array or a tuple of positional
    arguments from any framework; ``params`` (the weights format) goes first to the functions (a module or
    other callable object holds its own weights). A torch reference runs in eval mode unless ``train``;
    then the keep-masks of its dropouts are given to a JAX candidate in place of its own random draws (the
    boolean of its ``bernoulli`` or ``uniform`` comparison, matched by size in order), or drawn by the
    ``np.random.Generator`` a NumPy candidate is given (uniform draws that give the reference's mask
    compared with its rate, both ways of reading them tried: ``u >= p`` and ``u < 1 - p`` keep), so
    both sides drop the same entries; a port comparing with another rate or using its mask the wrong
    way round drops others, and the cause gives the share it drops (``dropout``).

    A candidate that raises is a finding: the report names the exception (``raised``) and the
    candidate's line raising it (see ``raised_report``). A reference that raises is the caller's
    error: ``Raised`` (``type: message``; the reference's exception is its ``error``).
    """
    frameworks = {"reference_framework": reference_framework, "candidate_framework": candidate_framework}
    return locate_runs(reference, candidate, inputs, params=params, train=train, **frameworks)[0]


def locate_runs(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    inputs: Any,
    *,
    params: Mapping[str, Any] | None = None,
    reference_framework: str | None = None,
    candidate_framework: str | None = None,
    train: bool = False,
) -> tuple[LocateReport, Trace, Trace | None]:
    """``locate``'s report with the two runs it compared: the reference's trace and the
    candidate's (for a NumPy candidate in train mode, or a JAX one whose draws may not tell a
    keep-mask from a drop-mask, the run whose reading of the draws agrees best), None where the
    candidate raised. Takes and raises what ``locate`` does."""
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    expected = capture(reference, args, params, reference_framework, train)
    masks, rates = expected.keep_masks, expected.drop_rates
    given = {"keep_masks": masks, "drop_rates": rates}
    try:
        actual = capture(candidate, args, params, candidate_framework, train, **given)
    except Raised as raised:
        return raised_report(expected, raised, candidate), expected, None
    report = compare_traces(expected, actual)
    framework = candidate_framework or framework_of(candidate)
    if report.ok or not masks or framework not in ("numpy", "jax"):
        return report, expected, actual
    if framework == "jax" and not any(
        r is not None and ambiguous(m.size, r) for m, r in zip(masks, rates, strict=True)
    ):  # its draws told keep-masks from drop-masks: no other reading
        return report, expected, actual
    low = capture(candidate, args, params, candidate_framework, train, kept_high=False, **given)
    other = compare_traces(expected, low)  # a port keeping low draws (u < 1 - p), or a JAX drop-mask
    if other.ok or len(other.verified) > len(report.verified):
        return other, expected, low
    return report, expected, actual


def locate_shapes(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    shapes: Sequence[tuple[int, ...]],
    *,
    seeds: Sequence[int] = (0,),
    dtype: str = "float32",
    params: Mapping[str, Any] | None = None,
    train: bool = False,
    gradients: bool = False,
    vocab: int | None = None,
    reference_framework: str | None = None,
    candidate_framework: str | None = None,
) -> dict[tuple[tuple[int, ...], int], LocateReport]:
    """``locate`` on a standard normal input of each shape and seed (``dtype``), or with ``vocab``
    on token ids drawn uniformly from ``[0, vocab)`` (int64: a whole language model): bugs that show
    only past a block size or at odd head counts (``locate_gradients`` with ``gradients``; ``train``
    and the frameworks as for ``locate``). Returns the reports keyed by ``(shape, seed)``; a
    reference that raises raises ``Raised`` (a candidate that raises is a report, as in ``locate``)."""
    from parity_tests.locate.gradients import locate_gradients

    check = locate_gradients if gradients else locate
    frameworks = {"reference_framework": reference_framework, "candidate_framework": candidate_framework}
    return {
        key: check(reference, candidate, x, params=params, train=train, **frameworks)
        for key, x in drawn_inputs(shapes, seeds, dtype, vocab)
    }


def drawn_inputs(
    shapes: Sequence[tuple[int, ...]],
    seeds: Sequence[int] = (0,),
    dtype: str = "float32",
    vocab: int | None = None,
) -> Iterator[tuple[tuple[tuple[int, ...], int], np.ndarray]]:
    """``((shape, seed), x)`` for each shape and seed, one at a time: ``x`` standard normal in
    ``dtype`` drawn by ``np.random.default_rng(seed)``, or with ``vocab`` int64 token ids drawn
    uniformly from ``[0, vocab)`` (the inputs of ``locate_shapes`` and ``attn-parity diff``)."""
    for shape in map(tuple, shapes):
        for seed in seeds:
            draw = np.random.default_rng(seed)
            x = draw.standard_normal(shape).astype(dtype) if vocab is None else draw.integers(0, vocab, shape)
            yield (shape, seed), x


def sizes_of(reference: Trace, rules: dict[int, tuple[int, ...]]) -> dict[str, int]:
    """Sizes of the run by axis name (``tokens``, ``batch``, ``feature``, ``head``, ``head_dim``):
    the tokens and batch from the first input (``(B, T, D)`` embeddings or ``(B, T)`` token ids),
    the heads from the first split of another size than ``B * T``."""
    first_input = next((r for r in reference.records if r.leaf and r.leaf.startswith("input")), None)
    sizes: dict[str, int] = {}
    if first_input is not None and first_input.value.ndim >= 2:
        ids = first_input.value.dtype.kind in "iu"
        sizes["tokens"] = first_input.shape[-1 if ids else -2]
        if first_input.value.ndim >= (2 if ids else 3):
            sizes["batch"] = first_input.shape[0]
    tokens = sizes.get("batch", 1) * sizes.get("tokens", 0)
    heads = [(whole, parts) for whole, parts in rules.items() if len(parts) == 2 and whole != tokens]
    if heads:
        sizes["feature"], (sizes["head"], sizes["head_dim"]) = heads[0][0], heads[0][1]
    return sizes


def _label(trace: Trace, index: int) -> str:
    """A reference value's name (``Record.label``)."""
    return trace.records[index].label


def _one_op_span(alignment: Alignment) -> list[str]:
    """The candidate lines computing, from values found equal, the one reference operation the
    blamed value should have equalled (a softmax written over three lines): from the blamed record
    along its consumers up to the one joining a found-equal value that the reference's next
    operation also takes (the values a softmax's weights meet). Empty when the reference
    operation's inputs are not all found equal, or its next operation takes no other value."""
    reference, candidate = alignment.reference, alignment.candidate
    if alignment.rerouted_from is not None or alignment.blamed is None:
        return []
    found = {m.reference: c for c in alignment.verified for m in alignment.matches.get(c, [])}
    target = reference.records[alignment.counterpart]
    if any(s not in found for s in target.inputs if reference.records[s].leaf is None):
        return []
    partners = {  # the other computed values the reference's next operations take
        s
        for r in reference.records
        if target.index in r.inputs
        for s in r.inputs
        if s != target.index and reference.records[s].leaf is None
    }
    joining = {found[s] for s in partners if s in found}
    if not joining:
        return []
    chain, lines = {alignment.blamed}, [candidate.records[alignment.blamed].location]
    for record in candidate.records[alignment.blamed + 1 :]:
        if chain & set(record.inputs):
            if joining & set(record.inputs):
                return list(dict.fromkeys(lines))
            chain.add(record.index)
            lines.append(record.location)
    return []


def raised_report(expected: Trace, raised: Raised, candidate: Any) -> LocateReport:
    """The report for a candidate that raised: ``raised`` (``type: message``), the candidate's line
    raising it (``candidate_location``, its source text as ``candidate_op``: the innermost frame
    in the file defining ``candidate``, else the innermost of the user's frames), ``verified``
    the lines it computed before whose values equal reference values (for a JAX candidate raising
    while traced, those of its eager run up to the same exception, see ``capture_jax``), and a cause
    naming the last reference value it reproduced; where JAX evaluated nothing (the eager run did not
    raise the same), the cause says so. A TypeError raised by the call itself, in none of the user's
    frames (a signature that does not take the arguments), is blamed on the candidate's definition,
    the cause naming the call it could not take."""
    frames = traceback.extract_tb(raised.error.__traceback__)
    own = source_file(candidate)
    own = own and os.path.realpath(own)
    at = [f for f in frames if os.path.realpath(f.filename) == own] or [
        f for f in frames if is_user_file(f.filename)
    ]
    actual = raised.trace
    if not at and isinstance(raised.error, TypeError):
        return _refused_call(raised, candidate)
    alignment = match_values(expected, actual)
    agreeing = [i for i in sorted(alignment.matches) if actual.records[i].leaf is None]
    report = LocateReport(
        False,
        f"the candidate raised {raised}",
        f"{at[-1].filename}:{at[-1].lineno}" if at else None,
        candidate_op=at[-1].line if at else None,
        raised=str(raised),
        verified=list(
            dict.fromkeys(f"{actual.records[i].location}  {actual.records[i].op}" for i in agreeing)
        ),
    )
    if agreeing:
        last = actual.records[agreeing[-1]]
        other = expected.records[alignment.matches[last.index][0].reference]
        report.causes.append(
            f"the last value equal to the reference's is {_label(expected, other.index)} "
            f"({other.location}), computed at {last.location}"
        )
    elif actual.framework == "jax" and not actual.records:
        report.causes.append(
            "JAX raised while tracing, so no value was evaluated to compare (run without jit, the port "
            "does not raise this)"
        )
    else:
        report.causes.append("no value the candidate computed before it equals a reference value")
    return report


def _refused_call(raised: Raised, candidate: Any) -> LocateReport:
    """The report for a candidate whose signature does not take the call: located at its ``def``
    (or its class), the cause naming the arguments it was given (the leaves its run read)."""
    target = unwrapped(candidate)
    defined = target if inspect.isroutine(target) else type(target)
    name = getattr(defined, "__name__", type(target).__name__)
    try:
        signature = f"{name}{inspect.signature(candidate)}"
    except (TypeError, ValueError):  # a builtin without one
        signature = f"{name}(...)"
    try:
        location = f"{inspect.getsourcefile(defined)}:{inspect.getsourcelines(defined)[1]}"
    except (OSError, TypeError):
        location = None
    leaves = [r for r in raised.trace.records if r.leaf is not None]
    weights = [r for r in leaves if not r.leaf.startswith("input")]
    given = [f"the weights ({len(weights)} arrays)"] * bool(weights)
    given += [f"{r.dtype} {r.shape}" for r in leaves if r.leaf.startswith("input")]
    call = f"{name}({', '.join(given)})"
    return LocateReport(
        False,
        f"the candidate raised {raised}",
        location,
        candidate_op=f"def {signature}",
        raised=str(raised),
        causes=[
            f"the candidate cannot take the call {call}: its signature is {signature} (the weights go "
            "first to a function; a module or other callable object is called on the inputs alone)"
        ],
    )


def compare_traces(expected: Trace, actual: Trace) -> LocateReport:
    """The report for two captured traces (see ``locate``)."""
    with np.errstate(all="ignore"):  # NaN and inf in a diverging value are data, not errors
        return _compare(expected, actual)


def _compare(expected: Trace, actual: Trace) -> LocateReport:
    alignment = align(expected, actual)
    verified = [f"{actual.records[i].location}  {actual.records[i].op}" for i in alignment.verified]
    verified = list(dict.fromkeys(verified))
    if alignment.output_ok:
        return LocateReport(True, verified=verified)
    blamed, diverging = actual.records[alignment.shown], expected.records[alignment.diverging]
    counterpart = expected.records[alignment.counterpart]
    sizes = sizes_of(expected, alignment.rules)
    row = _query_row(counterpart.shape, alignment.counterpart_part, sizes)
    if alignment.counterpart_part is not None:  # one head of it: the slice, as a record of its own
        value = take_part(counterpart.value, *alignment.counterpart_part)
        counterpart = Record(
            counterpart.index, counterpart.op, value, counterpart.dtype, counterpart.location
        )
    elif once(counterpart.value, blamed.shape) is not counterpart.value:  # one copy of a broadcast
        value = once(counterpart.value, blamed.shape)
        counterpart = Record(
            counterpart.index, counterpart.op, value, counterpart.dtype, counterpart.location
        )
    named = [r for r in expected.records[diverging.index :] if r.step] if expected.steps else []
    first = named[0].step if named else diverging.op
    rtol, atol = tolerance_of(blamed, counterpart)
    location = blame_location(alignment)
    report = LocateReport(
        False,
        first,
        location,
        diverging.location,
        blamed.op if location == blamed.location else _source_text(location, blamed.op),
        diverging.op,
        verified=verified,
        rtol=rtol,
        atol=atol,
        expected_dtype=counterpart.dtype,
        actual_dtype=blamed.dtype,
        candidate_loops=", ".join(str(loop) for loop in actual.records[alignment.blamed].loops),
        reference_module=diverging.module or None,
    )
    if alignment.stopped is not None:
        step = expected.records[alignment.steps[alignment.stopped][0]]
        operation = expected.records[step.expands]
        report.causes.append(stopped_short(operation.call, step.op.split(": ", 1)[-1], operation.location))
    span = _one_op_span(alignment)
    if len(span) > 1:
        report.causes.append(
            f"the reference computes lines {', '.join(span)} in one operation ({counterpart.op}) from "
            "values found equal: the bug may be on any of them, not only the first"
        )
    unmasked = alignment.unmasked_scores  # a fused call's scores, where the reference masks them
    laid_out = in_layout(blamed.value if unmasked is None else unmasked, counterpart.shape, alignment.rules)
    misrouted = [  # not a weight: the line holding a weight as it is (wte.T) takes no wrong variable
        m
        for m in alignment.matches.get(blamed.index, [])
        if m.kind == "exact" and (expected.records[m.reference].leaf or "input").startswith("input")
    ]
    activation = activation_cause(alignment)
    if activation is not None:
        report.causes.append(activation)
    if alignment.taken is not None:
        report.causes.append(_taken(expected, actual, alignment))
    if alignment.weights is not None:
        held, due = (expected.records[i] for i in alignment.weights)
        report.causes.append(
            f"another layer's weights: this takes the reference's {held.leaf} where it uses {due.leaf} "
            f"({counterpart.location})"
        )
    if alignment.residual is not None:
        report.causes.append(_residual_left_out(expected, alignment))
        misrouted = []
    elif alignment.swapped:
        report.causes.append(_swapped(expected, actual, alignment))
        misrouted = []
    if alignment.duplicate is not None:  # held a second time where its sibling is due
        held, due = (expected.records[i] for i in alignment.duplicate[:2])
        report.causes.append(
            f"this value equals the reference's {held.label} ({held.location}), where its {due.label} "
            f"({due.location}) are due: taken from the wrong variable or weights"
        )
        misrouted = []
    if misrouted:
        other = expected.records[misrouted[0].reference]
        report.causes.append(
            _mask_sense(expected, actual, other, report.candidate_location)
            or f"this value equals the reference's {_label(expected, other.index)} "
            f"({other.location}): taken from the wrong variable or weights"
        )
    used = ancestors(actual, actual.output)
    unused = [
        r
        for r in actual.records
        if r.leaf is None
        and r.index not in used
        and any(m.reference == counterpart.index for m in alignment.matches.get(r.index, []))
    ]
    if unused:
        report.causes.append(
            f"computed but not used: {unused[0].location} ({unused[0].op}) equals the reference's "
            f"{_label(expected, counterpart.index)}, but the output is not computed from it"
        )
    again = alignment.repeated.get(blamed.index)
    rerouted = alignment.rerouted_from is not None and alignment.duplicate is None
    if again is not None or (rerouted and blamed.index in alignment.parts):
        r, axes, indices = again or alignment.parts[blamed.index][0]
        other = expected.records[r]
        names = axis_names(other.shape, sizes)
        slice_name = ", ".join(f"{names[a]} {i}" for a, i in zip(axes, indices, strict=True))
        name = names[axes[-1]]
        classes = layout_classes(expected, alignment.rules)
        named = next((x for x in expected.records if x.step and classes[x.index] == classes[r]), other)
        report.causes.append(
            f"this value equals {slice_name} of the reference's {_label(expected, named.index)} "
            f"({named.location}), as a value this line computed before does: the same slice taken "
            f"again where another {name}'s is due"
        )
    unscaled = scale_left_out(alignment)
    if unscaled is not None and alignment.factors and not _scaled_otherwise(alignment, unscaled, laid_out):
        report.causes.append(
            f"scale left out: this is computed from the reference's {_label(expected, unscaled)} as it "
            f"is, where the reference scales it by {describe_scale(alignment.factors[0], sizes)} first"
        )
    if (
        laid_out is not None
        and laid_out.dtype.kind in "fb"
        and counterpart.value.dtype.kind in "fb"
        and (laid_out.dtype == bool) == (counterpart.value.dtype == bool)  # not a mask for a float value
    ):
        e, a = counterpart.value.astype(np.float64), laid_out.astype(np.float64)
        report.axes = axis_names(counterpart.shape, sizes)
        if row is not None:  # one query's row: its last axis the keys
            report.axes = (*report.axes[:-1], "key")
        error = np.abs(np.nan_to_num(a - e, nan=np.inf, posinf=np.inf, neginf=np.inf))
        error[(e == a)] = 0
        worst = np.unravel_index(int(np.argmax(error)), error.shape) if error.size else ()
        report.worst_index = tuple(int(i) for i in worst)
        report.expected, report.actual = float(e[worst]), float(a[worst])
        report.expected_value, report.actual_value = e, a
        if alignment.unwritten is not None:
            buffer = actual.records[alignment.unwritten]
            report.causes.append(_never_written(a == buffer.value.flat[0], report.axes, buffer.location))
        masks = _masks(actual, {counterpart.shape[-2:], diverging.shape[-2:]})
        fix = "pass is_causal=True or a mask" if unmasked is None else "pass is_causal=True or attn_mask"
        hides = (_hides(expected, counterpart.index), _hides(actual, blamed.index))
        named = sizes  # past the attention, no factor is its scale (GELU's 0.5 is no 1/sqrt(4))
        if counterpart.index in _past_attention(alignment):
            named = {k: v for k, v in sizes.items() if k not in ("head", "head_dim", "feature")}
        report.causes += read_causes(
            counterpart.value, laid_out, report.axes, named, rtol, atol, masks,
            _scale_after(alignment, counterpart.index), fix, hides, row,
        )  # fmt: skip
        divisor = _variance_divisor(expected, counterpart, e, a, rtol, atol)
        if divisor is not None:  # the factor named for what it is
            report.causes = [divisor, *(c for c in report.causes if not c.startswith("scale differs"))]
        if any(cause.startswith("mask inverted") for cause in report.causes):
            _mask_taken_as_made(report, expected, actual, alignment)
        _add_new(report, _dropout_causes(expected, alignment, e, a, rtol, atol))
        if not report.causes:
            report.causes += _interleaved_pairs(expected, counterpart, a, rtol, atol)
        skipped = _skipped_step(alignment)
        if skipped is not None:  # the line's value where the reference computes the diverging one
            later = _scale_after(alignment, diverging.index)
            axes = axis_names(diverging.shape, sizes)
            _add_new(report, read_causes(diverging.value, skipped, axes, sizes, rtol, atol, masks, later))
        if len(span) > 1:  # what the span's last line computes, the reference's one operation's value
            last = [r for r in actual.records[alignment.blamed :] if r.location == span[-1]][-1]
            joined = in_layout(last.value, counterpart.shape, alignment.rules)
            if joined is not None and joined.dtype.kind == "f":
                found = read_causes(counterpart.value, joined, report.axes, sizes, rtol, atol, masks, row=row)
                _add_new(report, found)
    elif laid_out is None and blamed.value.dtype.kind == "f":
        _add_new(report, _before_expansion(expected, counterpart, blamed.value, rtol, atol))
    if not report.causes:  # the value due may be a later one, or this one's first slice
        due = due_value(diverging.value, blamed.shape, alignment.rules, paired_part(alignment))
        if due is not None and due.dtype.kind == "f" and blamed.value.dtype.kind == "f":
            axes = axis_names(due.shape, sizes)
            report.causes += read_causes(due, blamed.value, axes, sizes, rtol, atol, masks=True)
        report.causes += transform_causes(alignment, sizes)
    return report


def _past_attention(alignment: Alignment) -> set[int]:
    """The reference records computed after the first product with weights that follows the
    softmax the scale is applied before (after the attention's output projection: the residual
    stream, the feed-forward layers), where a factor is no scale of the attention's."""
    reference = alignment.reference.records
    past: set[int] = set()
    for record in reference:
        projected = any(
            s in alignment.settled
            and reference[s].call.split(".")[0] in _PRODUCTS
            and any(reference[w].leaf not in (None, "constant") for w in reference[s].inputs)
            for s in record.inputs
        )
        if projected or any(s in past for s in record.inputs):
            past.add(record.index)
    return past


def _variance_divisor(
    expected: Trace, counterpart: Record, due: np.ndarray, value: np.ndarray, rtol: float, atol: float
) -> str | None:
    """Where the value due is a statistic per row (its last axis 1) of a value of ``n`` entries a row
    and the line's value is ``n / (n - 1)`` times it (or ``(n - 1) / n``): the variance divided by
    ``n - 1`` where the reference divides by ``n`` (or the other way round); else None."""
    if counterpart.shape[-1:] != (1,) or due.ndim < 2 or (due < 0).any():  # (a variance: never negative)
        return None
    factor = scale_between(due, value, rtol, atol)
    sizes = {
        expected.records[s].shape[-1]
        for s in counterpart.inputs
        if expected.records[s].leaf is None or expected.records[s].leaf.startswith("input")
        if expected.records[s].shape[:-1] == counterpart.shape[:-1] and expected.records[s].shape[-1] > 2
    }
    if factor is None or len(sizes) != 1:
        return None
    n = sizes.pop()
    where = f"the reference's {counterpart.label} ({counterpart.location})"
    if abs(factor / (n / (n - 1)) - 1) < 1e-4:
        return (
            f"unbiased variance: yours is {n}/{n - 1} times {where}, dividing by n - 1 where the biased "
            "variance, divided by n, is due (np.var's ddof=0, torch's unbiased=False)"
        )
    if abs(factor / ((n - 1) / n) - 1) < 1e-4:
        return (
            f"biased variance: yours is {n - 1}/{n} times {where}, dividing by n where the unbiased "
            "variance, divided by n - 1, is due (np.var's ddof=1, torch's unbiased=True)"
        )
    return None


def _dropout_causes(
    expected: Trace, alignment: Alignment, due: np.ndarray, value: np.ndarray, rtol: float, atol: float
) -> list[str]:
    """Where the value due (``due``) is a train-mode dropout's output: what the blamed line leaves
    (its last value in ``due``'s layout after the one shown, ``value``, as the shown one is: a
    NumPy line's ``where`` after the scale it takes) shows against the dropout's input
    (``dropout.dropout_causes``: the share of entries dropped, the scale of the kept ones); else
    nothing."""
    dropout = expected.records[alignment.counterpart]
    if not any(expected.records[i].op == "keep_mask" for i in dropout.inputs):
        return []
    given = expected.records[dropout.inputs[0]].value
    if alignment.counterpart_part is not None:  # one head of it
        given = take_part(given, *alignment.counterpart_part)
    shown = alignment.candidate.records[alignment.shown]
    for record in alignment.candidate.records[shown.index + 1 :]:
        if record.location != shown.location:
            break
        laid_out = in_layout(record.value, due.shape, alignment.rules)
        if record.loops == shown.loops and laid_out is not None and laid_out.dtype.kind == "f":
            value = laid_out
    return dropout_causes(given, due, value, dropout.keywords, rtol, atol)


def _query_row(
    shape: tuple[int, ...], part: tuple[tuple[int, ...], tuple[int, ...]] | None, sizes: dict[str, int]
) -> int | None:
    """The query index where ``part`` (the counterpart's slice: its axes and indices) takes one query
    row of a reference value of ``shape`` whose last two axes are (query, key), its keys all kept (a
    port computing attention one query at a time); None for any other part."""
    if part is None or len(shape) < 2 or axis_names(shape, sizes)[-2:] != ("query", "key"):
        return None
    axes, indices = part
    if len(shape) - 1 in axes or len(shape) - 2 not in axes:
        return None
    return indices[axes.index(len(shape) - 2)]


def _scaled_otherwise(alignment: Alignment, unscaled: int, laid_out: np.ndarray | None) -> bool:
    """Whether the blamed line scales the reference value ``unscaled`` after all (a value of its
    line is that value times a factor other than the one undoing the reference's scale, where
    ``unscaled`` is computed after it, else 1), or its shown value (``laid_out`` as the
    counterpart) is the counterpart times a factor other than the one leaving the reference's scale
    out (its inverse where the counterpart is scaled, else 1): a scale applied, a wrong one, not
    left out."""
    counterpart = alignment.reference.records[alignment.counterpart]
    rtol, atol = tolerance_of(alignment.candidate.records[alignment.shown], counterpart)
    if laid_out is not None and laid_out.dtype.kind == "f" and counterpart.value.dtype.kind == "f":
        left_out = 1 / alignment.factors[0] if counterpart.index in alignment.scaled else 1.0
        if _scaled_by_another(counterpart.value, laid_out, left_out, rtol, atol):
            return True
    given = alignment.reference.records[unscaled].value
    as_it_is = 1 / alignment.factors[0] if unscaled in alignment.scaled else 1.0  # yours holds it unscaled
    for record in line_records(alignment.candidate, alignment.shown):
        due = (
            due_value(given, record.shape, alignment.rules, paired_part(alignment))
            if record.value.dtype.kind == "f"
            else None
        )
        if (
            due is not None
            and due.dtype.kind == "f"
            and _scaled_by_another(due, record.value, as_it_is, rtol, atol)
        ):
            return True
    return False


def _scaled_by_another(
    reference: np.ndarray, value: np.ndarray, expected: float, rtol: float, atol: float
) -> bool:
    """Whether ``value`` is ``reference`` times one factor, other than ``expected`` (by more than 0.1 %)."""
    factor = scale_between(reference.astype(np.float64), value.astype(np.float64), rtol, atol)
    return factor is not None and abs(factor / expected - 1) > 1e-3


def _interleaved_pairs(
    expected: Trace, counterpart, value: np.ndarray, rtol: float, atol: float
) -> list[str]:
    """Where the reference takes half of the last axis of a value (RoPE's halves ``x[..., :H/2]``,
    ``x[..., H/2:]``) and the line's value is that value's even or odd entries instead: the
    interleaved pairs ``(2i, 2i + 1)``."""
    for source in counterpart.inputs:
        given = expected.records[source].value
        if not isinstance(given, np.ndarray) or given.shape[:-1] != value.shape[:-1] or given.ndim < 2:
            continue
        if given.shape[-1] != 2 * value.shape[-1]:
            continue
        for start, which in ((0, "even"), (1, "odd")):
            if np.allclose(given[..., start::2], value, rtol=rtol, atol=atol):
                return [
                    f"RoPE pairs interleaved: yours takes the {which} entries of each head, pairs (2i, 2i+1) "
                    "as in the RoFormer paper, where the reference takes its halves, pairs (i, i + H/2): the "
                    "half-split rotation of the book and transformers (rotate_half)"
                ]
    return []


def _before_expansion(expected: Trace, counterpart, value: np.ndarray, rtol: float, atol: float) -> list[str]:
    """Where the line's value has not the reference value's shape (the key/value heads before the
    reference repeats them for their query heads, positions before the reference's angles): the RoPE
    causes the line's value shows against the nearest value of its shape the reference computes that
    value from (its inputs, then theirs, three levels up)."""
    sources, seen = list(counterpart.inputs), set()
    for _ in range(3):  # the nearest values first: inputs, their inputs, ...
        for source in sources:
            given = expected.records[source].value
            if isinstance(given, np.ndarray) and given.shape == value.shape and given.dtype.kind == "f":
                return rope_causes(given.astype(np.float64), value.astype(np.float64), rtol, atol)
        seen |= set(sources)
        sources = [i for s in sources for i in expected.records[s].inputs if i not in seen]
    return []


def _taken(expected: Trace, actual: Trace, alignment: Alignment) -> str:
    """The cause for a value computed from another variable than the one due (its numbers are
    used right elsewhere)."""
    held = [m.reference for m in alignment.matches.get(alignment.taken, [])]
    held += [r for r, _, _ in alignment.parts.get(alignment.taken, [])]
    target = expected.records[alignment.counterpart]
    classes = layout_classes(expected, alignment.rules)
    covered = set()
    for source in actual.records[alignment.blamed].inputs:
        covered |= {classes[m.reference] for m in alignment.matches.get(source, [])}
        covered |= {classes[r] for r, _, _ in alignment.parts.get(source, [])}
    due = [s for s in target.inputs if expected.records[s].leaf is None and classes[s] not in covered]
    what = f" where its {_label(expected, due[0])} is due" if due else ""
    other = f"the reference's {_label(expected, held[0])}" if held else "another value"
    return (
        f"another variable: this takes {other} ({actual.records[alignment.taken].location}){what}, "
        "a value used right elsewhere"
    )


def _residual_left_out(expected: Trace, alignment: Alignment) -> str:
    """The cause for a value the reference adds another to (a residual connection) used without it."""
    total = expected.records[alignment.residual]
    held = {m.reference for m in alignment.matches.get(alignment.blamed, [])}
    held |= {r for r, _, _ in alignment.parts.get(alignment.blamed, [])}
    classes = layout_classes(expected, alignment.rules)
    mine = [s for s in total.inputs if any(classes[s] == classes[h] for h in held)]
    other = [expected.records[s] for s in total.inputs if s not in mine]
    added = f" {_label(expected, other[0].index)} ({other[0].location})" if other else " another value"
    if (
        mine
        and other
        and not (
            other[0].index in ancestors(expected, mine[0]) or mine[0] in ancestors(expected, other[0].index)
        )
    ):  # two terms computed apart (token and position embeddings): no skip connection
        what = "a term of a sum"
    else:
        what = "a residual connection"
    return (
        f"{what} left out: this is a value the reference adds{added} to first "
        f"({total.location}); yours goes on without the sum"
    )


def _swapped(expected: Trace, actual: Trace, alignment: Alignment) -> str:
    """The cause for operands split from one value and bound the wrong way round."""
    consumer = actual.records[alignment.rerouted_from]
    target = expected.records[alignment.counterpart]
    names = [_label(expected, s) for s in target.inputs]
    return (
        f"operands swapped where they are split from one value: {consumer.location} takes what this "
        f"line splits off the other way round (the reference's {names[1]} where its {names[0]} is due, "
        "and the other way round)"
    )


def _scale_after(alignment: Alignment, index: int) -> float | None:
    """The scale the reference applies after its value ``index`` (``read_causes``'
    ``reference_scale``): its first factor where that value is computed before it; else None."""
    return alignment.factors[0] if alignment.factors and index not in alignment.scaled else None


def _add_new(report: LocateReport, causes: list[str]) -> None:
    """Add to ``report`` the ``causes`` it does not list yet."""
    report.causes += [c for c in causes if c not in report.causes]


def _skipped_step(alignment: Alignment) -> np.ndarray | None:
    """Where the blamed line computes, in one call, the diverging reference value and later ones
    (its counterpart is computed after the diverging value: ``jax.nn.dot_product_attention`` for
    the masked scores, the weights and the context): the last value of the line holding an input
    of the diverging value, laid out as that value (the scores the line goes on with where the
    reference masks them); None when the line holds none."""
    reference, candidate = alignment.reference, alignment.candidate
    target = reference.records[alignment.diverging]
    if alignment.diverging >= alignment.counterpart:
        return None
    classes = layout_classes(reference, alignment.rules)
    inputs = {classes[s] for s in target.inputs if reference.records[s].leaf is None}
    for record in reversed(line_records(candidate, alignment.shown)):
        if any(classes[m.reference] in inputs for m in alignment.matches.get(record.index, [])):
            value = in_layout(record.value, target.shape, alignment.rules)
            if value is not None and value.dtype.kind == "f" and target.value.dtype.kind == "f":
                return value
    return None


def _never_written(unwritten: np.ndarray, axes: list[str], location: str) -> str:
    """The cause for a buffer whose writes left ``unwritten`` (its entries still at their initial
    value), naming the slices (``head 1``) that are wholly unwritten where they are all of it."""
    where = ""
    for axis, name in enumerate(axes):
        whole = [i for i in range(unwritten.shape[axis]) if np.take(unwritten, i, axis=axis).all()]
        if whole and np.take(unwritten, whole, axis=axis).sum() == unwritten.sum():
            where = f" ({name} {', '.join(map(str, whole))})"
            break
    return (
        f"never written: {int(unwritten.sum())} of {unwritten.size} entries{where} keep the value the "
        f"buffer of {location} started with: the loop filling it stops short"
    )


def _masks(trace: Trace, scores: set[tuple[int, ...]]) -> bool:
    """Whether a value on the way to the trace's output, over the (query, key) axes of ``scores``
    (the last two axes of the values compared), hides entries (-inf, a fill at or below -1e4), is a boolean
    mask, or is one of its inputs with some entries zeroed and the others unchanged (weights times
    ``np.tril(np.ones(...))``; not ``x - x.max()``, zero at the maxima, which changes the others).
    Values over other axes (a gather's index check over the tokens) hide no scores."""
    for index in ancestors(trace, trace.output):
        value = trace.records[index].value
        if value.ndim < 2 or value.shape[-2:] not in scores:
            continue
        if value.dtype == bool or hides(value):
            return True
        if value.dtype.kind == "f" and any(
            _zeroes_entries(value, trace.records[s].value) for s in trace.records[index].inputs
        ):
            return True
    return False


def _source_text(location: str, default: str) -> str:
    """The source text of ``path:line`` (the line blamed where the value shown was computed in a
    helper it calls), else ``default``."""
    path, _, line = location.rpartition(":")
    linecache.checkcache(path)  # the file as it is now, not as an earlier run read it
    text = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
    return text or default


# the operations negating a boolean value: JAX's ``~``, NumPy's ``~``, ``np.logical_not``, torch's
NEGATIONS = frozenset({"not", "invert", "logical_not", "bitwise_not"})


def _mask_taken_as_made(report: LocateReport, expected: Trace, actual: Trace, alignment: Alignment) -> None:
    """Where the blamed line uses a boolean mask that another line made equal to the reference's
    (hiding where True), but hides where it is False (``where(mask, scores, -inf)``): that line
    gives the mask the reference's meaning, so either of the two lines may be the wrong one, and
    fixing either fixes the port. The cause names the other line; where that line makes the mask by
    a negation (``~jnp.tril(...)``), the choice of meaning is written there: it is blamed instead."""
    blamed = actual.records[alignment.shown]
    for source in blamed.inputs:
        if actual.records[source].value.dtype != bool or _hides(actual, source) is not False:
            continue
        made = actual.records[source]
        while made.location == blamed.location:  # broadcast on the blamed line: to where it is made
            inputs = [i for i in made.inputs if actual.records[i].value.dtype == bool]
            if not inputs:
                break
            made = actual.records[inputs[0]]
        equal = [m.reference for m in alignment.matches.get(source, []) if m.kind == "exact"]
        if made.location == blamed.location or not any(
            expected.records[r].value.dtype == bool and _hides(expected, r) for r in equal
        ):
            continue
        meaning = "(jax.nn's and Flax's meaning, True = attend)"
        if made.op in NEGATIONS:
            user = report.candidate_location
            report.candidate_location = made.location
            report.candidate_op = _source_text(made.location, made.op)
            cause = (
                f"the mask made here by a negation ({made.op}) is the reference's as it is, True = hidden, "
                f"but {user} hides where it is False {meaning}: drop the negation, or swap that line's "
                "branches"
            )
        else:
            cause = (
                f"the mask it takes ({made.location}, {made.op}) is the reference's as it is, True = hidden, "
                f"but this line hides where it is False {meaning}: invert the mask there, or swap this "
                "line's branches"
            )
        _add_new(report, [cause])
        return


def _mask_sense(expected: Trace, actual: Trace, mask: Record, location: str) -> str | None:
    """What a boolean mask of the candidate's blamed line shows against the reference's boolean
    ``mask`` its line holds, each in the sense its use shows (``_hides``): a mask holding the
    reference's numbers but used the other way is inverted; None where nothing shows."""
    reference_hides = _hides(expected, mask.index)
    if reference_hides is None:
        return None
    due = mask.value if reference_hides else ~mask.value
    for record in actual.records:
        if record.location != location or record.value.dtype != bool:
            continue
        hides = _hides(actual, record.index)
        if hides is None:
            continue
        try:
            ours, theirs = np.broadcast_arrays(record.value if hides else ~record.value, due)
        except ValueError:
            continue
        if theirs.ndim >= 2 and (found := mask_causes(theirs, ours)):
            return found[0]
    return None


def _hides(trace: Trace, index: int) -> bool | None:
    """Whether boolean record ``index`` hides entries where True (``masked_fill(mask, -inf)``) or
    where False (``where(mask, scores, -inf)``), as the first float value computed from it that is
    -inf or very negative exactly where it (or its negation) says shows; through the boolean values
    computed from it (``broadcast_in_dim``, ``~``); None where it is no boolean or its use does not show."""
    if trace.records[index].value.dtype != bool:
        return None
    sense = {index: True}  # boolean records -> equal to the mask (True) or to its negation (False)
    for record in trace.records[index + 1 :]:
        sources = [s for s in record.inputs if s in sense]
        if not sources or record.leaf is not None:
            continue
        value, mask = record.value, trace.records[sources[0]].value
        try:
            mask = np.broadcast_to(mask, value.shape)
        except ValueError:
            continue
        if value.dtype == bool:
            if np.array_equal(value, mask) or np.array_equal(value, ~mask):
                sense[record.index] = sense[sources[0]] == np.array_equal(value, mask)
            continue
        if value.dtype.kind != "f" or mask.all() or not mask.any():
            continue
        hidden = ~np.isfinite(value) | (value <= _VERY_NEGATIVE_FILL)
        if np.array_equal(hidden, mask):
            return sense[sources[0]]
        if np.array_equal(hidden, ~mask):
            return not sense[sources[0]]
    return None


_VERY_NEGATIVE_FILL = -1e4


def _zeroes_entries(value: np.ndarray, source: np.ndarray) -> bool:
    """Whether ``value`` is ``source`` with some of its nonzero entries set to 0, the rest as they were."""
    if source.shape != value.shape:
        return False
    kept = value != 0
    return bool((~kept & (source != 0)).any()) and np.array_equal(value[kept], source[kept])
