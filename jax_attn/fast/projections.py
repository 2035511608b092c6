"""The three projections at once: one matmul over a stacked weight, a fast path's choice."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jax_attn.ops import linear
from numpy_attn.spec import QKV

__all__ = ["qkv_projections", "qkv_weights", "split_projection"]


def qkv_weights(params: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array | None]:
    """``W_query``, ``W_key``, ``W_value`` stacked as note 003's ``Wqkv``: the ``(3E, D)`` weight and
    the ``(3E,)`` bias (None without biases)."""
    weight = jnp.concatenate([params[f"{name}.weight"] for name in QKV])  # (3E, D)
    if "W_query.bias" not in params:
        return weight, None
    return weight, jnp.concatenate([params[f"{name}.bias"] for name in QKV])  # (3E,)


def split_projection(
    x: jax.Array, weight: jax.Array, bias: jax.Array | None = None, *, parts: int = 3, fused: bool = True
) -> tuple[jax.Array, ...]:
    """``linear(x, weight, bias)`` cut into ``parts`` equal slices of its features (note 003's
    ``Wqkv(x)`` then ``unbind``): one matmul when ``fused``, else one per slice of the weight.
    Returns: ``parts`` arrays ``(..., F / parts)``."""
    width = weight.shape[0] // parts
    cuts = [slice(i * width, (i + 1) * width) for i in range(parts)]
    if fused:
        projected = linear(x, weight, bias)  # (..., parts * E)
        return tuple(projected[..., cut] for cut in cuts)
    return tuple(linear(x, weight[cut], None if bias is None else bias[cut]) for cut in cuts)


def qkv_projections(
    x: jax.Array, params: Mapping[str, jax.Array], *, fused: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``W_query(x), W_key(x), W_value(x)``: three matmuls as in the notes, or one over the stacked
    weights (``fused``). Returns: 3 arrays ``(..., E)``."""
    if fused:
        return split_projection(x, *qkv_weights(params))
    return tuple(linear(x, params[f"{name}.weight"], params.get(f"{name}.bias")) for name in QKV)
