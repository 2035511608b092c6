"""Capture the arrays each line of a NumPy function produces, with no instrumentation in it.

``sys.settrace`` follows the user's own frames (not NumPy's, not the standard library's): after
each line runs, every local array that is new, rebound or updated in place (``x[mask] = ...``,
``x += 1``, read from the line's source) is recorded under that line. A line's inputs are the
arrays its names held before it ran (arrays in lists, tuples and dicts included), so the trace
keeps the dataflow between lines and across calls into the user's helpers. A write into part of an
array (``ctx[:, :, h * hd:(h + 1) * hd] = w @ v``) also records the part written (its index is
evaluated again after the line), and once writes have covered a whole array (a buffer from
``np.zeros`` filled head by head), the array's first value no longer feeds it: nothing of it is left.
"""

from __future__ import annotations

import ast
import functools
import linecache
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from parity_tests.locate.trace import Raised, Trace, is_user_file, split_result, user_stack

__all__ = ["capture_numpy"]


@dataclass(frozen=True)
class _Write:
    """``name[index] = value`` (or ``+=``): ``index`` compiled; ``modules`` the names whose functions
    the index calls (evaluated again only where each is a module); ``reads`` the names the written
    value is computed from (the array's own name only where the value reads it)."""

    name: str
    index: Any
    modules: frozenset[str]
    reads: frozenset[str]


def _names(*nodes: ast.AST) -> frozenset[str]:
    return frozenset(n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name))


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _write(node: ast.stmt) -> _Write | None:
    """The write into part of an array a one-target assignment makes, if it makes one; None where its
    index calls anything but a function of a module (``np.triu``) or ``slice``, or assigns."""
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    target = targets[0] if len(targets) == 1 else None
    if not isinstance(target, ast.Subscript) or not isinstance(target.value, ast.Name):
        return None
    nodes = list(ast.walk(target.slice))
    if any(isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.Lambda)) for n in nodes):
        return None
    calls = [n.func for n in nodes if isinstance(n, ast.Call)]
    plain = [f for f in calls if not isinstance(f, ast.Attribute)]
    roots = {_root(f) for f in calls if isinstance(f, ast.Attribute)}
    if None in roots or any(not isinstance(f, ast.Name) or f.id != "slice" for f in plain):
        return None
    index = compile(ast.Expression(target.slice), "<locate index>", "eval")
    own = {target.value.id} if isinstance(node, ast.AugAssign) else set()
    return _Write(target.value.id, index, frozenset(roots), _names(node.value, target.slice) | own)


