"""Capture every value a JAX callable computes: trace it to a jaxpr, then evaluate the jaxpr
equation by equation, recording each output with the user's line from the equation's source info.

Plain functions, ``jax.jit``/``nnx.jit`` callables and NNX modules all trace the same way: the
array leaves of the arguments become the jaxpr's inputs, everything else (static arguments such as
``num_heads`` or ``return_steps``) is closed over, so jitted callables see plain Python values.
The interpreter descends into ``jit``/``pjit``, ``closed_call``, ``custom_jvp_call``,
``custom_vjp_call``, ``remat``, the taken branch of ``cond`` and each iteration of ``scan``.

With a gradient seed, the same interpreter runs a second time under ``jax.vjp`` adding a zero
"probe" to every floating value it records: the gradient with respect to a record's probe is the
cotangent of that value (``Trace.cotangents``). Custom rules are kept: a ``custom_vjp``/
``custom_jvp`` call is bound whole, and the values inside it have no cotangent of their own.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from parity_tests.locate.dropout import share_bound
from parity_tests.locate.lines import Loop, LoopLog
from parity_tests.locate.trace import CustomRule, Raised, Trace, cotangent_for, split_result, user_stack

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


def _python_loops(jaxpr: Any, runs: list[tuple[str, tuple[Loop, ...]]]) -> dict[int, tuple[Loop, ...]]:
    """``id(eqn)`` -> the Python loops (``Loop``) the user's line creating it ran in, for the
    equations of ``jaxpr`` and of the jaxprs they call, read from ``runs`` (``LoopLog``): equations
    are created in the order their lines run, so each takes the run of its line at or after the last
    one taken (a line going on after a helper it calls returned: the last run of its line before).
    A jaxpr called twice (a jitted helper traced once) has none: each call's are its caller's."""
    found: dict[int, tuple[Loop, ...]] = {}
    at, seen = 0, set()
    by_line: dict[str, list[int]] = {}  # "path:line" -> its runs, in order
    for i, (where, _) in enumerate(runs):
        by_line.setdefault(where, []).append(i)

    def walk(jaxpr: Any) -> None:
        nonlocal at
        for eqn in jaxpr.eqns:
            for inner in _inner_jaxprs(eqn):
                if id(inner) in seen:  # traced once, called again (a jit's cache): its equations
                    forget(inner)  # take each call's loops from the calling equation
                else:
                    seen.add(id(inner))
                    walk(inner)
            stack = _stack(eqn, ())
            if not stack:
                continue
            those = by_line.get(stack[0][0], [])
            position = bisect.bisect_left(those, at)
            if position < len(those):  # its line's next run
                at = run = those[position]
            elif those:  # its line went on after a helper returned
                run = those[-1]
            else:
                continue
            if runs[run][1]:
                found[id(eqn)] = runs[run][1]

    def forget(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            found.pop(id(eqn), None)
            for inner in _inner_jaxprs(eqn):
                forget(inner)

    walk(jaxpr)
    return found


def _inner_jaxprs(eqn: Any) -> list[Any]:
    """The jaxprs an equation calls (a jit's, a scan's body, a cond's branches), in order."""
    found = []
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (bool, int, float))


