"""Covering sets: the default run's subset of a product of test axes.

``make test`` runs, of a product of axes (layer x shape x dtype x ...), a set of rows in which
every value of every axis meets every value of every other axis at least once (``pairwise``), or,
for a property that no pair of values is expected to break, in which every value of every axis
appears at least once (``each_value``); ``make test-slow`` runs the rest of the product. The rows
are built deterministically (``pairwise``: the in-parameter-order greedy construction, ties to the
first value), so a run always checks the same cases.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import pytest


def pairwise(axes: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows (one value per axis, by axis name) covering every pair of values of every two axes;
    with two axes, their whole product."""
    names = sorted(axes, key=lambda name: -len(axes[name]))  # stable: the largest axes first
    sizes = [len(axes[name]) for name in names]
    rows: list[list[int | None]] = [[i, j] for i, j in itertools.product(range(sizes[0]), range(sizes[1]))]
    for k in range(2, len(names)):
        uncovered = {(p, u, v) for p in range(k) for u in range(sizes[p]) for v in range(sizes[k])}
        for row in rows:  # horizontal growth: the value of axis k that covers most new pairs
            gain = [sum((p, row[p], v) in uncovered for p in range(k)) for v in range(sizes[k])]
            row.append(gain.index(max(gain)))
            uncovered -= {(p, row[p], row[k]) for p in range(k)}
        for p, u, v in sorted(uncovered):  # vertical growth: fill a free slot or add a row
            row = next(
                (row for row in rows if row[p] in (None, u) and row[k] in (None, v)),
                None,
            )
            if row is None:
                rows.append(row := [None] * (k + 1))
            row[p], row[k] = u, v
    return [
        {name: axes[name][0 if i is None else i] for name, i in zip(names, row, strict=True)} for row in rows
    ]


def each_value(axes: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """As many rows as the largest axis has values, row i taking value i (modulo its length) of
    every axis: each value of each axis is in at least one row."""
    rows = max(len(values) for values in axes.values())
    return [{name: values[i % len(values)] for name, values in axes.items()} for i in range(rows)]


def covering_params(runs: Iterable[tuple[Any, ...]], fast: Collection[tuple[Any, ...]]) -> list[Any]:
    """``runs`` as pytest parameters: those in ``fast`` as they are, for ``make test``, the rest
    marked ``slow``, for ``make test-slow``."""
    return [run if run in fast else pytest.param(*run, marks=pytest.mark.slow) for run in runs]


def each_value_params(axes: dict[str, Sequence[Any]]) -> list[Any]:
    """The product of ``axes`` as pytest parameters (tuples of values in the axes' order), with
    ``each_value``'s rows for ``make test`` (``covering_params``)."""
    fast = [tuple(row[name] for name in axes) for row in each_value(axes)]
    return covering_params(itertools.product(*axes.values()), fast)
