"""Check a port: compare a candidate implementation with a reference, step by step.

A port records the steps it has under the project's step names (``numpy_attn.STEP_DOCS``):
``queries``, ``keys``, ``values`` (projections, before any head split), ``attn_scores`` (raw
``queries @ keys^T``, before masking and scaling), ``masked_scores``, ``attn_weights`` (after
softmax, before dropout), ``attn_weights_dropped``, ``context_vec`` (heads merged, before the
output projection), ``projected`` and ``output``. Any subset will do: a step the candidate does
not record is listed as missing and does not fail the check; the output is always compared. Where
the steps do not pinpoint a divergence (a port recording none), ``check_port`` runs ``locate``,
which names the port's first diverging line without any instrumentation; ``attn-parity diff`` is
``check_port`` on the user's files.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from parity_tests.compare import StepReport, StepRow, compare_steps
from parity_tests.locate.check import locate, locate_runs
from parity_tests.locate.gradients import FORWARD_DIVERGES, locate_gradients
from parity_tests.locate.run import (
    applied,
    evaluating,
    framework_of,
    holds_weights,
    takes_return_steps,
    to_numpy,
)
from parity_tests.locate.trace import Raised, Record, Trace, exits_raise, split_result

__all__ = ["CAUSES", "check_port", "likely_causes"]

# the first diverging step (its role, so that "heads.0.keys" counts as "keys") -> what usually
# causes a divergence there when every earlier step still matches
CAUSES: dict[str, tuple[str, ...]] = {
    "queries": (
        "a projection weight used in the wrong layout (torch's nn.Linear stores (out, in): "
        "x @ W.T; Flax kernels are (in, out): x @ W)",
        "a bias missing, added twice, or taken from another projection",
        "weights loaded under the wrong names (W_query/W_key/W_value swapped)",
    ),
    "attn_scores": (
        "a wrong head split: heads taken from the wrong axis, or reshape without transpose(1, 2) "
        "(expected (B, N, T, H) = view(B, T, N, H).transpose(1, 2))",
        "keys not transposed over their last two axes, or queries and keys swapped",
        "scores already scaled or masked here (attn_scores is the raw queries @ keys^T)",
    ),
    "masked_scores": (
        "the mask meaning inverted (the notes' True = hidden; jax.nn and Flax use True = attend)",
        "the causal mask off by one (triu(..., diagonal=1) hides only the future)",
        "the padding mask broadcast on the wrong axis (it hides keys: shape (B, 1, 1, S))",
    ),
    "attn_weights": (
        "the wrong scale: divide by sqrt(head size H), not sqrt(d_out), and not twice",
        "softmax over the wrong axis (it runs over the keys, the last axis)",
        "a finite fill value instead of -inf, or the mask applied after the softmax",
    ),
    "attn_weights_dropped": (
        "dropout without the 1 / (1 - p) rescaling, or applied in eval mode",
        "a keep-mask with the opposite meaning (True = keep)",
    ),
    "context_vec": (
        "heads merged in the wrong order: transpose(1, 2) back to (B, T, N, H) before the reshape",
        "values projected or split differently from queries and keys",
        "weights @ values replaced by values @ weights or weights^T @ values",
    ),
    "projected": ("the output projection's weight layout or bias (out_proj / Wo)",),
    "output": (
        "the output projection's weight layout or bias (out_proj / Wo), or output dropout",
        "a wrapper concatenating heads in another order or along another axis",
    ),
}
_ROLES = {"keys": "queries", "values": "queries"}  # projections share their causes


def likely_causes(report: StepReport) -> tuple[str, ...]:
    """Causes for the report's first divergence, given which steps before it still match."""
    row = next((row for row in report.rows if not row.ok), None)
    if row is None:
        return ()
    role = row.step.rsplit(".", 1)[-1]
    causes = list(CAUSES.get(_ROLES.get(role, role), ()))
    if row.note == "shape mismatch":
        causes.insert(
            0,
            f"{row.step} has shape {row.actual_shape}, expected {row.expected_shape}: "
            "check the axis order (B, N, T, S) and how heads are split and merged",
        )
    before = report.rows[: report.rows.index(row)]  # the README's "steps that still match before it"
    matched = [r.step for r in before if r.ok and r.note == ""]
    if matched and role != "output":
        causes.append(f"steps that still match: {', '.join(matched)}")
    return tuple(causes)