def capture_jax(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    gradient_seed: int | None = None,
    keep_masks: Sequence[np.ndarray] | None = None,
    drop_rates: Sequence[float | None] | None = None,
    kept_high: bool = True,
) -> Trace:
    """Trace ``fn(*args, **kwargs)`` and evaluate it recording every equation's outputs; with
    ``gradient_seed``, also the cotangent of every floating value for the loss
    ``sum(output * cotangent_for(output, gradient_seed))``; with ``keep_masks`` (a reference's
    dropout keep-masks, in order, at their ``drop_rates``), its random keep-masks replaced by them
    (``kept_high``: a draw that cannot tell a keep-mask from a drop-mask taken as a keep-mask, see
    ``_Recorder``). An exception ``fn``
    raises while traced comes as ``Raised``, with the values ``_eager_trace`` finds before it."""
    import functools
    import sys

    import jax

    from parity_tests.locate.run import returned_framework

    while isinstance(fn, functools.partial):  # bound arguments (a model, say) are traced like the rest
        fn, args, kwargs = fn.func, (*fn.args, *args), {**fn.keywords, **kwargs}
    if hasattr(fn, "lower") and hasattr(fn, "__wrapped__"):  # jax.jit's: its function is traced, so
        fn = fn.__wrapped__  # that its Python runs (its loops are seen) where the jit's cache is warm
    nnx = sys.modules.get("flax.nnx")
    if nnx is not None and isinstance(fn, nnx.Module):  # its parameters become the jaxpr's inputs
        fn, args = _call_module, (fn, *args)
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), kwargs))
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path((tuple(args), kwargs))[0]]
    traced = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
    steps_tree: list[Any] = []
    returned: list[str | None] = []

    def flat_fn(*arrays):
        filled = list(leaves)
        for i, array in zip(traced, arrays, strict=True):
            filled[i] = array
        call_args, call_kwargs = jax.tree_util.tree_unflatten(treedef, filled)
        output, steps = split_result(fn(*call_args, **call_kwargs))
        returned.append("jax" if isinstance(output, jax.core.Tracer) else returned_framework(output))
        steps_tree.append(sorted(steps))  # the order jax flattens a dict in
        return output, steps

    arrays = [jax.numpy.asarray(leaves[i]) for i in traced]
    try:
        with LoopLog() as log:  # the port's Python loops run once, as it is traced
            closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*arrays)
    except Exception as error:  # raised while tracing: nothing is evaluated yet
        raise Raised(error, _eager_trace(fn, args, kwargs, error)) from error
    except BaseException as error:  # an exit: the port failed at its line
        raise Raised(error, Trace("jax")) from error
    names = [_leaf_name(paths[i], position) for position, i in enumerate(traced)]
    trace = Trace("jax")
    recording = _Recording(trace, keep_masks, drop_rates, kept_high)
    recording.python = _python_loops(closed.jaxpr, log.runs)
    outs = _run(closed, arrays, names, recording)
    n_out = len(jax.tree_util.tree_leaves(out_shape[0]))
    trace.output = outs[0][1]
    trace.returned = returned[-1] if returned else None
    step_names = steps_tree[-1] if steps_tree else []
    values = [np.asarray(v) for v, _ in outs[n_out:]]
    trace.name_steps({k: v for k, v in zip(step_names, values, strict=True) if k != "output"})
    if gradient_seed is not None:
        cotangent = cotangent_for(outs[0][0], gradient_seed)
        _cotangents(trace, closed, arrays, names, cotangent, keep_masks, drop_rates, kept_high)
    return trace


def _eager_trace(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], error: Exception
) -> Trace:
    """The values ``fn`` computed before raising ``error`` while traced: ``fn`` run again eagerly
    (``jax.disable_jit``), the arrays each of its lines binds recorded (``LineTracer``). Kept only
    where that run raises the same (type and text), so that they are the values the traced run would
    have had; else (an error of tracing alone, such as a traced value in a Python ``if``) an empty
    trace: nothing was evaluated."""
    import jax

    from parity_tests.locate.lines import LineTracer

    trace = Trace("jax")
    tracer = LineTracer(record=trace)
    tracer.is_array = lambda value: isinstance(value, (jax.Array, np.ndarray))
    for position, arg in enumerate(args):
        for key, value in arg.items() if isinstance(arg, dict) else ():
            if tracer.is_array(value):
                tracer.produced[id(value)] = trace.add("input", value, str(value.dtype), "input", leaf=key)
        if tracer.is_array(arg):
            tracer.produced[id(arg)] = trace.add(
                "input", arg, str(arg.dtype), "input", leaf=f"input{position}"
            )
    try:
        with jax.disable_jit(), tracer:
            fn(*args, **kwargs)
    except Exception as eager:
        if type(eager) is type(error) and str(eager) == str(error):
            return trace
    return Trace("jax")


