"""The door of every public function, written once for both packages: the call's arguments bound
and checked once, the implementation picked, the math run (``Framework.compile``: as one ``jax.jit``
program in jax_attn), the output returned, or ``(output, steps)`` with ``return_steps=True``.
``layer`` checks a layer call by its ``LayerSpec``; ``block`` runs a building block's own check.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from numpy_attn import checks, finite, memory
from numpy_attn.fast.attend import fast_layer
from numpy_attn.fast.options import DEFAULT_BLOCK_SIZE, check_implementation, uses_blockwise
from numpy_attn.spec import LayerSpec, layer_spec, read_arguments

# the keyword arguments the door adds to every layer function, with their defaults
DOOR_OPTIONS = {"implementation": "reference", "block_size": DEFAULT_BLOCK_SIZE, "return_steps": False}


class Framework:
    """What the door and the framework-neutral code need of a package: its math (``ops``, the
    blockwise functions, ``xp``: numpy or jax.numpy) and how it differs (dtypes, random source,
    reading arrays, compiling). This is numpy_attn's; jax_attn's ``JaxFramework`` overrides the rest."""

    package = "numpy_attn"
    floats = checks.NUMPY_FLOATS
    random = "rng"  # the name of the random source's argument
    array_types: tuple[type, ...] = (np.ndarray,)

    def __init__(self, ops: Any = None, blockwise: Any = None, xp: Any = np, kv_cache: type | None = None):
        self.ops, self.blockwise, self.xp, self.kv_cache = ops, blockwise, xp, kv_cache

    def check_random(self, value: Any, name: str | None = None) -> None:
        checks.check_rng(value, name or self.random)

    def check_dtype(self, dtype: Any) -> np.dtype:
        """A ``dtype`` argument (a cache's, a module's): one the framework computes in."""
        return checks.check_dtype_argument(dtype, self.floats)

    def memory_bytes(self) -> int:
        """The bytes the framework's arrays may take (NumPy: this process's memory)."""
        return memory.memory_bytes()

    def cache_length(self, cache: Any) -> int | None:
        """The tokens a KV cache holds, None where traced."""
        return int(cache.length)

    def split_random(self, random: Any) -> tuple[Any, Any]:
        """Two random sources for two draws in one call (NumPy: the generator draws in turn)."""
        return random, random

    def head_random(self, random: Any, head: int) -> Any:
        """The random source of head ``head`` of a stack (NumPy: the generator draws in turn)."""
        return random

    def check_operands(self, *, optional: tuple[str, ...] = (), **arrays: Any) -> None:
        """Floating arrays of one dtype (``checks.check_operands``)."""
        checks.check_operands(self.floats, optional=optional, **arrays)

    def check_float64(self, name: str, value: Any) -> None:
        """A floating array's dtype is one the framework computes in as it is (JAX: float64 needs x64)."""

    def concrete(self, values: Mapping[str, Any]) -> bool:
        """Whether the values are known (not traced by ``jax.jit``, ``jax.grad``...)."""
        return True

    def check_finite(self, params: Mapping[str, Any]) -> None:
        """``finite.check_finite`` of the weights where they are known, whatever else is traced."""
        if self.concrete({"params": params}):
            finite.check_finite(params)

    def read(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments as the math computes with them: another framework's arrays (JAX's) as NumPy's."""
        return {name: _as_numpy(value) for name, value in arguments.items()}

    def compile(self, fn: Callable[..., Any], static: tuple[str, ...]) -> Callable[..., Any]:
        """``fn`` as the door runs it, ``run(with_steps, **arguments)``: as it is here; jax_attn runs
        it as one compiled program, which returns the steps only ``with_steps``."""
        return lambda with_steps, **arguments: fn(**arguments)


_AS_THEY_ARE = {np.ndarray, int, float, str, bool}


def _as_numpy(value: Any) -> Any:
    if type(value) in _AS_THEY_ARE or value is None:  # the common cases, in one test
        return value
    if isinstance(value, Mapping):  # the weights
        if all(type(v) is np.ndarray for v in value.values()):
            return value
        return {name: _as_numpy(v) for name, v in value.items()}
    if hasattr(value, "__array__") and hasattr(value, "shape") and not isinstance(value, np.ndarray | type):
        return np.asarray(value)
    return value


