"""The three projections at once: one matmul over a stacked weight, a fast path's choice.
Framework-neutral: ``fw`` is the package's ``Framework`` (its ``ops`` and ``xp``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numpy_attn.spec import QKV

__all__ = ["qkv_projections", "qkv_weights", "split_projection"]


def qkv_weights(fw: Any, params: Mapping[str, Any]) -> tuple[Any, Any]:
    """``W_query``, ``W_key``, ``W_value`` stacked as note 003's ``Wqkv``: the ``(3E, D)`` weight and
    the ``(3E,)`` bias (None without biases)."""
    weight = fw.xp.concatenate([params[f"{name}.weight"] for name in QKV])  # (3E, D)
    if "W_query.bias" not in params:
        return weight, None
    return weight, fw.xp.concatenate([params[f"{name}.bias"] for name in QKV])  # (3E,)


def split_projection(
    fw: Any, x: Any, weight: Any, bias: Any = None, *, parts: int = 3, fused: bool = True
) -> tuple[Any, ...]:
    """``linear(x, weight, bias)`` cut into ``parts`` equal slices of its features (note 003's
    ``Wqkv(x)`` then ``unbind``): one matmul when ``fused``, else one per slice of the weight.
    Returns: ``parts`` arrays ``(..., F / parts)``."""
    width = weight.shape[0] // parts
    cuts = [slice(i * width, (i + 1) * width) for i in range(parts)]
    if fused:
        projected = fw.ops.linear(x, weight, bias)  # (..., parts * E)
        return tuple(projected[..., cut] for cut in cuts)
    return tuple(fw.ops.linear(x, weight[cut], None if bias is None else bias[cut]) for cut in cuts)


def qkv_projections(fw: Any, x: Any, params: Mapping[str, Any], *, fused: bool = False) -> tuple[Any, Any, Any]:
    """``W_query(x), W_key(x), W_value(x)``: three matmuls as in the notes, or one over the stacked
    weights (``fused``). Returns: 3 arrays ``(..., E)``."""
    if fused:
        return split_projection(fw, x, *qkv_weights(fw, params))
    return tuple(fw.ops.linear(x, params[f"{name}.weight"], params.get(f"{name}.bias")) for name in QKV)
