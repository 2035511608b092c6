"""What each layer's weights look like, and the one up-front check of a layer call.

The weights format of the whole project is a plain ``dict[str, array]`` keyed by the torch class's
``state_dict`` names (buffers excluded), in torch's layout: ``nn.Linear`` stores ``weight`` as
``(out_features, in_features)``; ``SelfAttentionV1`` stores ``W_query`` as ``(d_in, d_out)`` and
uses it as ``x @ W_query``. ``param_shapes`` is the single description of those names and shapes;
torch_ref, numpy_attn and jax_attn all check weights against it.

Layers are named by their torch class (``"MultiHeadAttention"``); ``LAYERS`` lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numpy_attn.validation import (
    NUMPY_FLOATS,
    check_array,
    check_context_length,
    check_divisible,
    check_dropout,
    check_finite,
    check_implementation,
    check_input,
    check_keep_mask,
    check_mapping,
    check_padding_mask,
    check_params,
)

__all__ = ["LAYERS", "LayerDims", "check_layer", "infer_dims", "param_shapes"]

QKV = ("W_query", "W_key", "W_value")
MULTI_HEAD = (
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
    "FusedMultiHeadAttention",
    "FusedCausalAttention",
)

# Layer name -> input layout. V1 and V2 take 2-D input as in the notes (they use ``keys.T``).
LAYERS: dict[str, str] = {
    "SelfAttentionV1": "(T, D)",
    "SelfAttentionV2": "(T, D)",
    "CausalAttention": "(B, T, D)",
    "MultiHeadAttentionWrapper": "(B, T, D)",
    "MultiHeadAttention": "(B, T, D)",
    "FusedSingleHeadAttention": "(B, T, D)",
    "FusedMultiHeadAttention": "(B, T, D)",
    "FusedCausalAttention": "(B, T, D)",
}


@dataclass(frozen=True)
class LayerDims:
    """Sizes that the weights determine (plus ``num_heads``, which they cannot always tell).

    ``d_in`` is the input width D; ``d_out`` the width E of the queries, keys and values (for the
    wrapper: of one head); ``head_dim`` is H = d_out // num_heads.
    """

    d_in: int
    d_out: int
    num_heads: int
    qkv_bias: bool
    out_bias: bool

    @property
    def head_dim(self) -> int:
        return self.d_out // self.num_heads


def _linear(name: str, d_in: int, d_out: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes = {f"{name}.weight": (d_out, d_in)}
    if bias:
        shapes[f"{name}.bias"] = (d_out,)
    return shapes


def param_shapes(
    layer: str,
    *,
    d_in: int,
    d_out: int,
    num_heads: int = 1,
    qkv_bias: bool = False,
    out_bias: bool = False,
) -> dict[str, tuple[int, ...]]:
    """The state_dict names and torch-layout shapes of ``layer``'s weights, in torch's order.

    For the fused classes ``d_in`` is ``hidden_size`` and ``qkv_bias``/``out_bias`` are both the
    constructor's ``bias``; ``d_out`` is ignored there (the class derives it from hidden_size).
    """
    if layer == "SelfAttentionV1":
        return {name: (d_in, d_out) for name in QKV}
    if layer in ("SelfAttentionV2", "CausalAttention"):
        return {k: v for name in QKV for k, v in _linear(name, d_in, d_out, qkv_bias).items()}
    if layer == "MultiHeadAttentionWrapper":
        head = param_shapes("CausalAttention", d_in=d_in, d_out=d_out, qkv_bias=qkv_bias)
        return {f"heads.{i}.{k}": v for i in range(num_heads) for k, v in head.items()}
    if layer == "MultiHeadAttention":
        shapes = param_shapes("SelfAttentionV2", d_in=d_in, d_out=d_out, qkv_bias=qkv_bias)
        return shapes | _linear("out_proj", d_out, d_out, out_bias)
    if layer == "FusedSingleHeadAttention":
        head_dim = d_in // 4
        return _linear("Wqkv", d_in, 3 * head_dim, qkv_bias) | _linear("Wo", head_dim, d_in, out_bias)
    if layer in ("FusedMultiHeadAttention", "FusedCausalAttention"):
        return _linear("Wqkv", d_in, 3 * d_in, qkv_bias) | _linear("Wo", d_in, d_in, out_bias)
    raise ValueError(f"unknown layer {layer!r}; known layers: {list(LAYERS)}")


def _primary(params: Mapping[str, Any], key: str, layer: str) -> tuple[int, int]:
    """Shape of the weight that fixes a layer's sizes, with a clear error if it is absent."""
    check_mapping(params)
    if key not in params:
        raise ValueError(f"params do not fit {layer}: missing keys [{key!r}] (got keys {sorted(params)})")
    shape = check_array(f"params[{key!r}]", params[key])
    if len(shape) != 2 or 0 in shape:
        raise ValueError(
            f"params do not fit {layer}: mis-shaped keys: {key!r} has shape {shape}, "
            "expected a non-empty 2-D matrix"
        )
    return shape


