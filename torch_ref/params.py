"""The project's one weights format on the torch side: state_dict names, torch layout, NumPy.

The oracle checks weights with its own code (torch's parameter list is the expected layout):
it imports nothing of the packages it checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def _check_mapping(params: Any) -> None:
    """TypeError unless ``params`` maps str to values (numpy_attn's ``check_mapping``, same text)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of str to arrays, got {type(params).__name__}")
    for key in params:
        if not isinstance(key, str):
            raise TypeError(
                f"params must be a mapping of str to arrays, got key {key!r} ({type(key).__name__})"
            )


def _problems(module: nn.Module, params: Mapping[str, Any]) -> list[str]:
    """What keeps ``params`` from fitting ``module``'s parameters, each problem named; TypeError
    for an expected key whose value is not an array (numpy_attn's ``check_array``, same text)."""
    expected = {name: tuple(param.shape) for name, param in module.named_parameters()}
    given = {name: _shape(name, params[name]) for name in expected if name in params}
    missing = [name for name in expected if name not in given]
    unexpected = sorted(set(params) - set(expected))
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


def _shape(name: str, value: Any) -> tuple[int, ...]:
    """``params[name]``'s shape; TypeError unless it is an array (it has a shape and a dtype)."""
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise TypeError(f"params[{name!r}] must be an array, got {type(value).__name__}")
    return tuple(value.shape)


def _dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``, NumPy's name for it."""
    return str(dtype).removeprefix("torch.")


def _weight(name: str, value: Any) -> torch.Tensor:
    """``params[name]`` (a NumPy, JAX or torch array) as a CPU tensor of its own floating dtype.

    TypeError for a big-endian array (numpy_attn's ``check_native_byte_order``, same text) and
    for a dtype that is not floating (bool, int, complex, object...: a cast would drop the
    imaginary part or turn True into 1.0 in silence)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        dtype = _dtype_name(tensor.dtype)
    else:
        array = np.asarray(value)
        if array.dtype.byteorder == ">":
            raise TypeError(
                f"params[{name!r}] has dtype {array.dtype.str}, big-endian; give it in the machine's "
                f"byte order: .astype(np.{array.dtype.name})"
            )
        dtype = array.dtype.name
        tensor = from_numpy(array) if array.dtype.kind == "f" or dtype == "bfloat16" else None
    if tensor is None or not tensor.dtype.is_floating_point:
        raise TypeError(
            f"params[{name!r}] has dtype {dtype}; weights are float16, float32, float64 or bfloat16 "
            "(cast to the module's dtype)"
        )
    return tensor


def load_params(module: nn.Module, params: Mapping[str, Any]) -> nn.Module:
    """Copy ``params`` into ``module`` in place and return it.

    ``params`` maps the module's parameter names to NumPy, JAX or torch arrays of a floating dtype
    (float16, float32, float64, bfloat16), cast to the module's dtype. Checked first, and
    nothing is copied unless all pass: every key and shape (one ValueError names every missing,
    unexpected and mis-shaped key), then each value's dtype (TypeError for a non-floating or
    big-endian array), then its values: ValueError for NaN or inf, and for values that are
    finite but overflow the module's dtype (1e300 in a float32 module). The texts are
    numpy_attn's where the mistake is the same.
    """
    _check_mapping(params)
    problems = _problems(module, params)
    if problems:
        raise ValueError(f"params do not fit {type(module).__name__}: " + "; ".join(problems))
    tensors = {name: _weight(name, params[name]) for name, _ in module.named_parameters()}
    for name, tensor in tensors.items():
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"params[{name!r}] has non-finite values (NaN or inf)")
    cast = {name: tensors[name].to(param.dtype) for name, param in module.named_parameters()}
    for name, tensor in cast.items():
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(
                f"params[{name!r}] has values too large for the module's dtype {_dtype_name(tensor.dtype)} "
                f"(largest finite {torch.finfo(tensor.dtype).max:.6g})"
            )
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(cast[name])
    return module
