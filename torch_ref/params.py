"""The project's one weights format on the torch side: state_dict names, torch layout, NumPy."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from numpy_attn.validation import check_finite, check_params

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


def load_params(module: nn.Module, params: Mapping[str, np.ndarray]) -> nn.Module:
    """Copy ``params`` into ``module`` in place and return it.

    Every key and shape is checked first (one error names every missing, unexpected and
    mis-shaped key), then every value must be finite; values are cast to the module's dtype.
    """
    targets = dict(module.named_parameters())
    expected = {name: tuple(param.shape) for name, param in targets.items()}
    check_params(params, expected, layer=type(module).__name__)
    check_finite(params)
    with torch.no_grad():
        for name, param in targets.items():
            param.copy_(from_numpy(params[name]).to(param.dtype))
    return module
