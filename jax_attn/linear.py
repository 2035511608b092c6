"""``torch.nn.functional.linear`` on torch-layout weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["linear"]


def linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``x @ weight.T + bias`` with ``weight`` in torch's ``(out_features, in_features)`` layout."""
    out = jnp.asarray(x) @ weight.T  # (..., out_features)
    return out if bias is None else out + bias
