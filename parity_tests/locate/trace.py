"""What a capture records: every intermediate value of one run, with its line and its inputs."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CustomRule",
    "Exited",
    "Raised",
    "Record",
    "Trace",
    "cotangent_for",
    "exits_raise",
    "is_user_file",
    "model_stack",
    "split_result",
    "user_frames",
    "user_stack",
]

_LIBRARY_DIRS = tuple(
    os.path.realpath(p) + os.sep
    for p in {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
)
_PARITY_TESTS = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
# the frameworks' own packages: code in other installed packages (transformers' models) is model code
_FRAMEWORKS = (
    "torch",
    "torchgen",
    "functorch",
    "numpy",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "scipy",
    "ml_dtypes",
)


def _package_dirs(names: tuple[str, ...]) -> tuple[str, ...]:
    """The folders the packages ``names`` are imported from, where they are installed (found, not
    imported): a framework on another path than this interpreter's site-packages is one still."""
    dirs = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        dirs += [os.path.realpath(path) + os.sep for path in (spec and spec.submodule_search_locations) or ()]
    return tuple(dirs)


_FRAMEWORK_DIRS = _package_dirs(_FRAMEWORKS)
# the project's own layers, the user's code wherever they are installed (editable or not)
_PROJECT_DIRS = tuple(
    os.path.join(os.path.dirname(_PARITY_TESTS.rstrip(os.sep)), name) + os.sep
    for name in ("torch_ref", "numpy_attn", "jax_attn")
)
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep


def user_stack(frames: Any) -> tuple[tuple[str, str], ...]:
    """``("path:line", function)`` of the user's frames among ``frames`` (``(path, line, function)``,
    innermost first), up to the capture's own call: the harness that called ``locate`` is not the
    port's."""
    stack = []
    for path, line, function in frames:
        if _is_checker(path):
            break
        if is_user_file(path):
            stack.append((f"{path}:{line}", function))
    return tuple(stack)


def model_stack(frames: Any) -> tuple[tuple[str, str], ...]:
    """``user_stack``, or where the user wrote none of the frames (a reference from an installed
    package, such as transformers' GPT-2), the frames of model code: any but the standard
    library's, the frameworks' own (torch, JAX, Flax, NumPy) and ``parity_tests``'."""
    frames = list(frames)
    stack = user_stack(frames)
    if stack:
        return stack
    found = []
    for path, line, function in frames:
        if _is_checker(path):
            break
        if _is_model_file(path):
            found.append((f"{path}:{line}", function))
    return tuple(found)


@functools.lru_cache(maxsize=4096)
def _is_model_file(path: str) -> bool:
    if path.startswith("<"):
        return False
    real = os.path.realpath(path)
    return not real.startswith(_FRAMEWORK_DIRS) and not real.startswith(_STDLIB) and not _is_checker(path)


def user_frames(frames: list[Any]) -> list[Any]:
    """The user's frames among ``frames`` (frame objects, innermost first): from the first one in
    the user's code (past the capture's own frames and the libraries' it was called from) up to the
    capture's own call, library frames left out."""
    start = next((i for i, f in enumerate(frames) if is_user_file(f.f_code.co_filename)), len(frames))
    found = []
    for frame in frames[start:]:
        path = frame.f_code.co_filename
        if _is_checker(path):
            break
        if is_user_file(path):
            found.append(frame)
    return found


@functools.lru_cache(maxsize=4096)
def _is_checker(path: str) -> bool:
    return os.path.realpath(path).startswith(_PARITY_TESTS)


@functools.lru_cache(maxsize=4096)
def is_user_file(path: str) -> bool:
    """True for code a user wrote (their port, the project's own packages); False for the standard
    library, installed packages (torch, jax, flax, numpy) and ``parity_tests`` itself."""
    if path.startswith("<") and path != "<stdin>":
        return False
    real = os.path.realpath(path)
    if real.startswith(_PROJECT_DIRS):
        return True
    return not real.startswith(_LIBRARY_DIRS) and not real.startswith(_PARITY_TESTS)


class Exited(BaseException):
    """``os._exit(code)`` called while a capture ran (``exits_raise``): the process goes on."""

    def __init__(self, code: int) -> None:
        super().__init__(f"os._exit({code})")
        self.code = code


@contextlib.contextmanager
def exits_raise() -> Iterator[None]:
    """While it runs, ``os._exit`` raises ``Exited`` instead of ending the process: a port calling
    it is a port that failed, at its line (``sys.exit`` raises ``SystemExit`` already)."""
    original = os._exit

    def exit_(code: int) -> None:
        raise Exited(code)

    os._exit = exit_
    try:
        yield
    finally:
        os._exit = original


class Raised(Exception):
    """A captured callable raised ``error`` (``type: message`` is this exception's text);
    ``trace`` holds the values it computed before (for JAX, which traces the whole function before
    it evaluates anything, those of an eager run raising the same; none where that run does not)."""

    def __init__(self, error: BaseException, trace: Trace) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error, self.trace = error, trace