def check_port(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    inputs: Any,
    *,
    params: Mapping[str, Any] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    train: bool = False,
    gradients: bool = False,
    reference_framework: str | None = None,
    candidate_framework: str | None = None,
) -> StepReport:
    """Run ``reference`` and ``candidate`` on the same ``inputs`` and compare their traces; where the
    steps do not pinpoint a divergence, ``locate`` names the candidate's line.

    Both are callables from any framework returning ``(output, steps)`` (or just an output):
    torch_ref modules, numpy_attn/jax_attn functions, Flax modules, or your own port. Those
    that take ``return_steps`` get ``return_steps=True``. ``inputs`` is one array or a tuple of
    positional arguments, from any framework; a torch ``nn.Module`` receives them as tensors and
    runs in eval mode. ``params`` (the weights format) is passed first to functions (plain, jitted,
    decorated, methods); any other callable object (a torch or NNX module, an instance of your own
    class) holds its own weights, as for ``locate``. Everything is compared in float64 with the per-dtype
    tolerances (``rtol``/``atol`` override them for the steps); the report names the first
    diverging step and ``causes`` lists what usually causes it.

    A passing check runs nothing more. A failing one whose steps do not pinpoint the divergence (a
    side records no steps, only its output, or the step just before the first failing one is
    recorded by one side only) runs ``locate`` (every value both compute, aligned, no
    instrumentation needed): then ``located`` is its report, ``first_divergence`` and ``causes`` are
    its (the reference's first value the candidate does not reproduce, the candidate's line
    computing it, what the numbers show). A candidate that raises is a finding too: the report is
    not ok, has no rows and its ``located`` is ``locate``'s report of the exception (the candidate's
    line raising it, the lines verified before it and the last reference value it reproduced). A
    reference that raises is the caller's error: ``Raised`` (``type: message``; the reference's
    exception is its ``error``).

    The options are ``locate``'s, used by both comparisons: ``train`` runs a torch reference in
    train mode and gives the candidate its dropout keep-masks, so that both drop the same entries
    (the steps are then those of ``locate``'s runs, ``locate`` running every time);
    ``reference_framework``/``candidate_framework`` (``"torch"``, ``"numpy"``, ``"jax"``) override
    the framework read from a callable. With ``gradients``, a check whose steps do not pinpoint a
    forward divergence then compares the gradients (``locate_gradients``, whose report is
    ``located`` even when it passes: ``first_divergence`` ``gradient of <step>``); a forward
    divergence the steps pinpoint comes first, its first cause saying the gradients were not
    compared. NumPy has no gradients: ``NoGradients`` (a TypeError).
    """
    options = {
        "params": params,
        "train": train,
        "reference_framework": reference_framework,
        "candidate_framework": candidate_framework,
    }
    if train:  # the steps of the runs given the same keep-masks
        located, expected_run, actual_run = locate_runs(reference, candidate, inputs, **options)
        if actual_run is None:  # the candidate raised
            return StepReport((), tuple(located.causes), located)
        expected, actual = _run_steps(expected_run), _run_steps(actual_run)
    else:
        located, args = None, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        try:
            with exits_raise():  # an exit is an exception, as locate sees it
                expected = _trace(reference, args, params)
        except BaseException as error:
            raise Raised(error, Trace(framework_of(reference))) from error
        try:
            with exits_raise():
                actual = _trace(candidate, args, params)
        except BaseException:
            located = locate(reference, candidate, inputs, **options)
            if located.raised is None:  # it raised only as called here: its own exception, unreported
                raise
            return StepReport((), tuple(located.causes), located)
    report = compare_steps(expected, actual, rtol=rtol, atol=atol, missing_ok=True)
    if not report.ok and _pinpointed(report.rows):
        return StepReport(report.rows, (FORWARD_DIVERGES,) * gradients + likely_causes(report))
    if gradients:
        located = locate_gradients(reference, candidate, inputs, **options)
    elif report.ok:
        return StepReport(report.rows)
    elif located is None:
        located = locate(reference, candidate, inputs, **options)
    if located.ok and not report.ok:  # the outputs agree to locate: the failing step the table names stands
        return StepReport(report.rows, likely_causes(report))
    return StepReport(report.rows, tuple(located.causes), located)


