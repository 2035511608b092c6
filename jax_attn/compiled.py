"""Eager calls of the layer functions run the same compiled program as jitted ones.

JAX runs an un-jitted function op by op, each op compiled alone, while ``jax.jit`` compiles the
whole function, fusing and reordering (the softmax's reductions, for one): the two differ in
the last bits. ``compiled`` makes an eager call go through ``jax.jit`` of the very function an
outer ``jax.jit`` would trace, so eager and jitted results are bit-identical (and repeated
eager calls reuse the compiled program). Inside ``jit``/``grad``/``vmap`` the function is traced
as it is. What tracing cannot see is checked first, eagerly, with numpy_attn's messages: that
the input is a floating array, that float64 comes with JAX's 64-bit mode on (TypeError
otherwise: JAX would compute it in float32 without a word) and that every weight is finite.
A call that jit would cast before its checks see it (an input of another dtype than the
weights, float64 to float32 and int64 to int32 without 64-bit mode; a 64-bit mask) runs op by
op instead, so that the layer's ``check_layer`` raises numpy_attn's error, naming the same
weight and the dtypes the caller passed; so does a call whose ``key`` is no ``jax.random`` key
(``key=0``: the error says "got 0 (int)", as the building blocks' and numpy_attn's do; under the
caller's own ``jax.jit`` the int is an int32 array already and the error names its dtype and shape),
and one whose static argument cannot be hashed (``num_heads=[2]``, ``return_steps=[True]``: jit
would refuse it with its own ValueError), so that the layer's check names it.

Like any ``jax.jit`` function, an eager call compiles once per distinct input shape and keeps
the program; a process that sees thousands of shapes can free them with ``jax.clear_caches()``
(each compiled program holds memory mappings, and Linux caps them per process).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from numpy_attn.validation import (
    JAX_FLOATS,
    check_array,
    check_finite,
    check_floating,
    check_mapping,
    check_numpy_dtype,
)

from jax_attn.checks import check_key, check_x64, is_concrete

__all__ = ["STATIC_ARGNAMES", "compiled"]

# the keyword arguments that shape the computation: static under jax.jit
STATIC_ARGNAMES = (
    "num_heads",
    "context_length",
    "context_size",
    "dropout",
    "attn_drop",
    "out_drop",
    "implementation",
    "block_size",
    "return_steps",
)

F = TypeVar("F", bound=Callable[..., Any])
_CAST_BY_JIT = {"float64", "int64", "uint64", "complex128"}  # without jax_enable_x64
_JIT_READS = (np.ndarray, np.generic, jax.Array)  # the arrays jit takes as arguments


def _unreadable(value: Any) -> bool:
    if isinstance(value, np.ndarray):  # a subclass (np.matrix, a masked array) is the checks' to refuse
        return value.dtype.byteorder == ">" or type(value) is not np.ndarray
    return hasattr(value, "dtype") and not isinstance(value, _JIT_READS)


def _jit_would_cast(values: tuple[Any, ...]) -> bool:
    """True if jit would narrow a 64-bit mask or array before the checks see it, or could not
    read an array as given (another framework's tensor as a mask, a big-endian array, a NumPy
    subclass such as a masked array, whose mask jit would refuse with its own error): such
    (invalid) calls run op by op instead, so that their errors name the dtypes the caller passed."""
    if any(_unreadable(value) for value in values):
        return True
    if jax.config.jax_enable_x64:
        return False
    return any(str(getattr(value, "dtype", "")) in _CAST_BY_JIT for value in values)


def _is_bad_key(key: Any) -> bool:
    """True for a ``key`` that ``check_key`` refuses: jit would turn a Python int into an int32
    array before the layer's check sees it ("got an array of dtype int32, shape ()"), so such
    calls run op by op, where the error names what the caller passed ("got 0 (int)"), as
    numpy_attn and the building blocks do. Under the caller's own ``jax.jit`` the key is an
    array already: there the error names its dtype and shape."""
    try:
        check_key(key)
    except TypeError:
        return True
    return False


def _unhashable(values: tuple[Any, ...]) -> bool:
    """True if jit could not hash ``values``, the static arguments of a call."""
    try:
        hash(values)
    except TypeError:
        return True
    return False


def compiled(fn: F) -> F:
    static = [name for name in STATIC_ARGNAMES if name in fn.__code__.co_varnames]
    jitted = jax.jit(fn, static_argnames=static)

    @functools.wraps(fn)
    def call(params: Mapping[str, Any], x: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, jax.core.Tracer) or not is_concrete(params):
            return fn(params, x, *args, **kwargs)  # inside jit, grad or vmap: trace as is
        check_mapping(params)
        check_floating(x, JAX_FLOATS)
        for name, value in params.items():
            check_array(f"params[{name!r}]", value)
            check_numpy_dtype(f"params[{name!r}]", value)
        mismatched = any(np.dtype(value.dtype) != np.dtype(x.dtype) for value in params.values())
        statics = tuple(value for name, value in kwargs.items() if name in static)
        if (
            mismatched
            or _jit_would_cast((*args, *kwargs.values()))
            or _is_bad_key(kwargs.get("key"))
            or _unhashable(statics)
        ):
            # jit would cast (or refuse) what the checks must see: op by op, the layer's own
            # checks raise numpy_attn's error (for a dtype mismatch, naming the same weight; for
            # a bad key or an unhashable static argument, the value given), in the layer's order
            return fn(params, x, *args, **kwargs)
        check_x64("x", x)  # x and the weights share its dtype
        check_finite(params)
        return jitted(params, x, *args, **kwargs)

    return call  # type: ignore[return-value]