def _run(closed: Any, arrays: Sequence[Any], names: Sequence[str], recorder: Any) -> list[tuple[Any, int]]:
    """Evaluate the closed jaxpr on ``arrays`` (its inputs, named ``names``) with ``recorder``."""
    env: dict[Any, tuple[Any, int]] = {}
    for var, array, name in zip(closed.jaxpr.invars, arrays, names, strict=True):
        env[var] = recorder.record("input", array, leaf=name, location="input")
    for var, const in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        env[var] = recorder.record("leaf", const, leaf="constant", location="constant")
    return _evaluate(closed.jaxpr, env, recorder, ())


def _cotangents(
    trace: Trace,
    closed: Any,
    arrays: Sequence[Any],
    names: Sequence[str],
    cotangent: Any,
    keep_masks: Sequence[np.ndarray] | None,
    drop_rates: Sequence[float | None] | None = None,
    kept_high: bool = True,
) -> None:
    """Fill ``trace.cotangents`` (and ``trace.custom_rules``) by the probing pass."""
    import jax
    import jax.numpy as jnp

    floating = [r for r in trace.records if r.value.dtype.kind == "f"]
    probes = {r.index: jnp.zeros(r.value.shape, r.value.dtype) for r in floating}
    probing = _Probing(probes, keep_masks, drop_rates, kept_high)
    output, backward = jax.vjp(lambda p: _run(closed, arrays, names, probing.reset(p))[0][0], probes)
    (grads,) = backward(jnp.asarray(cotangent, output.dtype))
    trace.cotangents = {index: np.asarray(grad) for index, grad in grads.items()}
    for index in probing.inside:
        trace.cotangents.pop(index, None)
    trace.custom_rules = dict(probing.computed)


_RANDOM = ("random_bits", "random_wrap", "random_seed", "random_fold_in", "random_split", "threefry2x32")


class _Recorder:
    """What both passes share: values computed from random bits are tracked (``random``), and a
    random boolean (a dropout keep-mask drawn by ``bernoulli`` or a ``uniform`` comparison) is
    replaced by the next of ``keep_masks`` (the reference's, True = kept) of its size, negated
    when the port's draw is a drop-mask: its share of True nearer the mask's rate ``p`` (from
    ``drop_rates``, else the reference's dropped share) than ``1 - p``. A draw whose share lies
    within ``dropout.share_bound`` of both (p near 0.5) cannot tell: it is taken as a keep-mask
    when ``kept_high``, as a drop-mask otherwise (``locate`` tries both)."""

    def __init__(
        self,
        keep_masks: Sequence[np.ndarray] | None,
        drop_rates: Sequence[float | None] | None = None,
        kept_high: bool = True,
    ) -> None:
        self.keep_masks, self.random = list(keep_masks or []), set()
        self.drop_rates = list(drop_rates) if drop_rates is not None else [None] * len(self.keep_masks)
        self.kept_high = kept_high
        self.loops: list[Loop] = []  # the scan iterations under way
        self.python: dict[int, tuple[Loop, ...]] = {}  # id(eqn) -> its Python loops (_python_loops)
        self.here: tuple[Loop, ...] = ()  # the Python loops of the equation evaluated

    def plain(self, name: str, values: list, sources: tuple[int, ...], stack: tuple) -> list[tuple[Any, int]]:
        random = name in _RANDOM or any(i in self.random for i in sources)
        if random:
            values = [self._injected(value) for value in values]
        outs = [self.record(name, value, sources, stack) for value in values]
        if random:
            self.random.update(i for _, i in outs)
        return outs

    def _injected(self, value: Any) -> Any:
        import jax.numpy as jnp

        if value.dtype != bool:
            return value
        found = next((i for i, m in enumerate(self.keep_masks) if m.size == value.size), None)
        if found is None:
            return value
        keep = self.keep_masks.pop(found).reshape(value.shape)
        rate = self.drop_rates.pop(found)
        dropped = 1 - keep.mean() if rate is None else rate
        drawn = float(np.mean(np.asarray(value)))
        bound = share_bound(value.size)
        if abs(drawn - dropped) <= bound and abs(drawn - (1 - dropped)) <= bound:  # it cannot tell
            return jnp.asarray(keep if self.kept_high else ~keep)
        return jnp.asarray(keep if abs(drawn - (1 - dropped)) <= abs(drawn - dropped) else ~keep)