@functools.lru_cache(maxsize=64)
def _statements(filename: str) -> dict[int, tuple[frozenset[str], frozenset[str], _Write | None]]:
    """line -> (names the statement starting there reads, names it updates in place, the write into
    part of an array it makes)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except SyntaxError:
        return {}
    table: dict[int, tuple[frozenset[str], frozenset[str], _Write | None]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        parts = [node]
        if isinstance(node, (ast.For, ast.While, ast.If, ast.With)):  # the header alone
            parts = [getattr(node, a) for a in ("iter", "test") if hasattr(node, a)]
            parts += [item.context_expr for item in getattr(node, "items", [])]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            parts = []
        augmented = node.target if isinstance(node, ast.AugAssign) else None
        reads = {  # a name assigned is not read (``x += 1`` reads ``x``; ``x[i] = ...`` loads it)
            n.id
            for part in parts
            for n in ast.walk(part)
            if isinstance(n, ast.Name) and (not isinstance(n.ctx, ast.Store) or n is augmented)
        }
        updated = set()
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                direct = isinstance(target, ast.Name)
                while isinstance(target, (ast.Subscript, ast.Attribute)):
                    target = target.value
                if isinstance(target, ast.Name) and (not direct or isinstance(node, ast.AugAssign)):
                    updated.add(target.id)
        for call in (n for part in parts for n in ast.walk(part) if isinstance(n, ast.Call)):
            updated.update(
                kw.value.id for kw in call.keywords if kw.arg == "out" and isinstance(kw.value, ast.Name)
            )
        write = _write(node) if isinstance(node, (ast.Assign, ast.AugAssign)) else None
        table[node.lineno] = (frozenset(reads), frozenset(updated), write)
    return table


def _is_array(value: Any) -> bool:
    """A NumPy array, or a JAX array (a JAX port run eagerly after it raised while traced, see
    ``capture_jax``)."""
    jax = sys.modules.get("jax")
    return isinstance(value, np.ndarray) or (jax is not None and isinstance(value, jax.Array))


def _arrays_in(value: Any) -> list[np.ndarray]:
    if _is_array(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if _is_array(v)]
    if isinstance(value, dict):
        return [v for v in value.values() if _is_array(v)]
    return []


_NOTHING: tuple[frozenset[str], frozenset[str], None] = (frozenset(), frozenset(), None)


class _LineRecorder:
    def __init__(self, trace: Trace):
        self.trace = trace
        self.produced: dict[int, int] = {}  # id(array) -> record index
        self.alive: list[Any] = []
        self.frames: dict[Any, tuple[int | None, dict[str, list[int]]]] = {}
        # id(array) -> (its record before the first write into part of it, the record of that
        # write, the entries written since), until the writes cover it
        self.filling: dict[int, tuple[int, int, np.ndarray]] = {}

    def known(self, array: np.ndarray, location: str) -> int:
        if id(array) not in self.produced:
            self.produced[id(array)] = self.trace.add(
                "leaf", array, array.dtype.name, location, leaf="constant"
            )
            self.alive.append(array)
        return self.produced[id(array)]

    def snapshot(self, frame: Any) -> dict[str, list[int]]:
        return {name: [id(a) for a in _arrays_in(v)] for name, v in frame.f_locals.items() if _arrays_in(v)}

    def global_trace(self, frame: Any, event: str, arg: Any):
        if event != "call" or not is_user_file(frame.f_code.co_filename):
            return None
        for value in frame.f_locals.values():  # arguments: arrays from the caller, or leaves
            for array in _arrays_in(value):
                self.known(array, f"{frame.f_code.co_filename}:{frame.f_lineno}")
        self.frames[frame] = (None, self.snapshot(frame))
        return self.local_trace

    def local_trace(self, frame: Any, event: str, arg: Any):
        if event not in ("line", "return"):
            return self.local_trace
        line, before = self.frames[frame]
        if line is not None:
            self.after_line(frame, line, before)
        if event == "return":
            reads = _statements(frame.f_code.co_filename).get(frame.f_lineno, _NOTHING)[0]
            sources = self.sources(reads, self.snapshot(frame), frame)  # what the return line read
            for array in _arrays_in(arg):
                if id(array) not in self.produced:
                    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                    self.record(array, frame, frame.f_lineno, sources, text)
            del self.frames[frame]
            return None
        self.frames[frame] = (frame.f_lineno, self.snapshot(frame))
        return self.local_trace

    def sources(self, reads: frozenset[str], before: dict[str, list[int]], frame: Any) -> tuple[int, ...]:
        ids = [i for name in reads for i in before.get(name, [])]
        ids += [id(a) for name in reads if name not in before for a in _arrays_in(frame.f_globals.get(name))]
        return tuple(dict.fromkeys(self.produced[i] for i in ids if i in self.produced))

    def record(self, array: np.ndarray, frame: Any, line: int, sources: tuple[int, ...], op: str) -> None:
        frames, outer = [(frame.f_code.co_filename, line, frame.f_code.co_name)], frame.f_back
        while outer is not None:
            frames.append((outer.f_code.co_filename, outer.f_lineno, outer.f_code.co_name))
            outer = outer.f_back
        self.produced[id(array)] = self.trace.add(
            op, array, array.dtype.name, "?", sources, stack=user_stack(frames)
        )
        self.alive.append(array)

    def after_line(self, frame: Any, line: int, before: dict[str, list[int]]) -> None:
        filename = frame.f_code.co_filename
        reads, updated, write = _statements(filename).get(line, _NOTHING)
        sources = self.sources(reads, before, frame)
        source_text = linecache.getline(filename, line).strip()
        for name, value in frame.f_locals.items():
            for array in _arrays_in(value):
                new = id(array) not in self.produced
                if new or (name in updated and id(array) in before.get(name, [])):
                    if write is not None and name == write.name and not new:
                        self.record_write(array, frame, line, write, before, source_text)
                    else:
                        self.record(array, frame, line, sources, source_text)

    def record_write(
        self, array: np.ndarray, frame: Any, line: int, write: _Write, before: dict, text: str
    ) -> None:
        """Record a write into part of ``array``: the part written (from what the assigned value
        reads), then the array (from its previous value and that part). The array's value before
        the first such write stops feeding it once the writes have covered every entry."""
        previous = self.produced[id(array)]
        scope = {**frame.f_globals, **frame.f_locals}
        try:
            if not all(isinstance(scope.get(m), types.ModuleType) for m in write.modules):
                raise LookupError(write.modules)
            index = eval(write.index, scope)  # the user's own index, checked by _write
            written = np.zeros(array.shape, dtype=bool)
            written[index] = True
            part = np.array(array[index])  # a copy of its own, kept alive by record
        except Exception:  # an index that cannot be evaluated again: the whole line's reads
            self.record(array, frame, line, self.sources(write.reads | {write.name}, before, frame), text)
            return
        self.record(part, frame, line, self.sources(write.reads, before, frame), text)
        self.record(array, frame, line, (previous, self.produced[id(part)]), text)
        self.trace.records[-1].written = self.produced[id(part)]
        base, first, covered = self.filling.get(id(array), (previous, self.produced[id(array)], written))
        covered = covered | written
        if covered.all():
            record = self.trace.records[first]
            record.inputs = tuple(i for i in record.inputs if i != base)
            self.filling.pop(id(array), None)
        else:
            self.filling[id(array)] = (base, first, covered)


class _KeepMaskGenerator(np.random.Generator):
    """A ``Generator`` whose uniform draws (``random``) of a keep-mask's size make that mask: kept
    entries draw ``1 - 2**-24`` and dropped ones 0 when ``kept_high`` (a port keeping
    ``u >= p``), the other way round otherwise (a port keeping ``u < 1 - p``);
    ``binomial(1, q, size)`` gives the mask itself. Other draws come from the generator it
    replaces, whose stream it shares."""

    def __init__(self, base: np.random.Generator, masks: Sequence[np.ndarray], kept_high: bool) -> None:
        super().__init__(base.bit_generator)
        self.masks, self.kept_high = list(masks), kept_high

    def _mask(self, size: Any) -> np.ndarray | None:
        shape = (size,) if isinstance(size, int) else tuple(size or ())
        found = next((i for i, m in enumerate(self.masks) if m.size == int(np.prod(shape))), None)
        return None if found is None else self.masks.pop(found).reshape(shape)

    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        keep = self._mask(size) if out is None else None
        if keep is None:
            return super().random(size, dtype, out)
        high, low = 1 - 2.0**-24, 0.0
        return np.where(keep, *((high, low) if self.kept_high else (low, high))).astype(dtype)

    def binomial(self, n: Any, p: Any, size: Any = None) -> Any:
        keep = self._mask(size) if np.all(np.asarray(n) == 1) else None
        return super().binomial(n, p, size) if keep is None else keep.astype(np.int64)


def _with_keep_masks(fn: Any, args: Sequence[Any], masks: Sequence[np.ndarray], kept_high: bool) -> tuple:
    """``(fn, args)`` with every ``np.random.Generator`` among the arguments (a partial's
    included) replaced by a ``_KeepMaskGenerator`` drawing ``masks``."""

    def swap(value: Any) -> Any:
        replace = isinstance(value, np.random.Generator)
        return _KeepMaskGenerator(value, masks, kept_high) if replace else value

    if isinstance(fn, functools.partial):
        fn = functools.partial(fn.func, *map(swap, fn.args), **{k: swap(v) for k, v in fn.keywords.items()})
    return fn, [swap(arg) for arg in args]


def capture_numpy(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    keep_masks: Sequence[np.ndarray] | None = None,
    kept_high: bool = True,
) -> Trace:
    """Run ``fn(*args, **kwargs)`` under ``sys.settrace``, recording the arrays each of the user's
    lines produces; leaves ``input0``, ``input1``... are the positional array arguments (a dict of
    arrays, the weights, gives one leaf per key). With ``keep_masks`` (a torch reference's dropout
    keep-masks), a ``Generator`` passed to ``fn`` draws them (see ``_KeepMaskGenerator``). An
    exception ``fn`` raises comes as ``Raised``, with the arrays recorded before it."""
    if keep_masks:
        fn, args = _with_keep_masks(fn, args, keep_masks, kept_high)
    trace = Trace("numpy")
    recorder = _LineRecorder(trace)
    for position, arg in enumerate(args):
        if isinstance(arg, dict):
            for key, value in arg.items():
                if _is_array(value):
                    recorder.produced[id(value)] = trace.add(
                        "input", value, value.dtype.name, "input", leaf=key
                    )
        elif _is_array(arg):
            recorder.produced[id(arg)] = trace.add(
                "input", arg, arg.dtype.name, "input", leaf=f"input{position}"
            )
    previous = sys.gettrace()
    sys.settrace(recorder.global_trace)
    try:
        result = fn(*args, **kwargs)
    except Exception as error:
        raise Raised(error, trace) from error
    finally:
        sys.settrace(previous)
    output, steps = split_result(result)
    output = np.asarray(output)
    trace.output = recorder.known(output, "output")
    trace.name_steps({k: v for k, v in steps.items() if k != "output"})
    return trace
