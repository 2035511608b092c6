"""Running one layer in any framework by its torch class name: the one list of frameworks.

``RUNNERS`` is every framework column the report and the trace compare with torch_ref, and
``DTYPES`` the dtypes each computes in. Adding a framework = a package with the layer functions
(named by ``numpy_attn.spec.SPECS``), an entry in ``FRAMEWORK_PACKAGES`` if it is one, and a runner
plus its dtypes here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from parity_tests.cases import FUNCTION_NAMES, Case

__all__ = [
    "ALL_DTYPES",
    "DTYPES",
    "FRAMEWORK_PACKAGES",
    "RUNNERS",
    "jax_context",
    "layer_function",
    "run_case",
    "run_flax",
    "run_jax",
    "run_torch",
]

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


@contextlib.contextmanager
def jax_context(dtype: str) -> Iterator[None]:
    """JAX set up for a parity check in ``dtype``: 64-bit types enabled for float64 only (scoped
    to the block), and float32 matmul precision pinned, since on GPUs and TPUs JAX's default
    lets float32 matmuls run as TF32/bfloat16 passes that differ from torch at about 1e-3."""
    import jax

    with jax.enable_x64(dtype == "float64"), jax.default_matmul_precision("float32"):
        yield


def run_jax(
    case: Case,
    params: Mapping[str, Any],
    x: Any,
    *args: Any,
    jit: bool = False,
    dropout: float = 0.0,
    implementation: str = "reference",
    block_size: int | None = None,
    **kwargs: Any,
) -> tuple[Any, Mapping]:
    """The case's jax_attn function, eager or under ``jax.jit`` (constructor arguments,
    ``implementation`` and ``block_size`` static; None = the package's default block size)."""
    import jax

    fast = {"implementation": implementation} | ({} if block_size is None else {"block_size": block_size})
    call = functools.partial(
        layer_function("jax", case.layer), **case.kwargs(dropout), return_steps=True, **fast
    )
    return (jax.jit(call) if jit else call)(params, x, *args, **kwargs)


def run_flax(
    case: Case,
    params: Mapping[str, Any],
    x: Any,
    *args: Any,
    dropout: float = 0.0,
    implementation: str = "reference",
    block_size: int | None = None,
    **kwargs: Any,
) -> tuple[Any, Mapping]:
    """The case's Flax NNX module, built with ``from_params`` (eval mode), called with
    ``return_steps=True`` under ``nnx.jit`` inside ``nnx.capture`` (which takes the steps the
    module sows, leaving the module as it was)."""
    from flax import nnx

    import jax_attn

    fast = {"implementation": implementation} | ({} if block_size is None else {"block_size": block_size})
    module = getattr(jax_attn, case.layer).from_params(params, **case.kwargs(dropout), **fast)
    forward = nnx.capture(lambda m, *a, **k: m(*a, return_steps=True, **k), nnx.Intermediate)
    return nnx.jit(forward)(module, x, *args, **kwargs)[0]


Runner = Callable[[Case, Mapping[str, Any], Any], Mapping[str, Any]]


def _in_jax(run: Callable[..., tuple[Any, Mapping]]) -> Runner:
    def runner(case: Case, params: Mapping[str, Any], x: Any) -> Mapping[str, Any]:
        with jax_context(case.dtype):
            return run(case, params, x)[1]

    return runner


# framework column -> how it runs a case, (case, params, x) -> steps
RUNNERS: dict[str, Runner] = {
    "numpy": lambda case, params, x: run_case("numpy", case, params, x)[1],
    "jax": _in_jax(run_jax),
    "jax-jit": _in_jax(lambda case, params, x: run_jax(case, params, x, jit=True)),
    "flax": _in_jax(run_flax),
}
# the dtypes each framework computes in (NumPy has no bfloat16 arithmetic)
DTYPES: dict[str, tuple[str, ...]] = {
    "numpy": ("float32", "float64", "float16"),
    "jax": ("float32", "float64", "bfloat16"),
    "jax-jit": ("float32", "float64", "bfloat16"),
    "flax": ("float32", "float64", "bfloat16"),
}
ALL_DTYPES = ("float32", "float64", "float16", "bfloat16")