def _run_steps(run: Trace) -> OrderedDict:
    """The steps a captured run recorded, then its output (``_trace``'s order)."""
    return _steps_then_output(run.steps, _as_computed(run.records[run.output]))


def _as_computed(record: Record) -> np.ndarray:
    """A captured value in the dtype it was computed in (half precision is recorded as float32),
    so that it is compared at that dtype's tolerance."""
    if record.dtype == "bfloat16":
        import ml_dtypes  # torch's extra: train mode has a torch reference

        return record.value.astype(ml_dtypes.bfloat16)
    return record.value.astype(record.dtype)


def _pinpointed(rows: Sequence[StepRow]) -> bool:
    """Whether the step table alone places the first failing row: the row before it is a step both
    sides record (and match), or it is the first row and not the output (which is every step)."""
    first = next(i for i, row in enumerate(rows) if not row.ok)
    return rows[first - 1].note == "" if first else rows[first].step != "output"


def _trace(fn: Callable[..., Any], args: Sequence[Any], params: Mapping[str, Any] | None) -> OrderedDict:
    """The steps ``fn`` records on ``args`` (``params`` first where it takes them), then its output."""
    torch_module = _torch_module(fn)
    if torch_module is not None:
        args = tuple(_to_torch(a, torch_module) for a in args)
    else:  # torch tensors (bfloat16, requires_grad) reach NumPy and JAX callables as NumPy arrays
        args = tuple(to_numpy(a) for a in args)
        params = None if params is None else {k: to_numpy(v) for k, v in params.items()}
    if params is not None and not holds_weights(fn):  # as locate calls it
        args = (params, *args)
    with evaluating(torch_module):  # as locate runs it (train mode goes through locate_runs)
        result = _called(applied(fn), args)
    output, steps = split_result(result)  # a tuple output (nn.MultiheadAttention's) gives its first
    return _steps_then_output(steps, output)


def _steps_then_output(steps: Mapping[str, Any], output: Any) -> OrderedDict:
    """The steps a run recorded (a misspelt name warned of), then its output, in the order compared."""
    _warn_unknown_steps(steps)
    trace = OrderedDict((k, v) for k, v in steps.items() if k != "output")
    trace["output"] = output
    return trace


def _called(fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    """``fn(*args)``, with ``return_steps=True`` where ``fn`` takes it."""
    if not takes_return_steps(fn):
        return fn(*args)
    if hasattr(fn, "lower") and hasattr(fn, "__wrapped__"):  # jitted: return_steps must stay static
        import jax

        return jax.jit(functools.partial(fn.__wrapped__, return_steps=True))(*args)
    return fn(*args, return_steps=True)


def _warn_unknown_steps(steps: Mapping[str, Any]) -> None:
    """A step name that is not the project's (a misspelling) is never compared: say so, with the
    nearest project name."""
    import difflib
    import warnings

    from numpy_attn import STEP_DOCS
    from numpy_attn.decoder_spec import GQA_STEPS
    from numpy_attn.gpt_spec import BLOCK_STEPS, MODEL_STEPS

    known = [*STEP_DOCS, *BLOCK_STEPS, *GQA_STEPS, *MODEL_STEPS]  # the layers', blocks' and models'
    for name in steps:
        role = name.rsplit(".", 1)[-1]
        if role not in known:
            nearest = difflib.get_close_matches(role, known, n=1)
            hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
            warnings.warn(f"step {name!r} is not one of the project's step names{hint}", stacklevel=3)


def _torch_module(fn: Any) -> Any:
    """The torch module behind ``fn`` (a ``functools.partial`` of one included), or None."""
    from parity_tests.locate.capture_torch import torch_module_of

    return torch_module_of(fn)


def _to_torch(value: Any, module: Any) -> Any:
    """A NumPy/JAX array as a tensor in the module's floating dtype (its parameters', else its
    buffers', else the array's own for a module without either); anything else unchanged."""
    if not hasattr(value, "shape") or hasattr(value, "detach"):
        return value
    from torch_ref import from_numpy

    array = np.asarray(value)
    tensor = from_numpy(array)
    floating = [t.dtype for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]
    if tensor.is_floating_point() and floating:
        tensor = tensor.to(floating[0])
    return tensor
