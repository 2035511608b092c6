"""Gradient parity of a port: the first backward operation where its gradients go wrong.

Both sides are captured with the cotangent of every value they compute for one seeded loss
``sum(output * cotangent)`` (torch: tensor hooks; JAX: zero probes added in the recording
interpreter, custom rules kept). The forward alignment says which candidate value holds which
reference value; walking back from the output, the first aligned candidate value whose cotangent
differs from its reference value's cotangent (in the same layout, divided by a legitimate scale)
while those after it agree is where the backward pass goes wrong: the operation consuming it
computed its cotangent wrongly (a ``stop_gradient``, an integer cast, a detached value, a custom
rule: then the line of the rule that returned the cotangent). NumPy has no gradients.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parity_tests.locate.align import Alignment, align, ancestors, close, layout_classes, tolerance_of
from parity_tests.locate.causes import axis_names
from parity_tests.locate.check import compare_traces, raised_report, sizes_of
from parity_tests.locate.layout import in_layout
from parity_tests.locate.report import LocateReport
from parity_tests.locate.run import capture
from parity_tests.locate.trace import CustomRule, Raised, Record, Trace, is_user_file, user_stack

__all__ = ["FORWARD_DIVERGES", "compare_cotangents", "locate_gradients"]

# the first cause of a gradient check whose forward pass diverges (its gradients are not compared)
FORWARD_DIVERGES = "the forward pass already diverges here: fix it before the gradients"

_BLOCKING = ("stop_gradient", "detach", "convert_element_type", "custom")  # ops that change gradients


def locate_gradients(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    inputs: Any,
    *,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
    reference_framework: str | None = None,
    candidate_framework: str | None = None,
    train: bool = False,
) -> LocateReport:
    """Compare the gradients of ``candidate`` with those of ``reference`` value by value.

    Takes what ``locate`` takes (torch modules and functions, JAX functions, ``jax.jit``/``nnx.jit``
    callables, NNX modules; ``params`` for those that are not modules); the torch reference runs in
    eval mode unless ``train`` (then its dropout keep-masks are injected as in ``locate``). The loss
    is ``sum(output * cotangent)`` for a standard normal cotangent drawn from ``seed``. When the
    forward pass already diverges, its report is returned (with that cause first). Otherwise
    ``first_divergence`` (``"gradient of <step or op>"``) names the reference value whose
    cotangent the candidate gets wrong, ``reference_location`` its line, ``candidate_location``
    the candidate line whose backward computes it (the worst entry, causes and heatmap as in
    ``locate``). A NumPy candidate or reference raises TypeError: NumPy has no gradients. A
    candidate or reference that raises: as in ``locate``.
    """
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    expected = capture(reference, args, params, reference_framework, train, seed)
    try:
        masks, rates = expected.keep_masks, expected.drop_rates
        actual = capture(candidate, args, params, candidate_framework, train, seed, masks, drop_rates=rates)
    except Raised as raised:
        return raised_report(expected, raised, candidate)
    return compare_cotangents(expected, actual)


def compare_cotangents(expected: Trace, actual: Trace) -> LocateReport:
    """The gradient report for two traces captured with the same gradient seed."""
    with np.errstate(all="ignore"):
        alignment = align(expected, actual)
        if not alignment.output_ok:
            report = compare_traces(expected, actual)
            report.causes.insert(0, FORWARD_DIVERGES)
            return report
        verified: list[str] = []
        for group in _groups(alignment):
            if group.agrees():
                verified += [
                    f"{actual.records[c].location}  {actual.records[c].op} (gradient)"
                    for c in group.holders
                    if actual.records[c].leaf is None
                ]
            else:
                return _report(alignment, group, verified)
        return LocateReport(True, verified=list(dict.fromkeys(verified)))


@dataclass
class _Group:
    """The candidate values holding reference record ``reference`` first (``holders``, each with
    its scale: none computed from another holding it), whose cotangents must add up to the
    reference value's."""

    alignment: Alignment
    reference: int
    holders: list[int] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)

    def total(self) -> np.ndarray:
        """The holders' cotangents in the reference's layout and scale, added up."""
        shape, rules = self.alignment.reference.records[self.reference].shape, self.alignment.rules
        cotangents = self.alignment.candidate.cotangents
        parts = [
            scale * in_layout(cotangents[c].astype(np.float64), shape, rules)
            for c, scale in zip(self.holders, self.scales, strict=True)
        ]
        return np.sum(parts, axis=0)

    def agrees(self) -> bool:
        expected = self.alignment.reference.cotangents[self.reference]
        record = self.alignment.reference.records[self.reference]
        rtol, atol = tolerance_of(record, self.alignment.candidate.records[self.holders[-1]])
        return close(expected, self.total(), rtol, atol)


