"""NumPy arrays that record every operation made on them: the capture of a NumPy port.

A ``TracedArray`` is an ``np.ndarray`` whose ufuncs (``+``, ``@``, ``np.exp``, ``x.sum()``),
array functions (``np.where``, ``np.split``, ``np.einsum``, ``np.stack``), methods (``reshape``,
``.T``, ``astype``) and indexing (``x[i]``, ``x[mask] = -np.inf``) each add a record to the
trace: the value, the records it was computed from, the user's line (the innermost frame of the
user's code) and the loops that line runs in. So every sub-expression of a line is seen, in nested
calls, comprehensions and loops alike, without a change to the port. The result is a
``TracedArray`` again (a NumPy scalar stays a scalar). A plain array meeting a traced one (a
constant made before the capture, ``np.asarray`` of a traced array) is taken for what it is: the
traced array it views, else a constant. Array creation in the user's code (``np.ones``,
``np.arange``, ``np.zeros``...) is patched for the capture (``creating``), so constants built there
(a causal mask) are records of their own line.

A write into part of an array (``ctx[:, :, h * hd:(h + 1) * hd] = w @ vh``) records the array
again, computed from its previous value and the part written (``Record.written``); once writes
have covered a whole array (a buffer from ``np.zeros`` filled head by head), its first value no
longer feeds it.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from parity_tests.locate.lines import LineTracer, frames_of
from parity_tests.locate.trace import Trace, is_user_file, user_frames

__all__ = ["Recorder", "TracedArray", "creating"]

_ACTIVE: list[Recorder] = []  # the recorder of the capture under way

# ndarray methods computed in C (no ufunc, no array function): recorded as one operation each
_METHODS = (
    "reshape", "transpose", "swapaxes", "squeeze", "flatten", "ravel", "astype", "copy", "dot",
    "repeat", "take", "sum", "mean", "var", "std", "max", "min", "prod", "cumsum", "argmax",
    "argmin", "clip", "round", "all", "any", "diagonal", "conj", "fill", "sort",
)  # fmt: skip
_IN_PLACE = ("fill", "sort")
# array creation patched in ``numpy`` while a capture runs (called from the user's code)
_CREATORS = (
    "zeros", "ones", "empty", "full", "arange", "eye", "identity", "tri", "linspace", "array",
    "asarray", "ascontiguousarray",
)  # fmt: skip
_CONVERTERS = ("array", "asarray", "ascontiguousarray")  # a library's conversion keeps a traced array traced
_NOT_LIBRARIES = (os.path.dirname(np.__file__), os.path.dirname(os.path.dirname(__file__)))  # NumPy, this


def _plain(value: Any) -> Any:
    """``value`` with every traced array in it (in lists, tuples, dicts) as a plain ndarray."""
    if isinstance(value, TracedArray):
        return value.view(np.ndarray)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _arrays(value: Any) -> list[np.ndarray]:
    """The ndarrays in ``value`` (in lists, tuples, dicts), in order."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays(v)]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays(v)]
    return []


class TracedArray(np.ndarray):
    """An ndarray recording what is computed from it while a capture is active."""

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:
            return getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs))
        return _ACTIVE[-1].ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Callable, types: Any, args: Any, kwargs: Any) -> Any:
        if not _ACTIVE:
            return func(*_plain(args), **_plain(kwargs))
        return _ACTIVE[-1].call(func.__name__, func, args, kwargs)

    def __getitem__(self, key: Any) -> Any:
        if not _ACTIVE:
            return self.view(np.ndarray)[_plain(key)]
        return _ACTIVE[-1].call("getitem", lambda a, k: a[k], (self, key), {})

    def __setitem__(self, key: Any, value: Any) -> None:
        if not _ACTIVE:
            self.view(np.ndarray)[_plain(key)] = _plain(value)
            return
        _ACTIVE[-1].setitem(self, key, value)

    @property
    def T(self) -> Any:
        return self.transpose()

    @property
    def mT(self) -> Any:
        return self.swapaxes(-1, -2)


