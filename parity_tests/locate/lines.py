"""Follow the user's own frames line by line: which iteration of which loop each line runs in.

``LineTracer`` is a ``sys.settrace`` hook on the user's frames only (never NumPy's, JAX's or the
standard library's). A ``for`` statement's iteration is counted from its header's line events
(the loop is entered when the line before is outside its body, and goes round when it is inside);
a comprehension's (its own frame) is read from its iterator's position. ``iterations(frame)`` gives,
for each user frame of a call stack, the loops its current line is in: ``h = 1`` for an integer
loop variable, ``ids #0`` otherwise, with the loop's line.

With ``record``, it also records every array a line binds to a local name that is new or
rebound (JAX arrays of a port run eagerly after it raised while traced, see ``capture_jax``).
``LoopLog`` logs the loops of every line in the order the lines run (a JAX port's Python loops,
unrolled when it is traced, see ``capture_jax``).
"""

from __future__ import annotations

import ast
import dis
import functools
import linecache
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parity_tests.locate.trace import Trace, is_user_file, user_stack

__all__ = ["LineTracer", "Loop", "LoopLog", "frames_of"]

_COMPREHENSIONS = ("<listcomp>", "<genexpr>", "<setcomp>", "<dictcomp>")
_FOR_ITER = dis.opmap["FOR_ITER"]


@dataclass(frozen=True)
class Loop:
    """One loop a value was computed in: ``line`` its ``for`` (or comprehension) line, ``target``
    the loop variable's source text, ``index`` the iteration (from 0), ``value`` the loop
    variable's value where it is an integer (``for h in range(n)``)."""

    line: int
    target: str
    index: int
    value: int | None = None

    def __str__(self) -> str:
        if self.value is not None:
            return f"{self.target} = {self.value} (line {self.line})"
        return f"{self.target} #{self.index} (line {self.line})"


@dataclass(frozen=True)
class _ForLoop:
    header: frozenset[int]  # the lines of ``for target in iter:``
    body: tuple[int, int]  # first and last line of the body (``else`` included)
    target: str


