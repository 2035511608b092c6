"""The project's one weights format on the torch side: state_dict names, torch layout, NumPy.

The oracle checks weights with its own code (torch's parameter list is the expected layout):
it imports nothing of the packages it checks.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

__all__ = ["from_numpy", "load_params", "to_numpy", "to_params"]


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A detached CPU copy as NumPy; bfloat16 becomes ``ml_dtypes.bfloat16`` bit for bit."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16).copy()
    return tensor.numpy().copy()


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """The inverse of ``to_numpy`` (bfloat16 included), as a new tensor."""
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


def to_params(module: nn.Module) -> dict[str, np.ndarray]:
    """The module's parameters (buffers excluded) as ``{state_dict name: array}``, torch layout."""
    return {name: to_numpy(param) for name, param in module.named_parameters()}


def _problems(module: nn.Module, params: Mapping[str, np.ndarray]) -> list[str]:
    """What keeps ``params`` from fitting ``module``'s parameters, each problem named."""
    expected = {name: tuple(param.shape) for name, param in module.named_parameters()}
    given = {name: tuple(np.shape(value)) for name, value in params.items()}
    missing = [name for name in expected if name not in given]
    unexpected = sorted(set(given) - set(expected))
    misshaped = [
        f"{name!r} has shape {given[name]}, expected {shape}"
        for name, shape in expected.items()
        if name in given and given[name] != shape
    ]
    return [
        *([f"missing keys {missing}"] if missing else []),
        *([f"unexpected keys {unexpected}"] if unexpected else []),
        *(["mis-shaped keys: " + "; ".join(misshaped)] if misshaped else []),
    ]


def load_params(module: nn.Module, params: Mapping[str, np.ndarray]) -> nn.Module:
    """Copy ``params`` into ``module`` in place and return it.

    Every key and shape is checked first (one ValueError names every missing, unexpected and
    mis-shaped key), then every value must be finite; values are cast to the module's dtype.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of str to arrays, got {type(params).__name__}")
    problems = _problems(module, params)
    if problems:
        raise ValueError(f"params do not fit {type(module).__name__}: " + "; ".join(problems))
    tensors = {name: from_numpy(value) for name, value in params.items()}
    for name, tensor in tensors.items():
        if not bool(torch.isfinite(tensor.float()).all()):
            raise ValueError(f"params[{name!r}] has non-finite values (NaN or inf)")
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(tensors[name].to(param.dtype))
    return module
