"""Run a reference or a candidate from any framework, capturing every value it computes."""

from __future__ import annotations

import contextlib
import inspect
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from parity_tests.locate.trace import Raised, Trace, exits_raise

__all__ = [
    "NoGradients",
    "applied",
    "capture",
    "evaluating",
    "framework_of",
    "holds_weights",
    "returned_framework",
    "source_file",
    "takes_return_steps",
    "to_numpy",
    "unwrapped",
]


class NoGradients(TypeError):
    """Gradient parity asked of a callable that computes with NumPy, which has no gradients."""


def _unwrap_chain(fn: Any) -> list[Any]:
    """``fn`` and what it wraps: a partial's function, a decorator's ``__wrapped__``, a method's."""
    chain = [fn]
    while True:
        inner = getattr(fn, "func", None) or getattr(fn, "__wrapped__", None) or getattr(fn, "__func__", None)
        if inner is None or any(inner is seen for seen in chain):
            return chain
        chain.append(inner)
        fn = inner


def unwrapped(fn: Any) -> Any:
    """What ``fn`` wraps, all the way in: the function behind partials, decorators and methods."""
    return _unwrap_chain(fn)[-1]


def _global_names(code: Any) -> set[str]:
    """The global names a function's code (nested functions included) reads."""
    if code is None:
        return set()
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _global_names(const)
    return names


def framework_of(fn: Any) -> str:
    """``"torch"``, ``"jax"`` or ``"numpy"``: what ``fn`` computes with, as far as can be told
    without running it (torch modules, jitted callables, NNX and linen modules by type; plain
    functions by the modules their code reads; ``"numpy"`` when none). ``capture`` then checks
    the guess against the values ``fn`` returns."""
    return _guess(fn)[0]


def _guess(fn: Any) -> tuple[str, bool]:
    """``(framework, certain)``: certain for modules and jitted callables by type and for code
    reading torch or JAX names; a guess (NumPy) otherwise, a wrapper calling code elsewhere
    included."""
    from parity_tests.locate.capture_torch import torch_module_of

    if torch_module_of(fn) is not None:
        return "torch", True
    nnx = sys.modules.get("flax.nnx")
    for layer in _unwrap_chain(fn):
        if hasattr(layer, "lower") or type(layer).__module__.split(".")[0] in ("flax", "jax"):
            return "jax", True
        if (nnx is not None and isinstance(layer, nnx.Module)) or _linen_module(layer) is not None:
            return "jax", True
    target = unwrapped(fn)
    function = target if inspect.isfunction(target) else getattr(type(target).__call__, "__func__", None)
    function = function or type(target).__call__
    used = set()
    for name in _global_names(getattr(function, "__code__", None)):
        value = getattr(function, "__globals__", {}).get(name)
        used.add(
            (getattr(value, "__name__", "") if inspect.ismodule(value) else getattr(value, "__module__", ""))
            or ""
        )
    roots = {name.split(".")[0] for name in used}
    if "torch" in roots:
        return "torch", True
    if roots & {"jax", "flax", "jaxlib", "jax_attn"}:
        return "jax", True
    return "numpy", False


def _linen_module(value: Any) -> Any:
    """The Flax linen module ``value`` is (outside ``apply``), or None."""
    linen = sys.modules.get("flax.linen")
    if linen is None or not isinstance(value, linen.Module) or value.scope is not None:
        return None
    return value


def returned_framework(value: Any) -> str | None:
    """The framework of an array a callable returned: ``"torch"``, ``"jax"``, ``"numpy"``, or None."""
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        return "torch"
    if module in ("jax", "jaxlib"):
        return "jax"
    return "numpy" if isinstance(value, np.ndarray) else None


def source_file(fn: Any) -> str | None:
    """The file defining ``fn`` (what a partial, a decorator or a method wraps; a module's or
    callable object's class); None where Python does not know it (a builtin)."""
    target = unwrapped(fn)
    try:
        return inspect.getsourcefile(target if inspect.isroutine(target) else type(target))
    except TypeError:
        return None