def _method(name: str) -> Callable[..., Any]:
    function = getattr(np.ndarray, name)

    def method(self: TracedArray, *args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:
            return function(self.view(np.ndarray), *_plain(args), **_plain(kwargs))
        if name in _IN_PLACE:
            return _ACTIVE[-1].in_place(name, function, self, args, kwargs)
        return _ACTIVE[-1].call(name, function, (self, *args), kwargs)

    method.__name__ = name
    return method


for _name in _METHODS:
    setattr(TracedArray, _name, _method(_name))


class Recorder:
    """Adds the records of one capture to ``trace``; ``lines`` gives each record its loops."""

    def __init__(self, trace: Trace, lines: LineTracer) -> None:
        self.trace, self.lines = trace, lines
        self.produced: dict[int, int] = {}  # id(array) -> its latest record
        self.alive: list[Any] = []  # every recorded array, so that ids stay unique
        self.views: dict[tuple, int] = {}  # (address, shape, strides, dtype) -> record
        # id(array) -> (its record before the first write into part of it, the record of that
        # write, the entries written since), until the writes cover it
        self.filling: dict[int, tuple[int, int, np.ndarray]] = {}

    @contextlib.contextmanager
    def active(self) -> Iterator[Recorder]:
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.pop()

    # --- records ----------------------------------------------------------------------------

    def leaf(self, array: np.ndarray, name: str) -> TracedArray:
        """``array`` as a traced leaf named ``name`` (an input, a weight)."""
        traced = np.asarray(array).view(TracedArray)
        self._keep(traced, self.trace.add("input", array, array.dtype.name, "input", leaf=name))
        return traced

    def _keep(self, array: np.ndarray, index: int) -> int:
        self.produced[id(array)] = index
        self.alive.append(array)
        info = array.__array_interface__
        self.views[(info["data"][0], array.shape, info["strides"], array.dtype.str)] = index
        return index

    def _add(self, array: np.ndarray, call: str, sources: tuple[int, ...]) -> int:
        frames = user_frames(frames_of(1))
        stack = tuple((f"{f.f_code.co_filename}:{f.f_lineno}", f.f_code.co_name) for f in frames)
        text = linecache.getline(frames[0].f_code.co_filename, frames[0].f_lineno).strip() if frames else call
        index = self.trace.add(text, array, array.dtype.name, "?", sources, stack=stack)
        record = self.trace.records[index]
        record.call, record.loops = call, self.lines.iterations(frames)
        record.calls = self.lines.call_ids(frames)
        return self._keep(array, index)

    def index_of(self, array: np.ndarray) -> int:
        """The record of ``array``: its own, the traced array it views, or a new constant."""
        if id(array) in self.produced:
            return self.produced[id(array)]
        info = array.__array_interface__
        key = (info["data"][0], array.shape, info["strides"], array.dtype.str)
        if key in self.views:
            return self.views[key]
        frames = user_frames(frames_of(1))
        location = f"{frames[0].f_code.co_filename}:{frames[0].f_lineno}" if frames else "constant"
        index = self.trace.add("leaf", array, array.dtype.name, location, leaf="constant")
        self.produced[id(array)] = index
        self.alive.append(array)
        return index

    def _sources(self, *values: Any) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.index_of(a) for v in values for a in _arrays(v)))

    def _wrap(self, result: Any, call: str, sources: tuple[int, ...]) -> Any:
        if isinstance(result, np.ndarray):
            traced = result.view(TracedArray)
            self._add(traced, call, sources)
            return traced
        if isinstance(result, (list, tuple)) and not hasattr(result, "_fields"):
            return type(result)(self._wrap(v, call, sources) for v in result)
        return result

    # --- operations -------------------------------------------------------------------------

    def call(self, name: str, function: Callable, args: Any, kwargs: Any) -> Any:
        """A function or method of arrays: its results recorded, computed from every array in
        its arguments (an array passed as ``out=`` updated in place)."""
        out = kwargs.get("out")
        sources = self._sources(args, {k: v for k, v in kwargs.items() if k != "out"})
        result = function(*_plain(args), **_plain(kwargs))
        if out is not None:
            return self._updated(out, name, sources)
        return self._wrap(result, name, sources)

    def ufunc(self, ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        return self.call(name, getattr(ufunc, method), inputs, kwargs)

    def _updated(self, out: Any, name: str, sources: tuple[int, ...]) -> Any:
        """The arrays of ``out`` after an operation wrote into them: recorded anew."""
        for array in _arrays(out):
            self._add(array, name, sources)
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out

    def in_place(self, name: str, function: Callable, array: TracedArray, args: Any, kwargs: Any) -> None:
        sources = self._sources(array, args, kwargs)
        function(array.view(np.ndarray), *_plain(args), **_plain(kwargs))
        self._add(array, name, sources)

    def setitem(self, array: np.ndarray, key: Any, value: Any) -> None:
        """``array[key] = value``: the part written (the value's own record where it fills the part
        as it is), then the array, computed from its previous value and that part."""
        previous = self.index_of(array)
        plain = array.view(np.ndarray)
        index = _plain(key)
        plain[index] = _plain(value)
        part = plain[index]
        if isinstance(value, np.ndarray) and value.shape == np.shape(part) and id(value) in self.produced:
            written = self.produced[id(value)]
        else:
            copy = np.array(part).view(TracedArray)
            written = self._add(copy, "setitem", self._sources(value, key))
        self._add(array, "setitem", (previous, written))
        self.trace.records[-1].written = written
        covered = np.zeros(array.shape, dtype=bool)
        covered[index] = True
        base, first, before = self.filling.get(id(array), (previous, self.produced[id(array)], covered))
        covered |= before
        if covered.all():
            record = self.trace.records[first]
            record.inputs = tuple(i for i in record.inputs if i != base)
            self.filling.pop(id(array), None)
        else:
            self.filling[id(array)] = (base, first, covered)

    def create(self, name: str, function: Callable, args: Any, kwargs: Any) -> Any:
        """A patched creator called from the user's code: a constant of its line, or (``np.array``
        of traced arrays) a value computed from them; ``np.asarray`` of a traced array of its
        dtype is that array."""
        sources = self._sources(args, kwargs)
        result = function(*_plain(args), **_plain(kwargs))
        if name in ("asarray", "ascontiguousarray") and len(sources) == 1:
            given = _arrays(args)[0]
            if isinstance(given, TracedArray) and result.dtype == given.dtype and result.shape == given.shape:
                return given
        return self._wrap(result, name, sources)


@contextlib.contextmanager
def creating(recorder: Recorder) -> Iterator[None]:
    """Patch NumPy's array creators while the capture runs: called from the user's code, their
    results are traced (see ``Recorder.create``); called from anywhere else, they are NumPy's."""
    originals = {name: getattr(np, name) for name in _CREATORS}

    def patched(name: str) -> Callable[..., Any]:
        function = originals[name]

        def create(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            converts = name in _CONVERTERS and isinstance(args[:1] and args[0], TracedArray)
            converts = converts and not caller.startswith(_NOT_LIBRARIES)  # a library: SciPy's softmax...
            if not _ACTIVE or not (converts or is_user_file(caller)):
                return function(*args, **kwargs)
            return recorder.create(name, function, args, kwargs)

        return create

    for name in _CREATORS:
        setattr(np, name, patched(name))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(np, name, function)
