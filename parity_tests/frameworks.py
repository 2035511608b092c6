"""Running one layer in any framework by its torch class name."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from parity_tests.cases import FUNCTION_NAMES, Case

__all__ = ["FRAMEWORK_PACKAGES", "layer_function", "run_case", "run_torch"]

# framework -> package holding the layer functions
FRAMEWORK_PACKAGES: dict[str, str] = {"numpy": "numpy_attn", "jax": "jax_attn"}


def layer_function(framework: str, layer: str) -> Callable[..., Any]:
    """``numpy_attn.multi_head_attention`` for ``("numpy", "MultiHeadAttention")``, etc."""
    if framework not in FRAMEWORK_PACKAGES:
        raise ValueError(f"unknown framework {framework!r}; known: {list(FRAMEWORK_PACKAGES)}")
    package = importlib.import_module(FRAMEWORK_PACKAGES[framework])
    return getattr(package, FUNCTION_NAMES[layer])


def run_torch(module: Any, x: np.ndarray, *args: Any, **kwargs: Any) -> tuple[Any, Mapping]:
    """``module(x, *args, return_steps=True, **kwargs)`` with NumPy inputs turned into tensors."""
    from torch_ref import from_numpy

    to_torch = lambda v: from_numpy(v) if isinstance(v, np.ndarray) else v  # noqa: E731
    kwargs = {k: to_torch(v) for k, v in kwargs.items()}
    return module(from_numpy(x), *map(to_torch, args), return_steps=True, **kwargs)


def run_case(
    framework: str,
    case: Case,
    params: Mapping[str, Any],
    x: Any,
    *args: Any,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, Mapping]:
    """The case's layer function in ``framework`` with the case's keyword arguments (dropout
    probabilities ``dropout``) plus ``kwargs``; returns ``(output, steps)``."""
    fn = layer_function(framework, case.layer)
    return fn(params, x, *args, **case.kwargs(dropout), return_steps=True, **kwargs)