def _signature(fn: Callable[..., Any], extra: Mapping[str, Any], skip: int = 0) -> inspect.Signature:
    """``fn``'s signature without its first ``skip`` parameters, with the keyword-only ``extra``
    arguments (name -> default) after its own."""
    signature = inspect.signature(fn)
    returns = signature.return_annotation
    if extra.get("return_steps") is False and isinstance(returns, str) and returns.startswith("tuple["):
        output = returns.removeprefix("tuple[").split(",")[0]  # "tuple[np.ndarray, Steps]" -> output or both
        signature = signature.replace(return_annotation=f"{output} | {returns}")
    added = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=value, annotation=type(value).__name__
        )
        for name, value in extra.items()
    ]
    return signature.replace(parameters=[*list(signature.parameters.values())[skip:], *added])


def _binder(signature: inspect.Signature) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """``bind(args, kwargs)``: the call's arguments by name, defaults filled, as ``signature.bind``
    binds them (its TypeError for a call that does not fit), in a fraction of its time."""
    parameters = list(signature.parameters.values())
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    names = {p.name for p in parameters}

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        arguments = {**defaults, **dict(zip(positional, args, strict=False)), **kwargs}
        if (
            len(args) > len(positional)
            or len(arguments) != len(names)
            or any(k in kwargs for k in positional[: len(args)])
        ):
            bound = signature.bind(*args, **kwargs)  # raises its TypeError
            bound.apply_defaults()
            return dict(bound.arguments)
        return arguments

    return bind


