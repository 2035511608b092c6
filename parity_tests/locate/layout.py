"""Legitimate layout differences: one value seen in another layout.

Two layouts hold the same tensor when both split into the same atomic axes (a model width ``D``
into heads ``(N, H)``, a fused ``3D`` into ``(3, N, H)``, ``B*T`` into ``(B, T)``: the splits the
traces' own reshapes perform) and these atomic axes are permuted. Atomic axes of equal size keep
their order: a ``(T, S)`` score matrix never legitimately becomes ``(S, T)``, so queries and keys
swapped are never taken for a layout change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

__all__ = ["atomic", "in_layout", "split_rules"]


def _groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Consecutive axes of ``a`` and ``b`` with equal products (a reshape's merges and splits)."""
    groups, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        group_a, group_b = [a[i]], [b[j]]
        i, j = i + 1, j + 1
        while math.prod(group_a) != math.prod(group_b):
            if math.prod(group_a) < math.prod(group_b) and i < len(a):
                group_a.append(a[i])
                i += 1
            elif j < len(b):
                group_b.append(b[j])
                j += 1
            else:
                return groups
        groups.append((group_a, group_b))
    return groups


def _squeezed(shape: Iterable[int]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def split_rules(shape_pairs: Iterable[tuple[tuple[int, ...], tuple[int, ...]]]) -> dict[int, tuple[int, ...]]:
    """size -> the sizes it splits into, read from reshapes (pairs of input and output shapes of one
    size); the first rule for a size wins."""
    rules: dict[int, tuple[int, ...]] = {}
    for before, after in shape_pairs:
        for group_a, group_b in _groups(_squeezed(before), _squeezed(after)):
            whole, parts = (group_a, group_b) if len(group_a) == 1 else (group_b, group_a)
            if len(whole) == 1 and len(parts) > 1:
                rules.setdefault(whole[0], tuple(parts))
    return rules


def _atoms(shape: tuple[int, ...], rules: dict[int, tuple[int, ...]], depth: int = 0) -> list[int]:
    atoms: list[int] = []
    for size in _squeezed(shape):
        parts = rules.get(size)
        atoms.extend(_atoms(parts, rules, depth + 1) if parts and depth < 4 else [size])
    return atoms


def atomic(value: np.ndarray, rules: dict[int, tuple[int, ...]]) -> np.ndarray:
    """``value`` reshaped into its atomic axes (``(B*T, D)`` into ``(B, T, D)``), axes of size 1 dropped."""
    return value.reshape(_atoms(value.shape, rules))


def in_layout(
    value: np.ndarray, shape: tuple[int, ...], rules: dict[int, tuple[int, ...]]
) -> np.ndarray | None:
    """``value`` rearranged into ``shape`` by splitting into atomic axes, permuting them (equal
    sizes keep their order) and merging; None when no legitimate layout change gives ``shape``."""
    if value.shape == tuple(shape):
        return value
    if value.size != math.prod(shape):
        return None
    source, target = _atoms(value.shape, rules), _atoms(tuple(shape), rules)
    if sorted(source) != sorted(target):
        return None
    used: set[int] = set()
    permutation = []
    for size in target:
        axis = next(a for a, s in enumerate(source) if s == size and a not in used)
        used.add(axis)
        permutation.append(axis)
    return value.reshape(source).transpose(permutation).reshape(shape)
