"""``torch.nn.functional.linear`` on torch-layout weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["linear"]


def linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``x @ weight.T + bias`` with ``weight`` in torch's ``(out_features, in_features)`` layout.

    Written as one contraction rather than ``x @ weight.T``: XLA then runs the same dot kernel
    eagerly and under ``jax.jit`` (a separate transpose lets jit pick another one), so eager and
    jitted results are bit-identical.
    """
    out = jnp.einsum("...i,oi->...o", x, weight)  # (..., out_features)
    return out if bias is None else out + bias