def _groups(alignment: Alignment) -> list[_Group]:
    """One group per reference value the output uses differentiably and the candidate holds, the
    latest held first (backward order). Layout changes of one reference value count as one (its
    first record, whose cotangent gathers every use); a candidate value computed from another
    holding the same reference value is no new holder (a reshape of it, a stopped copy), and one
    holding several reference values by coincidence (zero biases) holds none."""
    reference, candidate = alignment.reference, alignment.candidate
    used = ancestors(reference, reference.output)
    classes = layout_classes(reference, alignment.rules)
    first: dict[int, int] = {}
    for index in sorted(used):
        if index in reference.cotangents:
            first.setdefault(classes[index], index)
    path = ancestors(candidate, candidate.output)
    inherited: dict[int, set[int]] = {}
    groups: dict[int, _Group] = {}
    for record in candidate.records:
        above = set().union(*(inherited.get(s, set()) for s in record.inputs))
        own: dict[int, float] = {}
        exact: set[int] = set()
        for match in alignment.matches.get(record.index, []):
            cls = classes[match.reference]
            if match.kind != "negated" and cls in first and match.reference in used:
                own.setdefault(cls, match.scale)
                exact |= {cls} if match.kind == "exact" else set()
        inherited[record.index] = above | set(own)
        if record.index not in path or record.index not in candidate.cotangents or len(exact) > 1:
            continue  # equal to several reference values (zeros, say): which cotangent is its own?
        for cls, scale in own.items():
            if cls not in above:
                group = groups.setdefault(cls, _Group(alignment, first[cls]))
                group.holders.append(record.index)
                group.scales.append(scale)
    return sorted(groups.values(), key=lambda g: -g.holders[-1])


def _consumer(trace: Trace, holders: list[int]) -> int:
    """The operation whose backward gave the ``holders`` their cotangents: among their consumers
    on the way to the output, the first that changes gradients by nature (a stop, a cast, a
    custom rule), else the first."""
    path, held = ancestors(trace, trace.output), set(holders)
    consumers = [r for r in trace.records[holders[0] + 1 :] if held & set(r.inputs) and r.index in path]
    blocking = [
        r for r in consumers if r.index in trace.custom_rules or any(r.op.startswith(op) for op in _BLOCKING)
    ]
    return (blocking or consumers or [trace.records[holders[-1]]])[0].index


def _report(alignment: Alignment, group: _Group, verified: list[str]) -> LocateReport:
    actual, expected = alignment.candidate, alignment.reference
    index = group.holders[-1]
    record, counterpart = actual.records[index], expected.records[group.reference]
    consumer = actual.records[_consumer(actual, group.holders)]
    rule = actual.custom_rules.get(consumer.index)
    location = _rule_location(actual, rule, group.holders) if rule is not None else consumer.location
    rtol, atol = tolerance_of(record, counterpart)
    e, a = expected.cotangents[group.reference].astype(np.float64), group.total()
    error = np.abs(np.nan_to_num(a - e, nan=np.inf, posinf=np.inf, neginf=np.inf))
    worst = np.unravel_index(int(np.argmax(error)), error.shape) if error.size else ()
    report = LocateReport(
        False,
        f"gradient of {counterpart.step or counterpart.op}",
        location,
        counterpart.location,
        f"{rule.eqn.primitive.name} rule" if rule is not None else consumer.op,
        counterpart.op,
        worst_index=tuple(int(i) for i in worst),
        axes=axis_names(counterpart.shape, sizes_of(expected, alignment.rules)),
        expected=float(e[worst]),
        actual=float(a[worst]),
        expected_dtype=counterpart.dtype,
        actual_dtype=record.dtype,
        verified=list(dict.fromkeys(verified)),
        rtol=rtol,
        atol=atol,
        expected_value=e,
        actual_value=a,
    )
    named = record.leaf if record.leaf is not None else f"{record.location} ({record.op})"
    stopping = _stopping(consumer)
    if not np.any(a):
        report.causes.append(
            f"no gradient reaches the value of {named}: the line using it stops the gradient "
            "(stop_gradient, detach, an integer cast)"
        )
    elif stopping is not None:  # one use of several: the others still give it their part
        report.causes.append(
            f"part of the gradient of {named} is lost: {consumer.location} {stopping}, so nothing comes "
            "back through that use; the gradient it has comes from its other uses"
        )
    else:
        if rule is not None:
            report.causes.append(f"the {rule.eqn.primitive.name} rule gives its input a wrong cotangent")
        ratio = _ratio(e, a)
        if ratio is not None:
            report.causes.append(f"the cotangent is the reference's times {ratio:.6g}")
    return report


