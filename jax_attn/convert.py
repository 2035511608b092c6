"""The one boundary between torch's layout and Flax's, and between other frameworks' arrays and JAX's.

torch stores ``nn.Linear.weight`` as ``(out_features, in_features)``; Flax stores
``nnx.Linear.kernel`` as ``(in_features, out_features)``. The project's weights format keeps
torch's names and layout; the Flax modules keep Flax's. These functions are the only place where
one becomes the other, and they run only when weights enter (``from_params``, ``load_params``)
or leave (``to_params``) a module, never in a call:

    torch name                  Flax path                           value
    ``W_query.weight``          ``("W_query", "kernel")``           transposed
    ``W_query.bias``            ``("W_query", "bias")``             as is
    ``W_query`` (V1's matrix)   ``("W_query",)``                    as is (already ``(in, out)``)
    ``heads.0.W_query.weight``  ``("heads", 0, "W_query", "kernel")``  transposed
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["as_jax", "as_jax_params", "flax_path", "flax_value", "torch_name", "torch_value"]

Path = tuple[str | int, ...]


def flax_path(name: str) -> Path:
    """The Flax module path of a torch state_dict name (the inverse of ``torch_name``)."""
    parts: list[str | int] = [int(p) if p.isdigit() else p for p in name.split(".")]
    return (*parts[:-1], "kernel") if parts[-1] == "weight" else tuple(parts)


def torch_name(path: Path) -> str:
    """The torch state_dict name of a Flax module path (``("W_query", "kernel")`` -> ``W_query.weight``)."""
    parts = ["weight" if p == "kernel" else str(p) for p in path]
    return ".".join(parts)


def flax_value(name: str, value: Any) -> Any:
    """A torch-layout value in Flax layout (Linear weights are transposed)."""
    return value.T if name.endswith(".weight") else value


def torch_value(path: Path, value: Any) -> Any:
    """A Flax-layout value in torch layout (kernels are transposed)."""
    return value.T if path[-1] == "kernel" else value


def as_jax(value: Any) -> Any:
    """A NumPy array, JAX array or torch tensor as a JAX array, dtype kept (bfloat16 included);
    anything else is returned as it is, for the weights check to name. Torch is not imported: a
    tensor is recognised by ``detach`` and crosses by DLPack (no copy on the CPU)."""
    if hasattr(value, "detach") and hasattr(value, "__dlpack__"):
        return jax.dlpack.from_dlpack(value.detach().cpu().contiguous())
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return jnp.asarray(value)
    return value


def as_jax_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``as_jax`` of every value of a weights mapping (a torch ``state_dict()`` included)."""
    return {name: as_jax(value) for name, value in params.items()}
