"""The shared up-front checks of numpy_attn, applied to JAX arrays and tracers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from numpy_attn.spec import check_layer as _check_layer
from numpy_attn.validation import JAX_FLOATS

__all__ = ["check_layer", "is_concrete"]


def is_concrete(params: Mapping[str, Any]) -> bool:
    """True unless some weight is a tracer (under ``jax.jit``/``jax.grad`` values are unknown)."""
    return isinstance(params, Mapping) and not any(
        isinstance(value, jax.core.Tracer) for value in params.values()
    )


def check_layer(layer: str, params: Mapping[str, Any], x: Any, **kwargs: Any) -> dict[str, Any]:
    """``numpy_attn.spec.check_layer``: the same errors, word for word (bfloat16 is accepted as
    well). Shapes and dtypes are checked at trace time; weight values only where concrete."""
    return _check_layer(layer, params, x, check_values=is_concrete(params), floating=JAX_FLOATS, **kwargs)