def _stopping(consumer: Record) -> str | None:
    """How ``consumer`` gives its input no gradient, read from its operation and its dtype: a stop
    (``stop_gradient``, ``detach``) or a value without gradients (an integer or boolean cast);
    None where neither shows."""
    if consumer.op.startswith(("stop_gradient", "detach")):
        return f"stops the gradient ({consumer.op})"
    if consumer.value.dtype.kind in "biu":
        return f"turns it into {consumer.dtype} ({consumer.op}), and integers carry no gradient"
    return None


def _ratio(expected: np.ndarray, actual: np.ndarray) -> float | None:
    """``s`` when ``actual == s * expected`` (a backward rule off by a factor), else None."""
    largest = int(np.argmax(np.abs(expected)))
    if expected.flat[largest] == 0:
        return None
    s = float(actual.flat[largest] / expected.flat[largest])
    return s if close(s * expected, actual, 1e-4, 1e-6) else None


def _rule_location(trace: Trace, rule: CustomRule, operands: list[int]) -> str:
    """The line of a custom rule that returns the wrong cotangent for one of ``operands``: the
    ``custom_vjp`` backward function's ``return`` (seen by ``sys.settrace`` as the rule runs on the
    captured values), or the ``custom_jvp`` rule's line computing the tangent that the transposed
    rule turns into this cotangent."""
    import jax
    import jax.numpy as jnp

    from parity_tests.locate.capture_jax import _stack

    eqn = rule.eqn
    params = eqn.primitive.get_bind_params(eqn.params)
    primals = [
        literal if i is None else jnp.asarray(trace.records[i].value, trace.records[i].dtype)
        for literal, i in rule.inputs
    ]
    indexes = [i for _, i in rule.inputs]
    position = next(indexes.index(i) for i in operands if i in indexes)

    def call(*operands):
        return eqn.primitive.bind(*operands, **params)

    outputs, backward = jax.vjp(call, *primals)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    cotangents = [
        jnp.asarray(trace.cotangents.get(i, np.zeros(o.shape)), o.dtype)
        for i, o in zip(rule.outputs, outputs, strict=True)
    ]
    cotangents = cotangents if eqn.primitive.multiple_results else cotangents[0]
    returns: list[str] = []

    def tracer(frame, event, arg):
        if not is_user_file(frame.f_code.co_filename):
            return None
        outer = frame.f_back
        frames = []
        while outer is not None:
            frames.append((outer.f_code.co_filename, outer.f_lineno, outer.f_code.co_name))
            outer = outer.f_back
        # a backward rule returns its cotangents as a tuple (custom_vjp requires one); other user
        # code that library code calls meanwhile, such as a jax.monitoring listener, does not
        if event == "return" and isinstance(arg, tuple) and not user_stack(frames):
            returns.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        closed = jax.make_jaxpr(backward)(cotangents)
    finally:
        sys.settrace(previous)
    if returns:
        return returns[-1]
    producers = {var: eqn for eqn in closed.jaxpr.eqns for var in eqn.outvars}
    wanted, located = [closed.jaxpr.outvars[position]], None
    while wanted and located is None:
        var = wanted.pop()
        producer = producers.get(var)
        if producer is None:
            continue
        stack = _stack(producer, ())
        if stack:
            located = stack[0][0]
        wanted.extend(v for v in producer.invars if not hasattr(v, "val"))
    return located or trace.records[operands[0]].location
