"""The source lines that compute a step, read from the reference files themselves.

``excerpt(numpy_attn.ops.split_heads, "x = x.reshape", "return")`` is the text of those two
statements of ``numpy_attn/ops.py`` (each whole, over its continuation lines), so what the
walkthrough and the notebooks show is what runs; a statement that is no longer there is a
ValueError, which the tests meet first.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Code", "excerpt", "joined", "three"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Code:
    """Source lines and the file they come from (relative to the repository)."""

    path: str
    text: str


def _statements(tree: ast.AST) -> list[ast.stmt]:
    return sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt)), key=lambda n: n.lineno)


def excerpt(function: Callable[..., Any], *starts: str) -> Code:
    """The statements of ``function`` whose first line starts with each of ``starts`` (the first
    such statement after the previous one), in order; ValueError naming a start no statement has."""
    function = inspect.unwrap(function)
    source = textwrap.dedent(inspect.getsource(function))
    lines = source.splitlines()
    statements = _statements(ast.parse(source))
    chosen, after = [], 0
    for start in starts:
        found = next(
            (s for s in statements if s.lineno > after and lines[s.lineno - 1].strip().startswith(start)),
            None,
        )
        if found is None:
            raise ValueError(f"{function.__qualname__} has no statement starting with {start!r}")
        chosen.append(textwrap.dedent("\n".join(lines[found.lineno - 1 : found.end_lineno])))
        after = found.end_lineno
    path = os.path.relpath(inspect.getsourcefile(function), ROOT)
    return Code(path, "\n".join(chosen))


def _jax_twin(numpy_function: Callable[..., Any]) -> Callable[..., Any]:
    """jax_attn's function of the same file and name as numpy_attn's ``numpy_function``."""
    function = inspect.unwrap(numpy_function)
    module = importlib.import_module(function.__module__.replace("numpy_attn", "jax_attn", 1))
    return getattr(module, function.__qualname__)


def three(
    torch: tuple[Any, ...], numpy: tuple[Any, ...], jax: tuple[Any, ...] | None = None
) -> dict[str, Code]:
    """Each framework's excerpt, each given as ``(function, *starts)``; ``jax`` defaults to the
    same starts in jax_attn's twin of numpy's function (the same file and name)."""
    numpy_function, *numpy_starts = numpy
    jax = jax or (_jax_twin(numpy_function), *numpy_starts)
    return {"torch": excerpt(*torch), "numpy": excerpt(*numpy), "jax": excerpt(*jax)}


def joined(*codes: Code) -> Code:
    """Excerpts of several files as one (a layer's lines, then the building block they call)."""
    paths = list(dict.fromkeys(code.path for code in codes))
    return Code(" + ".join(paths), "\n".join(code.text for code in codes))
