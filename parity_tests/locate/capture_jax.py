"""Capture every value a JAX callable computes: trace it to a jaxpr, then evaluate the jaxpr
equation by equation, recording each output with the user's line from the equation's source info.

Plain functions, ``jax.jit``/``nnx.jit`` callables and NNX modules all trace the same way: the
array leaves of the arguments become the jaxpr's inputs, everything else (static arguments such as
``num_heads`` or ``return_steps``) is closed over, so jitted callables see plain Python values.
The interpreter descends into ``jit``/``pjit``, ``closed_call``, ``custom_jvp_call``,
``custom_vjp_call``, ``remat``, the taken branch of ``cond`` and each iteration of ``scan``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from parity_tests.locate.trace import Trace, split_result, user_stack

__all__ = ["capture_jax"]

_CALLS = {  # primitive -> the parameter holding the jaxpr it calls
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
}


def _stack(eqn: Any, caller: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The user's frames of an equation, innermost first; those of the calling equation when it
    has none (the body of a library function jitted on its own, such as ``jnp.tril``)."""
    from jax._src import source_info_util

    frames = source_info_util.user_frames(eqn.source_info.traceback)
    return user_stack((f.file_name, f.start_line, f.function_name) for f in frames) or caller


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (bool, int, float))


def capture_jax(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Trace:
    """Trace ``fn(*args, **kwargs)`` and evaluate it recording every equation's outputs."""
    import functools
    import sys

    import jax

    while isinstance(fn, functools.partial):  # bound arguments (a model, say) are traced like the rest
        fn, args, kwargs = fn.func, (*fn.args, *args), {**fn.keywords, **kwargs}
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(fn, nnx.Module):  # its parameters become the jaxpr's inputs
        fn, args = _call_module, (fn, *args)
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), kwargs))
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path((tuple(args), kwargs))[0]
    ]
    traced = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
    steps_tree: list[Any] = []

    def flat_fn(*arrays):
        filled = list(leaves)
        for i, array in zip(traced, arrays, strict=True):
            filled[i] = array
        call_args, call_kwargs = jax.tree_util.tree_unflatten(treedef, filled)
        output, steps = split_result(fn(*call_args, **call_kwargs))
        steps_tree.append(sorted(steps))  # the order jax flattens a dict in
        return output, steps

    arrays = [jax.numpy.asarray(leaves[i]) for i in traced]
    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*arrays)
    trace = Trace("jax")
    env: dict[Any, tuple[Any, int]] = {}
    for position, (var, i, array) in enumerate(zip(closed.jaxpr.invars, traced, arrays, strict=True)):
        name = _leaf_name(paths[i], position)
        env[var] = (array, trace.add("input", np.asarray(array), str(array.dtype), "input", leaf=name))
    for var, const in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        env[var] = (
            const,
            trace.add("leaf", np.asarray(const), str(const.dtype), "constant", leaf="constant"),
        )
    outs = _evaluate(closed.jaxpr, env, trace, ())
    n_out = len(jax.tree_util.tree_leaves(out_shape[0]))
    trace.output = outs[0][1]
    step_names = steps_tree[-1] if steps_tree else []
    values = [np.asarray(v) for v, _ in outs[n_out:]]
    trace.name_steps({k: v for k, v in zip(step_names, values, strict=True) if k != "output"})
    return trace


def _call_module(module: Any, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def _leaf_name(path: str, position: int) -> str:
    """A traced leaf's name from its path in ``(args, kwargs)``: ``"[0][1]"`` (a positional array)
    -> ``input1``; ``"[0][0]['W_query.weight']"`` -> ``W_query.weight``; ``"[0][0].query.kernel.value"``
    (an NNX module's parameter) -> ``query.kernel``."""
    rest = path.split("]", 2)[-1] if path.startswith("[0]") else path
    name = rest.strip("[]'\".").removesuffix(".value")
    return name if name else f"input{position}"


def _evaluate(
    jaxpr: Any, env: dict[Any, tuple[Any, int]], trace: Trace, caller: tuple[tuple[str, str], ...]
) -> list[tuple[Any, int]]:
    """Evaluate ``jaxpr`` with ``env`` (var -> (value, record index)) holding its inputs; ``caller``
    is the stack of the equation calling it."""
    from jax.extend.core import Literal

    def read(var):
        if isinstance(var, Literal):
            return var.val, None
        return env[var]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        stack = _stack(eqn, caller)
        if name in _CALLS and _CALLS[name] in eqn.params:
            outs = _call(eqn.params[_CALLS[name]], invals, trace, stack)
        elif name == "cond":
            branch = eqn.params["branches"][int(invals[0][0])]
            outs = _call(branch, invals[1:], trace, stack)
        elif name == "scan":
            outs = _scan(eqn, invals, trace, stack)
        else:
            values = eqn.primitive.bind(*[v for v, _ in invals], **eqn.params)
            values = values if eqn.primitive.multiple_results else [values]
            sources = tuple(i for _, i in invals if i is not None)
            outs = [
                (value, trace.add(name, np.asarray(value), str(value.dtype), "?", sources, stack=stack))
                for value in values
            ]
        for var, out in zip(eqn.outvars, outs, strict=True):
            env[var] = out
    return [read(v) for v in jaxpr.outvars]


def _call(
    called: Any, invals: list[tuple[Any, int]], trace: Trace, stack: tuple[tuple[str, str], ...]
) -> list[tuple[Any, int]]:
    """Evaluate a called jaxpr (closed or open) on the caller's values."""
    jaxpr, consts = (called.jaxpr, called.consts) if hasattr(called, "consts") else (called, [])
    env = dict(zip(jaxpr.invars, invals, strict=True))
    for var, const in zip(jaxpr.constvars, consts, strict=True):
        env[var] = (
            const,
            trace.add("leaf", np.asarray(const), str(const.dtype), "constant", leaf="constant"),
        )
    return _evaluate(jaxpr, env, trace, stack)


def _scan(
    eqn: Any, invals: list[tuple[Any, int]], trace: Trace, stack: tuple[tuple[str, str], ...]
) -> list[tuple[Any, int]]:
    """Run a scan's body once per iteration, recording each iteration's values."""
    import jax.numpy as jnp

    params = eqn.params
    n_consts, n_carry, length = params["num_consts"], params["num_carry"], params["length"]
    consts, carry, xs = invals[:n_consts], invals[n_consts : n_consts + n_carry], invals[n_consts + n_carry :]
    ys: list[list[tuple[Any, int]]] = []
    steps = range(length - 1, -1, -1) if params["reverse"] else range(length)
    for step in steps:
        x_slices = [(value[step], index) for value, index in xs]
        outs = _call(params["jaxpr"], [*consts, *carry, *x_slices], trace, stack)
        carry, y = outs[:n_carry], outs[n_carry:]
        ys.append(y)
    if params["reverse"]:
        ys.reverse()
    stacked = []
    for column in zip(*ys, strict=True) if ys else []:
        value = jnp.stack([v for v, _ in column])
        sources = tuple(i for _, i in column if i is not None)
        stacked.append(
            (value, trace.add("scan", np.asarray(value), str(value.dtype), "?", sources, stack=stack))
        )
    return [*carry, *stacked]
