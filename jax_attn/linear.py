"""``torch.nn.functional.linear`` on torch-layout weights, and the three projections at once."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from numpy_attn.validation import QKV, check_flag, check_linear_shapes, check_parts, check_qkv_params

from jax_attn.checks import check_jax_operands

__all__ = [
    "linear",
    "qkv_projections",
    "qkv_weights",
    "split_projection",
    "unchecked_linear",
    "unchecked_qkv_projections",
    "unchecked_qkv_weights",
    "unchecked_split_projection",
]


def linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``unchecked_linear`` of floating arrays of one dtype: x ``(..., D)``, weight
    ``(out_features, D)`` (torch's layout), bias ``(out_features,)`` or None (TypeError or
    ValueError otherwise; float64 needs 64-bit mode)."""
    check_jax_operands(x=x, weight=weight, bias=bias, optional=("bias",))
    check_linear_shapes(x, weight, bias)
    return unchecked_linear(x, weight, bias)


def unchecked_linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``x @ weight.T + bias`` with ``weight`` in torch's ``(out_features, in_features)`` layout,
    for arguments already checked (the layers').

    Written as one contraction rather than ``x @ weight.T``: XLA then runs the same dot kernel
    eagerly and under ``jax.jit`` (a separate transpose lets jit pick another one).
    """
    out = jnp.einsum("...i,oi->...o", x, weight)  # (..., out_features)
    return out if bias is None else out + bias


def qkv_projections(
    x: jax.Array, params: Mapping[str, jax.Array], *, fused: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``unchecked_qkv_projections`` after ``linear``'s checks, for the three projections: ``params`` a
    mapping of str holding ``W_query``, ``W_key`` and ``W_value``, weights ``(E, D)``, biases
    ``(E,)`` for all three or none (other keys ignored), all of x's dtype, x ``(..., D)``, and
    ``fused`` a bool (TypeError or ValueError otherwise; float64 needs 64-bit mode)."""
    check_flag("fused", fused)
    operands = check_qkv_params(params, "qkv_projections")
    check_jax_operands(x=x, **operands)
    check_linear_shapes(x, params["W_query.weight"], None, "params['W_query.weight']")
    return unchecked_qkv_projections(x, params, fused=fused)


def qkv_weights(params: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array | None]:
    """``unchecked_qkv_weights`` after ``qkv_projections``' checks of ``params`` (TypeError or
    ValueError otherwise; float64 needs 64-bit mode)."""
    check_jax_operands(**check_qkv_params(params, "qkv_weights"))
    return unchecked_qkv_weights(params)


def unchecked_qkv_projections(
    x: jax.Array, params: Mapping[str, jax.Array], *, fused: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``W_query(x), W_key(x), W_value(x)``: three matmuls as in the notes, or, ``fused``, one
    matmul with the three weights stacked (one pass over x, the fast paths' choice), for
    arguments already checked (the layers')."""
    if not fused:
        return tuple(unchecked_linear(x, params[f"{n}.weight"], params.get(f"{n}.bias")) for n in QKV)
    return unchecked_split_projection(x, *unchecked_qkv_weights(params))  # 3 x (..., E)


def unchecked_qkv_weights(params: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array | None]:
    """``W_query``, ``W_key`` and ``W_value`` stacked in the layout of note 003's ``Wqkv``: the
    ``(3E, D)`` weight and the ``(3E,)`` bias (None without ``qkv_bias``), for weights already
    checked (the layers')."""
    weight = jnp.concatenate([params[f"{n}.weight"] for n in QKV])  # (3 * E, D)
    if "W_query.bias" not in params:
        return weight, None
    return weight, jnp.concatenate([params[f"{n}.bias"] for n in QKV])  # (3 * E,)


def split_projection(
    x: jax.Array, weight: jax.Array, bias: jax.Array | None = None, *, parts: int = 3, fused: bool = True
) -> tuple[jax.Array, ...]:
    """``unchecked_split_projection`` (which checks that the weight's rows cut into ``parts``
    equal parts) after ``linear``'s checks."""
    check_jax_operands(x=x, weight=weight, bias=bias, optional=("bias",))
    check_linear_shapes(x, weight, bias)
    return unchecked_split_projection(x, weight, bias, parts=parts, fused=fused)


def unchecked_split_projection(
    x: jax.Array, weight: jax.Array, bias: jax.Array | None = None, *, parts: int = 3, fused: bool = True
) -> tuple[jax.Array, ...]:
    """``linear(x, weight, bias)`` cut into ``parts`` equal slices of its output features (note
    003's ``Wqkv(x)`` then ``split``): one matmul and a split when ``fused``, else one matmul per
    slice of the weight (each output feature is the same dot product either way)."""
    check_parts(tuple(weight.shape), parts)
    width = weight.shape[0] // parts  # E, the output features of one part
    cuts = [slice(i * width, (i + 1) * width) for i in range(parts)]
    if fused:
        projected = unchecked_linear(x, weight, bias)  # (..., parts * E)
        return tuple(projected[..., cut] for cut in cuts)  # parts x (..., E)
    return tuple(unchecked_linear(x, weight[cut], None if bias is None else bias[cut]) for cut in cuts)