class _Recording(_Recorder):
    """The capture pass: every value goes into ``trace`` (a PRNG key as its key data)."""

    def __init__(
        self,
        trace: Trace,
        keep_masks: Sequence[np.ndarray] | None = None,
        drop_rates: Sequence[float | None] | None = None,
        kept_high: bool = True,
    ) -> None:
        super().__init__(keep_masks, drop_rates, kept_high)
        self.trace = trace

    def record(
        self, op: str, value: Any, sources: tuple[int, ...] = (), stack: tuple = (), leaf=None, location="?"
    ) -> tuple[Any, int]:
        import jax

        dtype = str(value.dtype)
        key = jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)
        data = jax.random.key_data(value) if key else value
        data = np.asarray(data)  # JAX arrays are never updated: no copy
        index = self.trace.add(op, data, dtype, location, sources, leaf=leaf, stack=stack, copy=False)
        self.trace.records[index].loops = (*self.here, *self.loops)
        return value, index

    def custom_call(self, eqn: Any, invals: list, outs: list, first: int) -> list:
        return outs


class _Probing(_Recorder):
    """The gradient pass: the ``i``-th value recorded gets ``probes[i]`` added; a custom rule's call
    is bound whole (its own gradient rule applies): ``computed`` maps the records of its call to it,
    ``inside`` holds those that are not its results (no cotangent of their own)."""

    def __init__(
        self,
        probes: dict[int, Any],
        keep_masks: Sequence[np.ndarray] | None,
        drop_rates: Sequence[float | None] | None = None,
        kept_high: bool = True,
    ) -> None:
        self.masks, self.rates, self.high = keep_masks, drop_rates, kept_high
        self.reset(probes)

    def reset(self, probes: dict[int, Any]) -> _Probing:
        super().__init__(self.masks, self.rates, self.high)
        self.probes, self.count, self.inside, self.computed = probes, 0, set(), {}
        return self

    def record(
        self, op: str, value: Any, sources: tuple[int, ...] = (), stack: tuple = (), leaf=None, location="?"
    ) -> tuple[Any, int]:
        index, self.count = self.count, self.count + 1
        return self._probed(value, index), index

    def _probed(self, value: Any, index: int | None) -> Any:
        probe = self.probes.get(index)
        return value if probe is None else value + probe.astype(value.dtype)

    def custom_call(self, eqn: Any, invals: list, outs: list, first: int) -> list:
        if not eqn.primitive.name.startswith("custom"):
            return outs
        params = eqn.primitive.get_bind_params(eqn.params)
        values = eqn.primitive.bind(*[v for v, _ in invals], **params)
        values = values if eqn.primitive.multiple_results else [values]
        given = {i for _, i in invals}
        rule = CustomRule(
            eqn,
            tuple((None if i is not None else v, i) for v, i in invals),
            tuple(i for _, i in outs),
        )
        self.computed.update((i, rule) for i in range(first, self.count))
        self.inside.update(i for i in range(first, self.count) if i not in rule.outputs)
        return [
            (value if index in given else self._probed(value, index), index)
            for value, (_, index) in zip(values, outs, strict=True)
        ]