@functools.lru_cache(maxsize=256)
def _loops(filename: str) -> tuple[tuple[_ForLoop, ...], dict[int, str]]:
    """The ``for`` loops of a file, and each comprehension's loop variable by its line."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return (), {}
    loops, comprehensions = [], {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            first = node.body[0].lineno
            last = max(getattr(n, "end_lineno", n.lineno) or n.lineno for n in [*node.body, *node.orelse])
            header = frozenset(range(node.lineno, first)) or frozenset({node.lineno})
            loops.append(_ForLoop(header, (first, last), ast.unparse(node.target)))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            comprehensions.setdefault(node.lineno, ast.unparse(node.generators[0].target))
    return tuple(loops), comprehensions


def _position(iterator: Any) -> int | None:
    """How many items ``iterator`` has given (a list, tuple, range or array iterator, or ``zip``,
    ``enumerate`` or ``map`` over one), from its pickling state; None where it does not say."""
    try:
        reduced = iterator.__reduce__()
    except Exception:
        return None
    if not isinstance(reduced, tuple) or len(reduced) < 2:
        return None
    if len(reduced) >= 3 and isinstance(reduced[2], int):
        return reduced[2]
    function, arguments = reduced[0], reduced[1]
    if function is enumerate and len(arguments) == 2 and isinstance(arguments[1], int):
        return arguments[1]
    if function is zip and arguments:
        return _position(arguments[0])
    if function is map and len(arguments) > 1:
        return _position(arguments[1])
    return None


def frames_of(skip: int = 1) -> list[Any]:
    """The frames calling this one (``skip`` of them left out), innermost first."""
    return [sys._getframe(skip), *_callers(sys._getframe(skip))]


def _callers(frame: Any) -> list[Any]:
    callers, frame = [], frame.f_back
    while frame is not None:
        callers.append(frame)
        frame = frame.f_back
    return callers


class LineTracer:
    """The ``sys.settrace`` hook; use as a context manager around the user's call."""

    def __init__(self, record: Trace | None = None) -> None:
        self.counts: dict[Any, dict[frozenset[int], int]] = {}  # frame -> loop header -> iteration
        self.ids: dict[Any, int] = {}  # frame -> the number of its call (a generator's: of its resumption)
        self.called = 0
        self.last: dict[Any, int] = {}  # frame -> its previous line
        self.trace = record
        self.produced: dict[int, int] = {}  # id(array) -> record index (with ``record``)
        self.alive: list[Any] = []
        self.before: dict[Any, tuple[int, dict[str, list[int]]]] = {}
        self.is_array: Callable[[Any], bool] = lambda value: False

    def __enter__(self) -> LineTracer:
        self.previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self.previous)

    def _call(self, frame: Any, event: str, arg: Any) -> Callable | None:
        if event != "call" or not is_user_file(frame.f_code.co_filename):
            return None
        self.ids[frame], self.called = self.called, self.called + 1
        if self.trace is not None:
            self._arguments(frame)
        return self._line

    def _line(self, frame: Any, event: str, arg: Any) -> Callable | None:
        if event == "line":
            self._count(frame)
            if self.trace is not None:
                self._after_line(frame)
                self.before[frame] = (frame.f_lineno, self._snapshot(frame))
        elif event == "return":
            if self.trace is not None:
                self._after_line(frame)
                self._returned(frame, arg)
            for table in (self.counts, self.last, self.before, self.ids):
                table.pop(frame, None)
            return None
        return self._line

    def _count(self, frame: Any) -> None:
        line, previous = frame.f_lineno, self.last.get(frame)
        self.last[frame] = line
        for loop in _loops(frame.f_code.co_filename)[0]:
            if line in loop.header:
                counts = self.counts.setdefault(frame, {})
                inside = previous is not None and loop.body[0] <= previous <= loop.body[1]
                counts[loop.header] = counts.get(loop.header, -1) + 1 if inside else 0

    def call_ids(self, frames: list[Any]) -> tuple[int, ...]:
        """The number of each frame's call (-1 for a frame entered before the tracer started)."""
        return tuple(self.ids.get(frame, -1) for frame in frames)

    def iterations(self, frames: list[Any]) -> tuple[Loop, ...]:
        """The loops the user's frames among ``frames`` (innermost first) run their lines in,
        outermost first."""
        found: list[Loop] = []
        for frame in frames:
            filename = frame.f_code.co_filename
            if not is_user_file(filename):
                continue
            loops, comprehensions = _loops(filename)
            line, here = frame.f_lineno, []
            if frame.f_code.co_name in _COMPREHENSIONS:
                position = _position(frame.f_locals.get(".0"))
                target = comprehensions.get(frame.f_code.co_firstlineno, "item")
                if position is not None:  # fetching the next item (an array's row): not yet counted
                    fetching = frame.f_code.co_code[frame.f_lasti] == _FOR_ITER
                    here.append(Loop(frame.f_code.co_firstlineno, target, position - 1 + fetching))
            else:
                counts = self.counts.get(frame, {})
                for loop in loops:
                    if loop.body[0] <= line <= loop.body[1] and loop.header in counts:
                        value = frame.f_locals.get(loop.target)
                        value = value if isinstance(value, int) and not isinstance(value, bool) else None
                        here.append(Loop(min(loop.header), loop.target, counts[loop.header], value))
            found = sorted(here, key=lambda loop: loop.line) + found
        return tuple(found)

    # --- recording the arrays of each line (``record``) ---------------------------------------

    def _snapshot(self, frame: Any) -> dict[str, list[int]]:
        return {name: [id(a) for a in self._arrays(v)] for name, v in frame.f_locals.items()}

    def _arrays(self, value: Any) -> list[Any]:
        if self.is_array(value):
            return [value]
        if isinstance(value, (list, tuple)):
            return [v for v in value if self.is_array(v)]
        if isinstance(value, dict):
            return [v for v in value.values() if self.is_array(v)]
        return []

    def known(self, array: Any, location: str) -> int:
        if id(array) not in self.produced:
            self.produced[id(array)] = self.trace.add(
                "leaf", array, str(array.dtype), location, leaf="constant"
            )
            self.alive.append(array)
        return self.produced[id(array)]

    def _arguments(self, frame: Any) -> None:
        for value in frame.f_locals.values():  # arrays from the caller, or leaves
            for array in self._arrays(value):
                self.known(array, f"{frame.f_code.co_filename}:{frame.f_lineno}")
        self.before[frame] = (0, self._snapshot(frame))

    def _record(self, array: Any, frame: Any, line: int, sources: tuple[int, ...]) -> None:
        frames = [(frame.f_code.co_filename, line, frame.f_code.co_name)]
        frames += [(f.f_code.co_filename, f.f_lineno, f.f_code.co_name) for f in _callers(frame)]
        text = linecache.getline(frame.f_code.co_filename, line).strip()
        index = self.trace.add(text, array, str(array.dtype), "?", sources, stack=user_stack(frames))
        self.produced[id(array)] = index
        self.alive.append(array)

    def _after_line(self, frame: Any) -> None:
        line, before = self.before.get(frame, (0, {}))
        if not line:
            return
        reads = _reads(frame.f_code.co_filename).get(line, frozenset())
        ids = [i for name in reads for i in before.get(name, [])]
        sources = tuple(dict.fromkeys(self.produced[i] for i in ids if i in self.produced))
        for value in frame.f_locals.values():
            for array in self._arrays(value):
                if id(array) not in self.produced:
                    self._record(array, frame, line, sources)

    def _returned(self, frame: Any, value: Any) -> None:
        for array in self._arrays(value):
            if id(array) not in self.produced:
                self._record(array, frame, frame.f_lineno, ())


@functools.lru_cache(maxsize=64)
def _reads(filename: str) -> dict[int, frozenset[str]]:
    """line -> the names the statement starting there reads (a loop's or ``with``'s header alone)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return {}
    table: dict[int, frozenset[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        parts = [node]
        if isinstance(node, (ast.For, ast.While, ast.If, ast.With)):
            parts = [getattr(node, a) for a in ("iter", "test") if hasattr(node, a)]
            parts += [item.context_expr for item in getattr(node, "items", [])]
        names = {
            n.id
            for part in parts
            for n in ast.walk(part)
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)
        }
        table[node.lineno] = frozenset(names)
    return table


class LoopLog(LineTracer):
    """A ``LineTracer`` logging, for each line of the user's that runs, ``("path:line", loops)`` in
    ``runs``, in the order the lines run (``loops`` as ``iterations`` gives them)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[str, tuple[Loop, ...]]] = []

    def _line(self, frame: Any, event: str, arg: Any) -> Callable | None:
        hook = super()._line(frame, event, arg)
        if event == "line":
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            self.runs.append((where, self.iterations([frame, *_callers(frame)])))
        return hook