def to_numpy(value: Any) -> Any:
    """A torch tensor (bfloat16 and requires_grad included) or JAX array as a NumPy array; bfloat16
    becomes float32 (NumPy has no bfloat16 arithmetic)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        return (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.ndarray):
        array = np.asarray(value)
        return array.astype(np.float32) if array.dtype.name == "bfloat16" else array
    return value


def holds_weights(fn: Any) -> bool:
    """Whether ``fn`` is called on the inputs alone: a torch module, or a callable object (an NNX
    module, a NumPy or JAX class's instance) holding its own weights, also inside a
    ``functools.partial``. A function (plain, jitted or decorated, a method) takes the weights first."""
    from parity_tests.locate.capture_torch import torch_module_of

    target = unwrapped(fn)
    if _linen_module(target) is not None:  # called through ``apply``, its variables first
        return False
    return torch_module_of(fn) is not None or not inspect.isroutine(target)


def _convert(value: Any, framework: str, dtype: Any) -> Any:
    """An array (or a pytree of them: the weights) in ``framework``, floating ones in ``dtype``."""
    if isinstance(value, dict):
        return {k: _convert(v, framework, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_convert(v, framework, dtype) for v in value)
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        return value
    array = to_numpy(value)
    if framework == "torch":
        import torch

        tensor = torch.from_numpy(np.array(array))
        return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    if framework == "jax":
        import jax.numpy as jnp

        result = jnp.asarray(array)
        return (
            result.astype(dtype)
            if dtype is not None and jnp.issubdtype(result.dtype, jnp.floating)
            else result
        )
    return array.astype(dtype) if dtype is not None and array.dtype.kind == "f" else array


def _dtype_of(fn: Any, framework: str, inputs: Sequence[Any]) -> Any:
    """The floating dtype to feed ``fn``: a torch module's parameters' (or buffers'), else the
    inputs' own (a bfloat16 tensor stays bfloat16 for torch and JAX)."""
    from parity_tests.locate.capture_torch import torch_module_of

    module = torch_module_of(fn)
    if module is not None:
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point():
                return tensor.dtype
        return None
    bf16 = any(str(getattr(v, "dtype", "")).endswith("bfloat16") for v in inputs)
    if bf16 and framework in ("torch", "jax"):
        if framework == "torch":
            import torch

            return torch.bfloat16
        import jax.numpy as jnp

        return jnp.bfloat16
    return None


def takes_return_steps(fn: Any) -> bool:
    """Whether ``fn`` (a torch module: its ``forward``) takes ``return_steps``."""
    target = getattr(fn, "forward", fn)
    try:
        return "return_steps" in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def capture(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    params: Any = None,
    framework: str | None = None,
    train: bool = False,
    gradient_seed: int | None = None,
    keep_masks: Sequence[Any] | None = None,
    kept_high: bool = True,
    drop_rates: Sequence[float | None] | None = None,
) -> Trace:
    """Run ``fn`` on ``inputs`` (converted to its framework; ``params`` first when ``fn`` is a function, see
    ``holds_weights``) and capture every value it computes. A torch module runs in eval mode unless
    ``train``. With ``gradient_seed``, also every value's cotangent (``Trace.cotangents``): torch and JAX
    only, NumPy has no gradients (``NoGradients``, a TypeError). ``keep_masks`` (a torch reference's
    dropout keep-masks, ``Trace.keep_masks``, at its ``drop_rates``) replace a JAX callable's random
    keep-masks, or are drawn by the NumPy ``Generator`` passed to a NumPy callable (``kept_high``: which
    draws keep, see ``capture_numpy``; for JAX, how a draw that cannot tell keep from drop is taken).
    An exception ``fn`` raises comes as ``Raised`` (the exception, and the values ``fn`` computed
    before it), an exit too (``sys.exit``, ``os._exit``, a ``KeyboardInterrupt``).

    ``framework`` (``"numpy"``, ``"jax"``, ``"torch"``) overrides the detection: without it, a callable
    that is not a module or jitted and reads no torch or JAX name is run as NumPy first, then again in
    the framework of the value it returns, or in JAX or torch when NumPy's arrays make it raise.
    ``params`` may be a pytree (nested dicts and lists of arrays, a linen module's variables): it goes
    first to a function, and a linen module is called as ``module.apply(params, *inputs)``."""
    certain = framework is not None
    if framework is None:
        framework, certain = _guess(fn)
    run = (inputs, params, train, gradient_seed, keep_masks, kept_high, drop_rates)
    # NumPy has no gradients: a guessed NumPy callable runs forward first, for the framework it returns
    first = run
    if gradient_seed is not None and not certain and framework == "numpy":
        first = (inputs, params, train, None, keep_masks, kept_high, drop_rates)
    try:
        trace = _capture(fn, framework, *first)
    except Raised as raised:
        if certain or not isinstance(raised.error, Exception):
            raise
        for other in ("jax", "torch"):  # a wrapper of code elsewhere, refusing NumPy's arrays
            if other in sys.modules:
                try:
                    return _capture(fn, other, *run)
                except Raised:
                    continue
        raise
    if not certain and trace.returned not in (None, framework):  # it computes with what it returns
        return _capture(fn, trace.returned, *run)
    return trace if first is run else _capture(fn, framework, *run)


def _capture(
    fn: Callable[..., Any],
    framework: str,
    inputs: Sequence[Any],
    params: Any,
    train: bool,
    gradient_seed: int | None,
    keep_masks: Sequence[Any] | None,
    kept_high: bool,
    drop_rates: Sequence[float | None] | None,
) -> Trace:
    from parity_tests.locate.capture_jax import capture_jax
    from parity_tests.locate.capture_numpy import capture_numpy
    from parity_tests.locate.capture_torch import capture_torch, torch_module_of

    if gradient_seed is not None and framework == "numpy":
        raise NoGradients(
            f"capture: {getattr(fn, '__name__', type(fn).__name__)} computes with NumPy, which has no "
            "gradients: gradient parity needs a torch or JAX callable"
        )
    dtype = _dtype_of(fn, framework, inputs)
    args = [_convert(v, framework, dtype) for v in inputs]
    if params is not None and not holds_weights(fn):
        args.insert(0, _convert(params, framework, dtype))
    fn = applied(fn)
    kwargs = {"return_steps": True} if takes_return_steps(fn) else {}
    capture_fn = {"torch": capture_torch, "jax": capture_jax, "numpy": capture_numpy}[framework]
    with (
        evaluating(torch_module_of(fn), not train),
        warnings.catch_warnings(),
        np.errstate(all="ignore"),
        exits_raise(),
    ):
        warnings.simplefilter("ignore")
        if framework == "jax" and keep_masks:
            return capture_jax(fn, args, kwargs, gradient_seed, keep_masks, drop_rates, kept_high)
        if framework == "numpy" and keep_masks:
            return capture_numpy(fn, args, kwargs, keep_masks, kept_high, drop_rates)
        if gradient_seed is None:
            return capture_fn(fn, args, kwargs)
        return capture_fn(fn, args, kwargs, gradient_seed)


@contextlib.contextmanager
def evaluating(module: Any, evaluate: bool = True) -> Iterator[None]:
    """A torch ``module`` (None: nothing to do) in eval mode where ``evaluate`` (else in the mode it is
    in), its own mode put back afterwards."""
    if module is None or not evaluate:
        yield
        return
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def applied(fn: Any) -> Any:
    """``fn`` as it is called: a linen module (maybe inside a ``functools.partial``) as the function
    ``module.apply``, its variables (the weights) first; anything else as it is."""
    import functools

    module = _linen_module(unwrapped(fn))
    if module is None:
        return fn
    if isinstance(fn, functools.partial):
        return functools.partial(module.apply, *fn.args, **fn.keywords)
    return module.apply
