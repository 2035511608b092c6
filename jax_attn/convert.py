"""The one boundary between torch's layout and Flax's.

torch stores ``nn.Linear.weight`` as ``(out_features, in_features)``; Flax stores
``nnx.Linear.kernel`` as ``(in_features, out_features)``. The project's weights format keeps
torch's names and layout; the Flax modules keep Flax's. These two functions are the only
place where one becomes the other:

    torch name                  Flax path                           value
    ``W_query.weight``          ``("W_query", "kernel")``           transposed
    ``W_query.bias``            ``("W_query", "bias")``             as is
    ``W_query`` (V1's matrix)   ``("W_query",)``                    as is (already ``(in, out)``)
    ``heads.0.W_query.weight``  ``("heads", 0, "W_query", "kernel")``  transposed
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flax_path", "flax_value", "torch_name", "torch_value"]

Path = tuple[str | int, ...]


def flax_path(name: str) -> Path:
    """The Flax module path of a torch state_dict name."""
    parts: list[str | int] = [int(p) if p.isdigit() else p for p in name.split(".")]
    if parts[-1] == "weight":
        parts[-1] = "kernel"
    return tuple(parts)


def torch_name(path: Path) -> str:
    """The torch state_dict name of a Flax module path (the inverse of ``flax_path``)."""
    parts = ["weight" if p == "kernel" else str(p) for p in path]
    return ".".join(parts)


def flax_value(name: str, value: Any) -> Any:
    """A torch-layout value in Flax layout (Linear weights are transposed)."""
    return value.T if name.endswith(".weight") else value


def torch_value(path: Path, value: Any) -> Any:
    """A Flax-layout value in torch layout (kernels are transposed)."""
    return value.T if path[-1] == "kernel" else value


def flax_state(params: Mapping[str, Any]) -> dict[Path, Any]:
    """Torch-format weights keyed by Flax path, in Flax layout."""
    return {flax_path(name): flax_value(name, value) for name, value in params.items()}