def layer(spec: LayerSpec, framework: Framework, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The public layer function of ``spec``: ``fn``'s arguments plus ``implementation``,
    ``block_size`` and ``return_steps``, checked by ``check_layer_call``, then computed."""
    signature = _signature(fn, DOOR_OPTIONS)
    bind = _binder(signature)
    reference = framework.compile(fn, spec.static)
    run_fast = functools.partial(fast_layer, spec, framework)  # spec's layer on its fast path
    fast = framework.compile(run_fast, (*spec.static, *DOOR_OPTIONS))

    @functools.wraps(fn)
    def public(*args: Any, **kwargs: Any) -> Any:
        arguments = bind(args, kwargs)
        check_layer_call(spec, framework, arguments)
        arguments = framework.read(arguments)
        return_steps = arguments.pop("return_steps")
        concrete = framework.concrete(arguments)
        implementation, block_size = arguments.pop("implementation"), arguments.pop("block_size")
        if uses_blockwise(implementation, arguments["x"].shape[-2]):
            options = {
                "implementation": implementation,
                "block_size": block_size,
                "return_steps": return_steps,
            }
            run = fast if concrete else lambda _, **a: run_fast(**a)
            output, steps = run(return_steps, **arguments, **options)
        else:
            run = reference if concrete else lambda _, **a: fn(**a)
            output, steps = run(return_steps, **arguments)
        return (output, steps) if return_steps else output

    public.__signature__ = signature
    public.__doc__ = (fn.__doc__ or "") + LAYER_DOOR_DOC
    return public


LAYER_DOOR_DOC = """
    The door adds: ``implementation`` (``"reference"``: the math above; ``"blockwise"``: the
    O(T)-memory path; ``"auto"``: blockwise from 512 tokens), ``block_size`` (the blockwise path's
    keys per block) and ``return_steps`` (True: ``(output, steps)``; False: the output).
    Bad input raises TypeError or ValueError naming the argument and the shapes (``check_layer_call``).
"""
BLOCK_DOOR_DOC = """
    ``return_steps=True`` returns ``(output, steps)``; False, the output. Bad input raises TypeError or
    ValueError naming the argument and the shapes.
"""


def block(
    fn: Callable[..., Any],
    check: Callable[..., None],
    framework: Framework,
    *,
    steps: bool = False,
    framework_first: bool = False,
    static: tuple[str, ...] | None = None,
) -> Callable[..., Any]:
    """A public building block: ``check(framework, arguments)``, then ``fn``. With ``steps``, ``fn``
    returns ``(output, steps)`` and the public function takes ``return_steps``; with
    ``framework_first``, ``fn`` is framework-neutral code that takes the framework first; with
    ``static`` (argument names), a call on known values runs as one compiled program."""
    signature = _signature(fn, {"return_steps": False} if steps else {}, skip=int(framework_first))
    bind = _binder(signature)
    run = functools.partial(fn, framework) if framework_first else fn
    compiled = None if static is None else framework.compile(run, static)

    @functools.wraps(fn)
    def public(*args: Any, **kwargs: Any) -> Any:
        arguments = bind(args, kwargs)
        check(framework, arguments)
        arguments = framework.read(arguments)
        return_steps = arguments.pop("return_steps") if steps else False
        if compiled is not None and framework.concrete(arguments):
            result = compiled(return_steps or not steps, **arguments)  # fn's whole result, or its output
        else:
            result = run(**arguments)
        if not steps:
            return result
        output, trace = result
        return (output, trace) if return_steps else output

    public.__signature__ = signature
    if steps:
        public.__doc__ = (fn.__doc__ or "") + BLOCK_DOOR_DOC
    return public


def check_layer_call(spec: LayerSpec, framework: Framework, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Every check of one call of ``spec``'s layer function, in this order: the context length (a
    positive int), the implementation and block size, the weights against the sizes given
    (``num_heads``), the dropout rates, the input (dtype, rank, non-empty axes, width), the
    weights' keys, shapes and dtype (x's), T within the context, the masks' shapes and dtypes,
    the random source, finite weights (where values are known) and ``return_steps`` a bool.
    Returns the constructor arguments known from them."""
    params, x = arguments["params"], arguments["x"]
    if spec.context is not None:
        checks.check_size(spec.context, arguments[spec.context])
    check_implementation(arguments.get("implementation", "reference"), arguments.get("block_size", 1))
    given = {"num_heads": arguments["num_heads"]} if "num_heads" in spec.constructor else {}
    known = read_arguments(spec, params, given)
    for name in spec.dropouts:
        checks.check_dropout(name, arguments.get(name, spec.defaults.get(name)))
    shape = checks.check_input(
        x, layout=spec.input_layout, d_in=known[spec.input_width], floating=framework.floats
    )
    checks.check_params(params, spec.shapes(**known), layer=spec.name, dtype=x.dtype)
    framework.check_float64("x", x)  # x and the weights share its dtype
    if spec.context is not None:
        checks.check_context_length(shape, arguments[spec.context], spec.context)
    if not uses_blockwise(arguments.get("implementation", "reference"), shape[-2]):
        check_scores_memory(spec, framework, shape, known.get("num_heads", 1), x.dtype)
    check_masks(spec, shape, known.get("num_heads", 1), arguments)
    if spec.dropouts:
        framework.check_random(arguments.get(framework.random))
    framework.check_finite(params)
    checks.check_flag("return_steps", arguments.get("return_steps", False))
    return known


SCORE_ARRAYS = 4  # (B, N, T, S) arrays the reference path holds at once: scores, masked, weights, dropped


def check_scores_memory(
    spec: LayerSpec, framework: Framework, shape: tuple[int, ...], num_heads: int, dtype: Any
) -> None:
    """The reference path's (B, N, T, S) score arrays fit in memory (ValueError otherwise, pointing to
    the blockwise path, whose memory grows with T, not T^2)."""
    batch, tokens = (shape[0] if len(shape) == 3 else 1), shape[-2]
    scores = (batch, num_heads if spec.multi_head else 1, tokens, tokens)
    itemsize = max(np.dtype(dtype).itemsize, 4)  # half precision's scores are float32
    memory.check_memory(
        f"{spec.name}'s {SCORE_ARRAYS} arrays of (B, N, T, S) = {scores} attention scores",
        SCORE_ARRAYS * math.prod(scores) * itemsize, framework.memory_bytes(),
        hint="; implementation='blockwise' holds O(T) instead",
    )  # fmt: skip


def check_masks(
    spec: LayerSpec, shape: tuple[int, ...], num_heads: int, arguments: Mapping[str, Any]
) -> None:
    """The masks a call was given: ``attn_keep_mask`` the attention weights' shape (``(B, N, T, S)``,
    no N for one head), ``out_keep_mask`` the output's ``(B, T, D)``, ``padding_mask`` ``(B, S)``."""
    if arguments.get("attn_keep_mask") is not None:
        heads = (num_heads,) if spec.multi_head else ()
        checks.check_keep_mask(
            "attn_keep_mask", arguments["attn_keep_mask"], (*shape[:-2], *heads, shape[-2], shape[-2])
        )
    if arguments.get("out_keep_mask") is not None:
        checks.check_keep_mask("out_keep_mask", arguments["out_keep_mask"], shape)
    if arguments.get("padding_mask") is not None:
        checks.check_padding_mask(arguments["padding_mask"], shape[0], shape[1])


def check_layer(layer: str, params: Mapping[str, Any], x: Any, **arguments: Any) -> dict[str, Any]:
    """The checks a call of ``layer``'s numpy_attn function with these arguments would make (the
    door's ``check_layer_call``); returns the constructor arguments known from them."""
    return check_layer_call(layer_spec(layer), _NUMPY_CHECKS, {"params": params, "x": x, **arguments})


_NUMPY_CHECKS = Framework()  # numpy_attn's checks: no math is run through it
