"""An automatic weight mapping from a torch ``state_dict`` to an NNX module, for the user to confirm.

NNX parameters are taken in definition order (the order the module's ``__init__`` assigns them);
each gets the first unused torch tensor that fits its shape: 2-D torch weights are transposed
(``nn.Linear`` stores ``(out, in)``, NNX kernels ``(in, out)``), then reshaped where the NNX kernel
splits heads (``LinearGeneral``: ``(in, heads, head_dim)``); a fused ``in_proj_weight`` /
``in_proj_bias`` (``torch.nn.MultiheadAttention``) is split into its query, key and value thirds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["WeightMap", "map_weights"]


@dataclass(frozen=True)
class WeightMap:
    """``rows``: ``(nnx path, torch name, how)``; ``values``: the NNX path's new value."""

    rows: tuple[tuple[str, str, str], ...]
    values: dict[str, np.ndarray]

    def __str__(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        return "\n".join(f"{path:<{width}}  <-  {name}  ({how})" for path, name, how in self.rows)

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title="torch -> NNX weight mapping: please confirm", title_justify="left")
        for column in ("NNX parameter", "torch tensor", "how"):
            table.add_column(column)
        for row in self.rows:
            table.add_row(*row)
        return table

    def apply(self, module: Any) -> Any:
        """Write the mapped values into ``module``'s parameters; returns the module."""
        params = dict(_params(module))
        for path, value in self.values.items():
            params[path][...] = value
        return module


def _params(module: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, Param)`` in definition order (attribute assignment order, depth first)."""
    from flax import nnx

    for name, value in vars(module).items():
        path = f"{prefix}{name}"
        if isinstance(value, nnx.Param):
            yield path, value
        elif isinstance(value, nnx.Module):
            yield from _params(value, f"{path}.")


def _torch_tensors(state: Mapping[str, Any]) -> list[tuple[str, np.ndarray]]:
    tensors = []
    for name, value in state.items():
        array = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
        if name.split(".")[-1] in ("in_proj_weight", "in_proj_bias"):
            tensors += [
                (f"{name}[{part}]", chunk) for part, chunk in zip("qkv", np.split(array, 3), strict=True)
            ]
        else:
            tensors.append((name, array))
    return tensors


def _fit(array: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, str] | None:
    if array.size != int(np.prod(shape)):
        return None
    if array.ndim == 2:
        array, how = array.T, "transposed"
        if array.shape == shape:
            return array, how
        return array.reshape(shape), f"{how}, reshaped to {shape}"
    if array.shape == shape:
        return array, "as is"
    return array.reshape(shape), f"reshaped to {shape}"


def map_weights(state: Mapping[str, Any], module: Any) -> WeightMap:
    """Map ``state`` (a torch ``state_dict`` or the project's weights format) onto ``module``'s
    parameters; raises ValueError naming what is left over or cannot be matched."""
    tensors = _torch_tensors(state)
    used: set[int] = set()
    rows, values = [], {}
    for path, param in _params(module):
        shape = tuple(param.shape)
        for index, (name, array) in enumerate(tensors):
            fitted = None if index in used else _fit(array, shape)
            if fitted is not None:
                used.add(index)
                values[path] = fitted[0].astype(np.asarray(param[...]).dtype)
                rows.append((path, name, fitted[1]))
                break
        else:
            raise ValueError(f"map_weights: no torch tensor left fits NNX parameter {path} of shape {shape}")
    left = [
        name for index, (name, _) in enumerate(tensors) if index not in used and name.split(".")[-1] != "mask"
    ]
    if left:
        raise ValueError(f"map_weights: torch tensors left unmapped: {', '.join(left)}")
    return WeightMap(tuple(rows), values)
