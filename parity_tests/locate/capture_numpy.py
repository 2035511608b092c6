"""Capture every array a NumPy function computes, with no instrumentation in it.

The inputs and weights go in as ``TracedArray`` leaves (``traced``): each operation on them, on
every line of the user's code and in every helper it calls, adds a record with its line and loops
(``lines``). Weights in a nested pytree (a dict of lists of dicts) are leaves named by their path
(``blocks.0.attn.c_attn.w``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from parity_tests.locate.dropout import uniform_draws
from parity_tests.locate.lines import LineTracer
from parity_tests.locate.run import returned_framework
from parity_tests.locate.trace import Raised, Trace, split_result
from parity_tests.locate.traced import Recorder, creating

__all__ = ["capture_numpy", "pytree_leaves"]


def pytree_leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, array)`` of a nested dict, list or tuple of arrays, in order: ``blocks.0.ln_1.g``."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        return [(prefix, value)] if hasattr(value, "shape") and hasattr(value, "dtype") else []
    return [
        leaf
        for key, item in items
        for leaf in pytree_leaves(item, f"{prefix}{key}" if not prefix else f"{prefix}.{key}")
    ]


def _traced(value: Any, recorder: Recorder, prefix: str) -> Any:
    """``value`` with its arrays as traced leaves named by their path under ``prefix``."""
    if isinstance(value, np.ndarray):
        return recorder.leaf(value, prefix)
    if isinstance(value, dict):
        return {k: _traced(v, recorder, f"{prefix}.{k}" if prefix else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(
            _traced(v, recorder, f"{prefix}.{i}" if prefix else str(i)) for i, v in enumerate(value)
        )
    return value


class _KeepMaskGenerator(np.random.Generator):
    """A ``Generator`` whose uniform draws (``random``) of a keep-mask's size make that mask when
    compared with the mask's rate ``p`` (``dropout.uniform_draws``): uniform as a true generator's,
    kept entries at or above ``p`` when ``kept_high`` (a port keeping ``u >= p``), below ``1 - p``
    otherwise (a port keeping ``u < 1 - p``). A port comparing with another threshold, or using
    the mask the wrong way round, drops other entries, as it would with its own draws.
    ``binomial(1, q, size)`` is ``u >= 1 - q`` of such draws: ``binomial(1, 1 - p)`` gives the
    keep-mask when ``kept_high``, ``binomial(1, p)`` the drop-mask otherwise. A mask whose rate
    is unknown (None) draws ``1 - 2**-24`` where kept and 0 where dropped when ``kept_high``, the
    other way round otherwise (any threshold reads it), and ``binomial(1, q)`` gives it as it is.
    Other draws come from the generator it replaces, whose stream it shares; the draws within each
    side of the threshold come from a generator of its own (seeded: the same every run)."""

    def __init__(
        self,
        base: np.random.Generator,
        masks: Sequence[np.ndarray],
        kept_high: bool,
        rates: Sequence[float | None] | None = None,
    ) -> None:
        super().__init__(base.bit_generator)
        self.masks, self.kept_high = list(masks), kept_high
        self.rates = list(rates) if rates is not None else [None] * len(self.masks)
        self.within = np.random.default_rng(0)

    def _mask(self, size: Any) -> tuple[np.ndarray, float | None] | None:
        shape = (size,) if isinstance(size, int) else tuple(size or ())
        found = next((i for i, m in enumerate(self.masks) if m.size == int(np.prod(shape))), None)
        if found is None:
            return None
        return self.masks.pop(found).reshape(shape), self.rates.pop(found)

    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        found = self._mask(size) if out is None else None
        if found is None:
            return super().random(size, dtype, out)
        keep, rate = found
        if rate is None:
            high, low = 1 - 2.0**-24, 0.0
            return np.where(keep, *((high, low) if self.kept_high else (low, high))).astype(dtype)
        return uniform_draws(keep, rate, self.kept_high, self.within).astype(dtype)

    def binomial(self, n: Any, p: Any, size: Any = None) -> Any:
        found = self._mask(size) if np.all(np.asarray(n) == 1) else None
        if found is None:
            return super().binomial(n, p, size)
        keep, rate = found
        if rate is None:
            return keep.astype(np.int64)
        return (uniform_draws(keep, rate, self.kept_high, self.within) >= 1 - np.asarray(p)).astype(np.int64)


def _with_keep_masks(
    fn: Any,
    args: Sequence[Any],
    masks: Sequence[np.ndarray],
    kept_high: bool,
    rates: Sequence[float | None] | None = None,
) -> tuple:
    """``(fn, args)`` with every ``np.random.Generator`` among the arguments (a partial's
    included) replaced by a ``_KeepMaskGenerator`` drawing ``masks`` (at their ``rates``)."""

    def swap(value: Any) -> Any:
        replace = isinstance(value, np.random.Generator)
        return _KeepMaskGenerator(value, masks, kept_high, rates) if replace else value

    if isinstance(fn, functools.partial):
        fn = functools.partial(fn.func, *map(swap, fn.args), **{k: swap(v) for k, v in fn.keywords.items()})
    return fn, [swap(arg) for arg in args]


def capture_numpy(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    keep_masks: Sequence[np.ndarray] | None = None,
    kept_high: bool = True,
    drop_rates: Sequence[float | None] | None = None,
) -> Trace:
    """Run ``fn(*args, **kwargs)`` on traced arrays, recording every array it computes; leaves
    ``input0``, ``input1``... are the positional array arguments (a dict of arrays, the weights,
    gives one leaf per key, a nested one per path). With ``keep_masks`` (a torch reference's dropout
    keep-masks, at their ``drop_rates``), a ``Generator`` passed to ``fn`` draws them (see
    ``_KeepMaskGenerator``). An
    exception ``fn`` raises comes as ``Raised``, with the arrays recorded before it."""
    if keep_masks:
        fn, args = _with_keep_masks(fn, args, keep_masks, kept_high, drop_rates)
    trace = Trace("numpy")
    lines = LineTracer()
    recorder = Recorder(trace, lines)
    traced = [
        _traced(arg, recorder, "" if isinstance(arg, dict) else f"input{position}")
        for position, arg in enumerate(args)
    ]
    with recorder.active(), creating(recorder):
        try:
            with lines:
                result = fn(*traced, **kwargs)
        except BaseException as error:
            raise Raised(error, trace) from error
        output, steps = split_result(result)
        trace.returned = returned_framework(output)
        output = output if isinstance(output, np.ndarray) else np.asarray(output)
        trace.output = recorder.index_of(output)
    trace.name_steps({k: v for k, v in steps.items() if k != "output"})
    return trace