@dataclass
class Record:
    """One value a run produced (or read: a leaf).

    ``value`` is a NumPy copy (half precision as float32, else as it was); ``dtype`` the name
    of the dtype it had; ``location`` ``"path:line"`` of the user's line that produced it;
    ``inputs`` the indexes of the records it was computed from; ``leaf`` names what a leaf is
    (``"input0"``, a parameter's name, ``"constant"``), None for computed values; ``step`` the
    project's step name when the code recorded the value under one; ``stack`` the user's frames
    as ``("path:line", function)``, innermost first (``location`` is the innermost); ``written``
    the record of the part written into the array, for a value a write into part of an array made
    (``ctx[:, :, h * hd:(h + 1) * hd] = ...``); ``keywords`` the call's keyword arguments that are
    numbers or booleans (torch: ``scale=`` of ``F.scaled_dot_product_attention``, ``dim=``), empty
    where the capture records none; ``call`` the operation's name in its framework (``op`` is the
    line's source text for NumPy); ``loops`` the loops the user's line ran in (``lines.Loop``:
    which head, which sequence of the batch); ``calls`` an id of each call of ``stack``'s frames
    (two calls of a helper from one line in a loop are two calls), empty where the capture has none;
    ``expands`` the record of the fused operation (``F.layer_norm``) this value is a step of
    (``expand.steps``): such a value feeds nothing.
    """

    index: int
    op: str
    value: np.ndarray
    dtype: str
    location: str
    inputs: tuple[int, ...] = ()
    module: str | None = None
    leaf: str | None = None
    step: str | None = None
    stack: tuple[tuple[str, str], ...] = ()
    written: int | None = None
    keywords: dict[str, bool | int | float] = field(default_factory=dict)
    call: str = ""
    loops: tuple[Any, ...] = ()
    calls: tuple[int, ...] = ()
    expands: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def label(self) -> str:
        """The value's name in a report: its step, else its operation and the module computing it."""
        if self.step:
            return self.step
        return f"{self.op} in {self.module}" if self.module else self.op


@dataclass(frozen=True)
class CustomRule:
    """A JAX ``custom_vjp``/``custom_jvp`` call whose own rule gives its inputs' cotangents:
    ``eqn`` the equation; ``inputs`` ``(literal, record index)`` per operand (the literal where the
    operand is no record); ``outputs`` the record indexes of its results."""

    eqn: Any
    inputs: tuple[tuple[Any, int | None], ...]
    outputs: tuple[int | None, ...]


@dataclass
class Trace:
    """The records of one run in execution order (inputs precede what they feed) and its output.
    A capture with a gradient seed also holds ``cotangents`` (record index -> the gradient of
    ``sum(output * cotangent_for(output, seed))`` with respect to that value, for the floating
    values the output depends on differentiably) and, in JAX, ``custom_rules`` (the index of each
    record computed inside a custom rule's call -> that call: its values have no cotangent).
    ``returned`` is the framework of the value the callable returned (``run.returned_framework``).
    A torch run in train mode holds its dropouts' ``keep_masks`` (True = kept) and ``drop_rates``
    (their ``p``, None where unknown), in order."""

    framework: str
    records: list[Record] = field(default_factory=list)
    output: int | None = None
    steps: dict[str, Any] = field(default_factory=dict)
    cotangents: dict[int, np.ndarray] = field(default_factory=dict)
    custom_rules: dict[int, CustomRule] = field(default_factory=dict)
    keep_masks: list[np.ndarray] = field(default_factory=list)
    drop_rates: list[float | None] = field(default_factory=list)
    returned: str | None = None

    def add(
        self,
        op: str,
        value: Any,
        dtype: str,
        location: str,
        inputs: tuple[int, ...] = (),
        module: str | None = None,
        leaf: str | None = None,
        stack: tuple[tuple[str, str], ...] = (),
        keywords: dict[str, bool | int | float] | None = None,
        copy: bool = True,
    ) -> int:
        """Record ``value`` (a copy: later in-place updates must not change it; without ``copy``, a
        value nothing updates, such as a JAX array or a weight, as it is) and return its index."""
        array = np.array(value) if copy else np.asarray(value)
        if array.dtype.name in ("bfloat16", "float16"):  # compared in float64; stored as float32
            array = array.astype(np.float32)
        index = len(self.records)
        location = stack[0][0] if stack else location
        record = Record(
            index, op, array, dtype, location, inputs, module, leaf, None, stack, None, keywords or {}, op
        )
        self.records.append(record)
        return index

    def name_steps(self, steps: dict[str, Any]) -> None:
        """Give each step the project code recorded to the first record holding its value."""
        from parity_tests.arrays import to_float64

        self.steps = dict(steps)
        for name, value in steps.items():
            expected = to_float64(value)
            for record in self.records:
                if record.leaf is None and record.step is None and record.shape == expected.shape:
                    if np.array_equal(record.value, expected, equal_nan=True):
                        record.step = name
                        break


def cotangent_for(output: Any, seed: int) -> np.ndarray:
    """The seeded standard normal cotangent for ``output``'s shape, in float32 (the same numbers
    for every framework and output dtype)."""
    return np.random.default_rng(seed).standard_normal(tuple(output.shape)).astype(np.float32)


def split_result(result: Any) -> tuple[Any, dict[str, Any]]:
    """``(output, steps)`` from what a callable returned: ``(output, steps)`` from the project's
    ``return_steps=True``, a tuple's first element (``nn.MultiheadAttention``'s
    ``(output, weights)``), a model output's ``logits`` (Hugging Face's ``ModelOutput``, a mapping)
    or its first array, or the value itself."""
    from collections.abc import Mapping

    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping):
        return result[0], dict(result[1])
    if isinstance(result, (tuple, list)):
        return result[0], {}
    if isinstance(result, Mapping) and not hasattr(result, "shape"):
        if "logits" in result:
            return result["logits"], {}
        arrays = [v for v in result.values() if hasattr(v, "shape") and hasattr(v, "dtype")]
        return (arrays[0] if arrays else result), {}
    return result, {}