def _call_module(module: Any, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def _leaf_name(path: tuple[Any, ...], position: int) -> str:
    """A traced leaf's name from its path in ``(args, kwargs)``: a positional array -> ``input1``;
    a weight in a dict -> its key (``W_query.weight``), in a nested pytree its keys joined
    (``layers.0.attn.qkv.kernel``, a linen variable ``params.c_attn.kernel``); an NNX module's
    parameter -> its path (``query.kernel``)."""
    if len(path) == 2 and _key(path[0]) == "0":
        return f"input{_key(path[1])}"
    keys = []
    for entry in path[2:] if len(path) > 2 and _key(path[0]) == "0" else path:
        key = _key(entry)
        if key != "value":  # an NNX variable's value
            keys.append(key)
    return ".".join(keys) if keys else f"input{position}"


def _key(entry: Any) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _evaluate(
    jaxpr: Any, env: dict[Any, tuple[Any, int]], recorder: Any, caller: tuple[tuple[str, str], ...]
) -> list[tuple[Any, int]]:
    """Evaluate ``jaxpr`` with ``env`` (var -> (value, record index)) holding its inputs, each value
    going through ``recorder``; ``caller`` is the stack of the equation calling it."""
    from jax.extend.core import Literal

    def read(var):
        if isinstance(var, Literal):
            return var.val, None
        return env[var]

    outer = recorder.here  # a jaxpr traced once and called again: its caller's loops
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        stack = _stack(eqn, caller)
        recorder.here = recorder.python.get(id(eqn), outer)
        if name in _CALLS and _CALLS[name] in eqn.params:
            first = getattr(recorder, "count", 0)
            outs = _call(eqn.params[_CALLS[name]], invals, recorder, stack)
            outs = recorder.custom_call(eqn, invals, outs, first)
        elif name == "cond":
            branch = eqn.params["branches"][int(invals[0][0])]
            outs = _call(branch, invals[1:], recorder, stack)
        elif name == "scan":
            outs = _scan(eqn, invals, recorder, stack)
        else:
            values = eqn.primitive.bind(*[v for v, _ in invals], **eqn.params)
            values = values if eqn.primitive.multiple_results else [values]
            sources = tuple(i for _, i in invals if i is not None)
            outs = recorder.plain(name, values, sources, stack)
        for var, out in zip(eqn.outvars, outs, strict=True):
            env[var] = out
    recorder.here = outer
    return [read(v) for v in jaxpr.outvars]


def _call(
    called: Any, invals: list[tuple[Any, int]], recorder: Any, stack: tuple[tuple[str, str], ...]
) -> list[tuple[Any, int]]:
    """Evaluate a called jaxpr (closed or open) on the caller's values."""
    jaxpr, consts = (called.jaxpr, called.consts) if hasattr(called, "consts") else (called, [])
    env = dict(zip(jaxpr.invars, invals, strict=True))
    for var, const in zip(jaxpr.constvars, consts, strict=True):
        env[var] = recorder.record("leaf", const, leaf="constant", location="constant")
    return _evaluate(jaxpr, env, recorder, stack)


def _scan(
    eqn: Any, invals: list[tuple[Any, int]], recorder: Any, stack: tuple[tuple[str, str], ...]
) -> list[tuple[Any, int]]:
    """Run a scan's body once per iteration, recording each iteration's values."""
    import jax.numpy as jnp

    params = eqn.params
    n_consts, n_carry, length = params["num_consts"], params["num_carry"], params["length"]
    consts, carry, xs = invals[:n_consts], invals[n_consts : n_consts + n_carry], invals[n_consts + n_carry :]
    ys: list[list[tuple[Any, int]]] = []
    steps = range(length - 1, -1, -1) if params["reverse"] else range(length)
    line = int(stack[0][0].rsplit(":", 1)[1]) if stack else 0
    for step in steps:
        x_slices = [(value[step], index) for value, index in xs]
        recorder.loops.append(Loop(line, "scan", step))
        try:
            outs = _call(params["jaxpr"], [*consts, *carry, *x_slices], recorder, stack)
        finally:
            recorder.loops.pop()
        carry, y = outs[:n_carry], outs[n_carry:]
        ys.append(y)
    if params["reverse"]:
        ys.reverse()
    stacked = []
    for column in zip(*ys, strict=True) if ys else []:
        value = jnp.stack([v for v, _ in column])
        sources = tuple(i for _, i in column if i is not None)
        stacked.append(recorder.record("scan", value, sources, stack))
    return [*carry, *stacked]
