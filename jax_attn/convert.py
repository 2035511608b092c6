"""The one boundary between torch's layout and Flax's, and between other frameworks' arrays and JAX's.

The weights format keeps torch's names and layout, the Flax modules Flax's. ``LAYOUT`` is the one
table between them, read only as weights enter a module (``from_params``, ``load_params``) or leave
it (``to_params``), never in a call:

    Flax path                            torch name               value
    ``("W_query", "kernel")``            ``W_query.weight``       transposed: ``(in, out)`` <-> ``(out, in)``
    ``("tok_emb", "embedding")``         ``tok_emb.weight``       as is: ``(V, D)``
    ``("heads", 0, "W_query", "bias")``  ``heads.0.W_query.bias`` as is
    ``("W_query",)`` (V1's matrix)       ``W_query``              as is: ``(in, out)``
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Path = tuple[str | int, ...]
# the last part of a Flax path -> (the last part of its torch name, whether the value is transposed)
LAYOUT = {"kernel": ("weight", True), "embedding": ("weight", False)}


def torch_name(path: Path) -> str:
    """The torch name of a Flax path: ``("heads", 0, "W_query", "kernel")`` -> ``heads.0.W_query.weight``."""
    return ".".join(map(str, (*path[:-1], LAYOUT.get(path[-1], (path[-1],))[0])))


def flax_path(name: str) -> Path:
    """The Flax path of an attention module's torch name (a ``weight`` is an ``nnx.Linear``'s kernel)."""
    parts = [int(part) if part.isdigit() else part for part in name.split(".")]
    return (*parts[:-1], "kernel") if parts[-1] == "weight" else tuple(parts)


def torch_value(path: Path, value: Any) -> Any:
    """The value of the Flax parameter at ``path`` in torch's layout."""
    return value.T if LAYOUT.get(path[-1], (None, False))[1] else value


to_flax = (
    torch_value  # the torch value of the parameter at ``path`` in Flax's layout: a transpose undoes itself
)


def as_jax(value: Any) -> Any:
    """A NumPy array, JAX array or torch tensor as a JAX array, dtype kept (bfloat16 included);
    anything else as it is, for the weights' checks to name. Torch is not imported: a tensor is
    recognised by ``detach`` and crosses by DLPack (no copy on the CPU)."""
    if hasattr(value, "detach") and hasattr(value, "__dlpack__"):
        return jax.dlpack.from_dlpack(value.detach().cpu().contiguous())
    if isinstance(value, np.ndarray):  # jnp.asarray would compile a program for each shape and dtype
        return jax.device_put(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return jnp.asarray(value)
    return value
