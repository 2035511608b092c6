"""The steps a fused reference operation computes in one call, as values of their own.

A torch reference computes ``F.layer_norm``, ``F.softmax``, ``F.linear``, ``torch.addmm`` (GPT-2's
``Conv1D``) and ``F.gelu`` in one operation; a port writes them over several lines (a ``softmax``
helper: the row maximum, the exponent, the sum, the division). ``steps`` computes what those lines
should hold, from the operation's own inputs, so that each line of the port can be found right or
wrong: the capture adds them to the reference's trace as values of the operation (``Record.expands``),
feeding nothing. ``stopped_short`` says what a port whose value equals one of them left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from parity_tests.arrays import erf

__all__ = ["EXPANDED", "steps", "stopped_short"]

Step = tuple[str, np.ndarray, tuple[int, ...]]  # (name, value, which of the op's tensors it is from)


def _axis(kwargs: dict[str, Any], args: Sequence[Any], position: int, default: int = -1) -> int:
    value = kwargs.get("dim", args[position] if len(args) > position else default)
    return default if value is None else int(value)


def _layer_norm(tensors: list[np.ndarray], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Step]:
    x = tensors[0]
    shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
    axes = tuple(range(-len(shape), 0))
    eps = kwargs.get("eps", args[4] if len(args) > 4 else 1e-5)
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    variance = (centered**2).mean(axis=axes, keepdims=True)
    std = np.sqrt(variance + eps)
    normalized = centered / std
    found = [("mean", mean, (0,)), ("centered", centered, (0,)), ("variance", variance, (0,))]
    found += [("std", std, (0,)), ("1/std", 1 / std, (0,)), ("normalized", normalized, (0,))]
    if len(tensors) > 1:  # the weight
        found.append(("scaled", normalized * tensors[1], (0, 1)))
    return found


def _softmax(tensors: list[np.ndarray], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Step]:
    x, axis = tensors[0], _axis(kwargs, args, 1)
    finite = np.where(np.isfinite(x), x, -np.inf)
    largest = finite.max(axis=axis, keepdims=True)
    shifted = x - largest
    exponent = np.exp(shifted)
    return [
        ("row max", largest, (0,)),
        ("shifted", shifted, (0,)),
        ("exponent", exponent, (0,)),
        ("row sum", exponent.sum(axis=axis, keepdims=True), (0,)),
        ("unshifted exponent", np.exp(x), (0,)),
        ("unshifted row sum", np.exp(x).sum(axis=axis, keepdims=True), (0,)),
    ]


def _linear(tensors: list[np.ndarray], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Step]:
    if len(tensors) < 3:  # no bias: the product is the output
        return []
    return [("product", tensors[0] @ np.swapaxes(tensors[1], -1, -2), (0, 1))]


def _addmm(tensors: list[np.ndarray], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Step]:
    return [("product", tensors[1] @ tensors[2], (1, 2))] if len(tensors) == 3 else []


def _gelu(tensors: list[np.ndarray], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Step]:
    x = tensors[0]
    if kwargs.get("approximate", "none") == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        return [("cube", x**3, (0,)), ("tanh", np.tanh(inner), (0,)), ("1 + tanh", 1 + np.tanh(inner), (0,))]
    return [("erf", erf(x / math.sqrt(2)), (0,)), ("1 + erf", 1 + erf(x / math.sqrt(2)), (0,))]


EXPANDED: dict[str, Callable[[list[np.ndarray], Sequence[Any], dict[str, Any]], list[Step]]] = {
    "layer_norm": _layer_norm,
    "softmax": _softmax,
    "linear": _linear,
    "addmm": _addmm,
    "gelu": _gelu,
}


def steps(name: str, tensors: list[np.ndarray], args: Sequence[Any], kwargs: dict[str, Any]) -> list[Step]:
    """The steps of fused operation ``name`` (a key of ``EXPANDED``) on its tensor inputs
    ``tensors`` (the products in their precision, elementwise steps in float64) and its other
    arguments; empty for any other operation, or where the
    arguments are not understood."""
    expand = EXPANDED.get(name)
    if expand is None or not tensors:
        return []
    if name not in ("linear", "addmm"):  # elementwise: exact in float64
        tensors = [t.astype(np.float64) if t.dtype.kind == "f" else t for t in tensors]
    try:
        with np.errstate(all="ignore"):
            return expand(tensors, args, kwargs)
    except (TypeError, ValueError, IndexError):
        return []


_MISSING = {  # (operation, the step a value stopped at) -> what the reference does next
    ("linear", "product"): "its bias is never added (a bias missing)",
    ("addmm", "product"): "its bias is never added (a bias missing)",
    ("layer_norm", "normalized"): "the norm's weight and bias are never applied",
    ("layer_norm", "scaled"): "the norm's bias is never added",
    ("layer_norm", "centered"): "it is never divided by the standard deviation",
    ("softmax", "exponent"): "it is never divided by its row sum (the softmax is not normalised)",
    ("softmax", "unshifted exponent"): "it is never divided by its row sum (the softmax is not normalised)",
}


def stopped_short(op: str, step: str, location: str) -> str:
    """The cause for a value equal to step ``step`` of the reference's ``op`` at ``location``,
    used where the operation's result is due."""
    missing = _MISSING.get((op, step), "the rest of the operation is left out")
    return f"stops short: this equals the {step} of the reference's {op} ({location}), where {missing}"