def infer_dims(layer: str, params: Mapping[str, Any], num_heads: int = 1) -> LayerDims:
    """Read the sizes and bias flags of ``layer`` from its weights (and ``num_heads``)."""
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; known layers: {list(LAYERS)}")
    if layer == "SelfAttentionV1":
        d_in, d_out = _primary(params, "W_query", layer)
        return LayerDims(d_in, d_out, 1, False, False)
    if layer.startswith("Fused"):
        _, hidden_size = _primary(params, "Wqkv.weight", layer)
        bias = "Wqkv.bias" in params
        if layer == "FusedSingleHeadAttention":
            if hidden_size < 4:
                raise ValueError(
                    f"hidden_size={hidden_size} must be at least 4 for {layer} "
                    "(its head size is hidden_size // 4)"
                )
            return LayerDims(hidden_size, hidden_size // 4, 1, bias, bias)
        check_divisible("hidden_size", hidden_size, num_heads)
        return LayerDims(hidden_size, hidden_size, num_heads, bias, bias)
    prefix = "heads.0." if layer == "MultiHeadAttentionWrapper" else ""
    d_out, d_in = _primary(params, f"{prefix}W_query.weight", layer)
    qkv_bias = f"{prefix}W_query.bias" in params
    if layer == "MultiHeadAttentionWrapper":
        check_divisible("num_heads", num_heads, 1)
        held = sum(1 for k in params if k.startswith("heads.") and k.endswith(".W_query.weight"))
        if held != num_heads:
            raise ValueError(f"num_heads={num_heads} disagrees with the weights, which hold {held} heads")
        return LayerDims(d_in, d_out, num_heads, qkv_bias, False)
    if layer == "MultiHeadAttention":
        check_divisible("d_out", d_out, num_heads)
        return LayerDims(d_in, d_out, num_heads, qkv_bias, "out_proj.bias" in params)
    return LayerDims(d_in, d_out, 1, qkv_bias, False)


def check_layer(
    layer: str,
    params: Mapping[str, Any],
    x: Any,
    *,
    num_heads: int = 1,
    context_length: int | None = None,
    context_name: str = "context_length",
    dropouts: Mapping[str, float] | None = None,
    attn_keep_mask: Any = None,
    out_keep_mask: Any = None,
    padding_mask: Any = None,
    check_values: bool = True,
    floating: tuple[str, ...] = NUMPY_FLOATS,
    implementation: str = "reference",
    block_size: int = 512,
) -> LayerDims:
    """Validate one layer call up front and return its sizes.

    Checks, in order: ``implementation`` and ``block_size``, ``num_heads`` against the weights,
    each dropout probability in ``dropouts`` (name -> p), the input's dtype (one of
    ``floating``), rank, non-empty axes and width, the weights' keys, shapes (every bad key
    named, see ``param_shapes``) and dtype,
    ``T <= context_length`` and, with ``check_values``, that every weight is finite; then the
    shapes and dtypes of the masks given: ``attn_keep_mask`` must match the attention weights
    (``(B, N, T, S)``, no N for single-head classes), ``out_keep_mask`` the output
    ``(B, T, D)``, ``padding_mask`` ``(B, S)``.
    """
    check_implementation(implementation, block_size)
    dims = infer_dims(layer, params, num_heads)
    expected = param_shapes(
        layer,
        d_in=dims.d_in,
        d_out=dims.d_out,
        num_heads=dims.num_heads,
        qkv_bias=dims.qkv_bias,
        out_bias=dims.out_bias,
    )
    for name, p in (dropouts or {}).items():
        check_dropout(name, p)
    shape = check_input(x, layout=LAYERS[layer], d_in=dims.d_in, floating=floating)
    check_params(params, expected, layer=layer, dtype=x.dtype)
    if context_length is not None:
        check_context_length(shape, context_length, context_name)
    if check_values:
        check_finite(params)
    if attn_keep_mask is not None:
        heads = (dims.num_heads,) if layer in MULTI_HEAD else ()
        attn_shape = shape[:-2] + heads + (shape[-2], shape[-2])
        check_keep_mask("attn_keep_mask", attn_keep_mask, attn_shape)
    if out_keep_mask is not None:
        check_keep_mask("out_keep_mask", out_keep_mask, shape)
    if padding_mask is not None:
        check_padding_mask(padding_mask, shape[0], shape[1])
    return dims
