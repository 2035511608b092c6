"""The three projections as one matmul over a stacked weight (a fast path's choice), written once
for both packages with the ``Framework``'s ``ops.linear`` and ``xp``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numpy_attn.spec import QKV


def qkv_weights(fw: Any, params: Mapping[str, Any]) -> tuple[Any, Any]:
    """``W_query``, ``W_key``, ``W_value`` stacked as note 003's ``Wqkv``.

    Args: params, ``"W_query.weight"``, ``"W_key.weight"``, ``"W_value.weight"`` ``(E, D)`` and
        their ``(E,)`` biases or none.
    Returns: ``(weight (3E, D), bias (3E,) or None)``.
    """
    weight = fw.xp.concatenate([params[f"{name}.weight"] for name in QKV])  # (3E, D)
    if "W_query.bias" not in params:
        return weight, None
    return weight, fw.xp.concatenate([params[f"{name}.bias"] for name in QKV])  # (3E,)


def split_projection(
    fw: Any, x: Any, weight: Any, bias: Any = None, *, parts: int = 3, fused: bool = True
) -> tuple[Any, ...]:
    """``linear(x, weight, bias)`` cut into ``parts`` equal slices of its features (note 003's
    ``Wqkv(x)`` then ``unbind``): one matmul when ``fused``, else one per slice of the weight.

    Args: x ``(..., D)``; weight ``(F, D)``, F divisible by ``parts``; bias ``(F,)`` or None.
    Returns: ``parts`` arrays ``(..., F / parts)``.
    """
    width = weight.shape[0] // parts
    cuts = [slice(i * width, (i + 1) * width) for i in range(parts)]
    if fused:
        projected = fw.ops.linear(x, weight, bias)  # (..., F)
        return tuple(projected[..., cut] for cut in cuts)
    return tuple(fw.ops.linear(x, weight[cut], None if bias is None else bias[cut]) for cut in cuts)


def qkv_projections(fw: Any, x: Any, params: Mapping[str, Any], *, fused: bool = False) -> tuple[Any, ...]:
    """``W_query(x), W_key(x), W_value(x)``: three matmuls as in the notes, or one over the stacked
    weights (``fused``).

    Args: x ``(..., D)``; params as ``qkv_weights``'s.
    Returns: 3 arrays ``(..., E)``.
    """
    if fused:
        return split_projection(fw, x, *qkv_weights(fw, params))
    return tuple(fw.ops.linear(x, params[f"{name}.weight"], params.get(f"{name}.bias")) for name in QKV)
