"""A layer's constructor arguments read from its weights, checked against the ones given.

A private stand-in for ``numpy_attn.spec.constructor_arguments`` (being added on another
branch): the Flax modules' ``from_params`` calls it in one place, and the lead swaps it for the
spec function when both branches meet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numpy_attn.spec import LAYERS, infer_dims
from numpy_attn.validation import check_mapping

__all__: list[str] = []

# layer -> constructor argument that the weights determine -> the ``LayerDims`` field holding it
_FROM_WEIGHTS: dict[str, dict[str, str]] = {
    "SelfAttentionV1": {"d_in": "d_in", "d_out": "d_out"},
    "SelfAttentionV2": {"d_in": "d_in", "d_out": "d_out", "qkv_bias": "qkv_bias"},
    "CausalAttention": {"d_in": "d_in", "d_out": "d_out", "qkv_bias": "qkv_bias"},
    "MultiHeadAttentionWrapper": {
        "d_in": "d_in",
        "d_out": "d_out",
        "num_heads": "num_heads",
        "qkv_bias": "qkv_bias",
    },
    "MultiHeadAttention": {"d_in": "d_in", "d_out": "d_out", "qkv_bias": "qkv_bias", "out_bias": "out_bias"},
    "FusedSingleHeadAttention": {"hidden_size": "d_in", "bias": "qkv_bias"},
    "FusedMultiHeadAttention": {"hidden_size": "d_in", "bias": "qkv_bias"},
    "FusedCausalAttention": {"hidden_size": "d_in", "bias": "qkv_bias"},
}
# layer -> name of the causal-mask buffer its torch class registers (the wrapper: one per head)
_BUFFERS = {
    "CausalAttention": "mask",
    "MultiHeadAttention": "mask",
    "MultiHeadAttentionWrapper": "mask",
    "FusedCausalAttention": "causal_mask",
}


def _without_buffers(layer: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The weights of a torch ``state_dict()``: its causal-mask buffers (``mask``,
    ``heads.{i}.mask`` in the wrapper, ``causal_mask``) left out; every other key is kept, for
    the weights check to name."""
    check_mapping(params)
    buffer = _BUFFERS.get(layer)
    return {name: value for name, value in params.items() if name.split(".")[-1] != buffer}


def _primary_key(layer: str) -> str:
    if layer == "SelfAttentionV1":
        return "W_query"
    if layer.startswith("Fused"):
        return "Wqkv.weight"
    return "heads.0.W_query.weight" if layer == "MultiHeadAttentionWrapper" else "W_query.weight"


def _evidence(layer: str, argument: str, params: Mapping[str, Any]) -> str:
    """What in the weights fixes ``argument``: a shape, or a bias present or absent."""
    if argument.endswith("bias"):
        key = {"out_bias": "out_proj.bias", "bias": "Wqkv.bias"}.get(argument, "W_query.bias")
        key = "heads.0." + key if layer == "MultiHeadAttentionWrapper" else key
        return f"{key} is {'present' if key in params else 'absent'}"
    key = _primary_key(layer)
    return f"{key} has shape {tuple(params[key].shape)}"


def _held_heads(params: Mapping[str, Any]) -> int:
    return sum(1 for name in params if name.startswith("heads.") and name.endswith(".W_query.weight"))


def _constructor_arguments(layer: str, params: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """Every argument in ``given``, plus the sizes and bias flags that ``params`` determine.

    ``params`` is the layer's weights (any arrays; causal-mask buffers are ignored). A given
    argument that contradicts the weights raises ValueError naming both values:
    ``d_in=8 contradicts the weights: W_query.weight has shape (4, 3), so d_in=3``.
    """
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; known layers: {list(LAYERS)}")
    params = _without_buffers(layer, params)
    fields = _FROM_WEIGHTS[layer]
    # the wrapper holds one set of weights per head (infer_dims names a num_heads that disagrees)
    default_heads = _held_heads(params) if "num_heads" in fields else 1
    dims = infer_dims(layer, params, given.get("num_heads", default_heads))
    arguments = dict(given)
    for argument, field in fields.items():
        inferred = getattr(dims, field)
        if argument in given and given[argument] != inferred:
            raise ValueError(
                f"{argument}={given[argument]!r} contradicts the weights: "
                f"{_evidence(layer, argument, params)}, so {argument}={inferred!r}"
            )
        arguments[argument] = inferred
    return arguments
