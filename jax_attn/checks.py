"""The shared up-front checks of numpy_attn, applied to JAX arrays and tracers, and the checks
that only JAX needs: random keys and 64-bit mode."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from numpy_attn.validation import JAX_FLOATS, check_dtype_argument, check_floating, check_operands

from numpy_attn.spec import check_layer as _check_layer

__all__ = ["check_dtype", "check_jax_operands", "check_key", "check_layer", "check_x64", "is_concrete"]


def is_concrete(params: Mapping[str, Any]) -> bool:
    """True unless some weight is a tracer (under ``jax.jit``/``jax.grad`` values are unknown)."""
    return isinstance(params, Mapping) and not any(
        isinstance(value, jax.core.Tracer) for value in params.values()
    )


def check_layer(layer: str, params: Mapping[str, Any], x: Any, **kwargs: Any) -> dict[str, Any]:
    """``numpy_attn.spec.check_layer``: the same errors, word for word (bfloat16 is accepted as
    well). Shapes and dtypes are checked at trace time; weight values only where concrete."""
    return _check_layer(layer, params, x, check_values=is_concrete(params), floating=JAX_FLOATS, **kwargs)


def check_key(key: Any, name: str = "key") -> None:
    """``key`` (the argument ``name``) is None (no randomness) or one ``jax.random`` key: a typed
    key (``jax.random.key(seed)``, shape ``()``) or a raw ``uint32`` one
    (``jax.random.PRNGKey(seed)``, shape ``(2,)``). TypeError for anything else, ValueError for a
    batch of keys (``jax.random.split(key, n)``), which dropout's draw cannot use."""
    if key is None:
        return
    dtype = getattr(key, "dtype", None)
    typed = isinstance(key, jax.Array) and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    raw = isinstance(key, jax.Array) and dtype == np.uint32 and key.shape[-1:] == (2,)
    if not (typed or raw):
        got = f"{key!r} ({type(key).__name__})"
        if dtype is not None:  # under jit an int arrives as an int32 array
            got = f"an array of dtype {dtype}, shape {key.shape}"
        raise TypeError(f"{name} must be a jax.random key (jax.random.key(seed)) or None, got {got}")
    batch = tuple(key.shape) if typed else tuple(key.shape[:-1])
    if batch:
        raise ValueError(
            f"{name} must be one jax.random key, got a batch of keys of shape {batch}: "
            f"pass one of them ({name}[0])"
        )


def _without_x64(dtype: Any) -> bool:
    """Whether ``dtype`` is float64 while JAX's 64-bit mode is off (JAX would make it float32)."""
    return np.dtype(dtype) == np.float64 and not jax.config.jax_enable_x64


def check_x64(name: str, value: Any) -> None:
    """TypeError for a float64 array while JAX's 64-bit mode is off: JAX would compute it in
    float32 without a word. (Under an outer ``jax.jit`` the cast happens before any function
    runs, so there float64 inputs arrive as float32: JAX's own rule.)"""
    if _without_x64(value.dtype):
        raise TypeError(
            f"{name} has dtype float64, which JAX computes in float32 unless 64-bit mode is on: "
            "call jax.config.update('jax_enable_x64', True) at start-up (or compute inside "
            "`with jax.enable_x64(True):`), or pass float32 arrays"
        )


def check_dtype(dtype: Any) -> np.dtype:
    """A ``dtype`` argument of jax_attn (a constructor's, ``init_kv_cache``'s):
    ``check_dtype_argument`` with JAX's floats, then float64 only in 64-bit mode (a TypeError
    saying how to turn it on, or to pass float32); returned as a NumPy dtype."""
    resolved = check_dtype_argument(dtype, JAX_FLOATS)
    if _without_x64(resolved):
        raise TypeError(
            "dtype=float64 needs JAX's 64-bit mode: call jax.config.update('jax_enable_x64', True) at "
            "start-up (or construct inside `with jax.enable_x64(True):`), or pass dtype=jnp.float32"
        )
    return resolved


def check_jax_operands(*, optional: tuple[str, ...] = (), **arrays: Any) -> None:
    """A building block's array arguments, by name: ``numpy_attn.validation.check_operands``
    (floating, readable, native byte order, one dtype, None only for the names in ``optional``;
    bfloat16 accepted as well), and float64 only in 64-bit mode (``check_x64``: concrete float64
    arrays; under ``jax.jit`` JAX has cast them to float32 before any function runs)."""
    for name, value in arrays.items():  # float64 refused as such before any mismatch is named
        if value is not None or name not in optional:
            check_floating(value, JAX_FLOATS, name)
            check_x64(name, value)
    check_operands(JAX_FLOATS, optional=optional, **arrays)
