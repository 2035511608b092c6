"""One definition per layer: ``SPECS``, and every view the project derives from it.

A ``LayerSpec`` describes one torch class of the notes, framework-neutrally: its name, the
numpy_attn/jax_attn function and Flax module that implement it, its constructor's arguments and
defaults, the names and torch-layout shapes of its weights as a function of those arguments,
which arguments the weights imply, its buffers and its steps. Weight checking
(``check_layer``), shape inference (``constructor_arguments``), step names, the CLI's choices and
the tests' parametrisation all read ``SPECS``. Adding a class = one ``LayerSpec`` here + its
three implementations (torch_ref class, numpy_attn/jax_attn function, Flax module).

The weights format of the whole project is a plain ``dict[str, array]`` keyed by the torch
class's ``state_dict`` names (buffers excluded), in torch's layout: ``nn.Linear`` stores
``weight`` as ``(out_features, in_features)``; ``SelfAttentionV1`` stores ``W_query`` as
``(d_in, d_out)`` and uses it as ``x @ W_query``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from numpy_attn.implementation import DEFAULT_BLOCK_SIZE, check_implementation
from numpy_attn.validation import (
    NUMPY_FLOATS,
    QKV,
    check_array,
    check_context_length,
    check_divisible,
    check_dropout,
    check_finite,
    check_flag,
    check_input,
    check_keep_mask,
    check_mapping,
    check_padding_mask,
    check_params,
    check_size,
)

__all__ = [
    "LAYERS",
    "SPECS",
    "LayerSpec",
    "check_layer",
    "check_masks",
    "check_sizes",
    "check_weights",
    "constructor_arguments",
    "layer_spec",
    "parameter_names",
    "parameter_shapes",
    "step_names",
    "without_buffers",
]

Shapes = dict[str, tuple[int, ...]]
# constructor argument -> (value the weights imply, the evidence: "W_query.weight has shape (4, 3)")
Implied = dict[str, tuple[Any, str]]

ATTENTION_STEPS = ("queries", "keys", "values", "attn_scores", "attn_weights", "context_vec", "output")
CAUSAL_STEPS = (
    "queries", "keys", "values", "attn_scores", "masked_scores", "attn_weights",
    "attn_weights_dropped", "context_vec", "output",
)  # fmt: skip


@dataclass(frozen=True)
class LayerSpec:
    """Everything about one attention class that is not its math.

    ``weights(**arguments)`` gives the state_dict names and torch-layout shapes, in torch's order,
    from the constructor's arguments; ``implied(shapes)`` reads the arguments that the weights'
    shapes tell (with the evidence, for error messages). ``arguments`` are the constructor
    arguments the layer function takes as keywords; ``context`` the one bounding T;
    ``dropouts`` the dropout probabilities; ``head_width`` the argument that ``num_heads`` must
    divide. ``buffers`` are the last name components of the class's buffers (``mask``): they are
    in ``state_dict()`` but not in the weights format. ``steps`` are the step names of
    ``return_steps=True`` after those of its heads, if it is a stack of ``heads`` (the class of
    each head, see ``step_names``); ``multi_head`` says whether the attention weights carry the
    N axis.
    """

    name: str
    function: str
    constructor: tuple[str, ...]
    defaults: Mapping[str, Any]
    weights: Callable[..., Shapes]
    implied: Callable[[Mapping[str, tuple[int, ...]]], Implied]
    arguments: tuple[str, ...] = ()
    context: str | None = None
    dropouts: tuple[str, ...] = ()
    head_width: str | None = None
    buffers: tuple[str, ...] = ()
    steps: tuple[str, ...] = ATTENTION_STEPS
    heads: str | None = None
    multi_head: bool = False
    input_layout: str = "(B, T, D)"


def _linear(name: str, d_in: int, d_out: int, bias: bool) -> Shapes:
    shapes = {f"{name}.weight": (d_out, d_in)}
    if bias:
        shapes[f"{name}.bias"] = (d_out,)
    return shapes


def _qkv(d_in: int, d_out: int, qkv_bias: bool, prefix: str = "") -> Shapes:
    return {k: v for name in QKV for k, v in _linear(prefix + name, d_in, d_out, qkv_bias).items()}


def _shape(layer: str, shapes: Mapping[str, tuple[int, ...]], key: str) -> tuple[int, int]:
    """The shape of the weight that fixes a layer's sizes, with a clear error if it is absent."""
    if key not in shapes:
        raise ValueError(f"params do not fit {layer}: missing keys [{key!r}] (got keys {sorted(shapes)})")
    shape = shapes[key]
    if len(shape) != 2 or 0 in shape:
        raise ValueError(
            f"params do not fit {layer}: mis-shaped keys: {key!r} has shape {shape}, "
            "expected a non-empty 2-D matrix"
        )
    return shape


def _present(shapes: Mapping[str, Any], key: str) -> tuple[bool, str]:
    return key in shapes, f"{key} is {'present' if key in shapes else 'absent'}"


def _read_projections(layer: str, shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> Implied:
    """``d_in``, ``d_out`` and ``qkv_bias`` from ``W_query`` (an ``nn.Linear``)."""
    key = f"{prefix}W_query.weight"
    d_out, d_in = _shape(layer, shapes, key)
    evidence = f"{key} has shape {(d_out, d_in)}"
    bias = _present(shapes, f"{prefix}W_query.bias")
    return {"d_in": (d_in, evidence), "d_out": (d_out, evidence), "qkv_bias": bias}


def _read_v1(shapes: Mapping[str, tuple[int, ...]]) -> Implied:
    d_in, d_out = _shape("SelfAttentionV1", shapes, "W_query")
    evidence = f"W_query has shape {(d_in, d_out)}"
    return {"d_in": (d_in, evidence), "d_out": (d_out, evidence)}


def _read_wrapper(shapes: Mapping[str, tuple[int, ...]]) -> Implied:
    implied = _read_projections("MultiHeadAttentionWrapper", shapes, prefix="heads.0.")
    held = sum(1 for k in shapes if k.startswith("heads.") and k.endswith(".W_query.weight"))
    return implied | {"num_heads": (held, f"they hold {held} heads (heads.0 to heads.{held - 1})")}


def _read_fused(layer: str) -> Callable[[Mapping[str, tuple[int, ...]]], Implied]:
    def read(shapes: Mapping[str, tuple[int, ...]]) -> Implied:
        shape = _shape(layer, shapes, "Wqkv.weight")
        hidden_size = shape[1]
        return {
            "hidden_size": (hidden_size, f"Wqkv.weight has shape {shape}"),
            "bias": _present(shapes, "Wqkv.bias"),
        }

    return read


def _read_multi_head(shapes: Mapping[str, tuple[int, ...]]) -> Implied:
    implied = _read_projections("MultiHeadAttention", shapes)
    return implied | {"out_bias": _present(shapes, "out_proj.bias")}


def _fused_weights(hidden_size: int, bias: bool, head_dim: int) -> Shapes:
    """Note 003's ``Wqkv`` (D -> 3 x head_dim) and ``Wo`` (head_dim -> D)."""
    return _linear("Wqkv", hidden_size, 3 * head_dim, bias) | _linear("Wo", head_dim, hidden_size, bias)


def _wrapper_weights(d_in: int, d_out: int, num_heads: int, qkv_bias: bool = False, **_: Any) -> Shapes:
    return {k: v for i in range(num_heads) for k, v in _qkv(d_in, d_out, qkv_bias, f"heads.{i}.").items()}


# The eight classes of the notes, in the notes' order.
SPECS: dict[str, LayerSpec] = {
    spec.name: spec
    for spec in (
        LayerSpec(
            "SelfAttentionV1", "self_attention_v1", ("d_in", "d_out"), {},
            weights=lambda d_in, d_out, **_: {name: (d_in, d_out) for name in QKV},
            implied=_read_v1, input_layout="(T, D)",
        ),
        LayerSpec(
            "SelfAttentionV2", "self_attention_v2", ("d_in", "d_out", "qkv_bias"), {"qkv_bias": False},
            weights=lambda d_in, d_out, qkv_bias, **_: _qkv(d_in, d_out, qkv_bias),
            implied=lambda shapes: _read_projections("SelfAttentionV2", shapes), input_layout="(T, D)",
        ),
        LayerSpec(
            "CausalAttention", "causal_attention",
            ("d_in", "d_out", "context_length", "dropout", "qkv_bias"), {"dropout": 0.0, "qkv_bias": False},
            weights=lambda d_in, d_out, qkv_bias, **_: _qkv(d_in, d_out, qkv_bias),
            implied=lambda shapes: _read_projections("CausalAttention", shapes),
            arguments=("context_length", "dropout"), context="context_length", dropouts=("dropout",),
            buffers=("mask",), steps=CAUSAL_STEPS,
        ),
        LayerSpec(
            "MultiHeadAttentionWrapper", "multi_head_attention_wrapper",
            ("d_in", "d_out", "context_length", "dropout", "num_heads", "qkv_bias"),
            {"dropout": 0.0, "qkv_bias": False},
            weights=_wrapper_weights, implied=_read_wrapper,
            arguments=("num_heads", "context_length", "dropout"), context="context_length",
            dropouts=("dropout",), buffers=("mask",), steps=("context_vec", "output"),
            heads="CausalAttention", multi_head=True,
        ),
        LayerSpec(
            "MultiHeadAttention", "multi_head_attention",
            ("d_in", "d_out", "context_length", "dropout", "num_heads", "qkv_bias", "out_bias"),
            {"dropout": 0.0, "qkv_bias": False, "out_bias": True},
            weights=lambda d_in, d_out, qkv_bias, out_bias, **_: (
                _qkv(d_in, d_out, qkv_bias) | _linear("out_proj", d_out, d_out, out_bias)
            ),
            implied=_read_multi_head, arguments=("num_heads", "context_length", "dropout"),
            context="context_length", dropouts=("dropout",), head_width="d_out", buffers=("mask",),
            steps=CAUSAL_STEPS, multi_head=True,
        ),
        LayerSpec(
            "FusedSingleHeadAttention", "fused_single_head_attention", ("hidden_size", "bias"),
            {"bias": True},
            weights=lambda hidden_size, bias, **_: _fused_weights(hidden_size, bias, hidden_size // 4),
            implied=_read_fused("FusedSingleHeadAttention"),
        ),
        LayerSpec(
            "FusedMultiHeadAttention", "fused_multi_head_attention", ("hidden_size", "num_heads", "bias"),
            {"bias": True},
            weights=lambda hidden_size, bias, **_: _fused_weights(hidden_size, bias, hidden_size),
            implied=_read_fused("FusedMultiHeadAttention"), arguments=("num_heads",),
            head_width="hidden_size", multi_head=True,
        ),
        LayerSpec(
            "FusedCausalAttention", "fused_causal_attention",
            ("hidden_size", "num_heads", "context_size", "attn_drop", "out_drop", "bias"),
            {"attn_drop": 0.1, "out_drop": 0.1, "bias": True},
            weights=lambda hidden_size, bias, **_: _fused_weights(hidden_size, bias, hidden_size),
            implied=_read_fused("FusedCausalAttention"),
            arguments=("num_heads", "context_size", "attn_drop", "out_drop"), context="context_size",
            dropouts=("attn_drop", "out_drop"), head_width="hidden_size", buffers=("causal_mask",),
            steps=(*CAUSAL_STEPS[:-1], "projected", "output"), multi_head=True,
        ),
    )
}  # fmt: skip

# Layer name -> input layout. V1 and V2 take 2-D input as in the notes (they use ``keys.T``).
LAYERS: dict[str, str] = {name: spec.input_layout for name, spec in SPECS.items()}


def layer_spec(layer: str) -> LayerSpec:
    """The spec of the torch class named ``layer``; ValueError naming the known ones otherwise."""
    if layer not in SPECS:
        raise ValueError(f"unknown layer {layer!r}; known layers: {list(SPECS)}")
    return SPECS[layer]


def step_names(layer: str, num_heads: int = 1) -> list[str]:
    """The step names of ``layer``'s ``return_steps=True``, in order: a stack of heads records
    each head's steps under ``heads.{i}.`` first."""
    spec = layer_spec(layer)
    if spec.heads is None:
        return list(spec.steps)
    head_steps = [f"heads.{i}.{step}" for i in range(num_heads) for step in step_names(spec.heads)]
    return head_steps + list(spec.steps)


def parameter_shapes(layer: str, **arguments: Any) -> Shapes:
    """The state_dict names and torch-layout shapes of ``layer``'s weights, in torch's order,
    from the torch constructor's arguments (``d_in=3, d_out=2, num_heads=2, ...``; the class's
    defaults fill the rest)."""
    spec = layer_spec(layer)
    return spec.weights(**(spec.defaults | arguments))


def parameter_names(layer: str, **arguments: Any) -> list[str]:
    """The state_dict names of ``layer``'s weights (buffers excluded), in torch's order."""
    return list(parameter_shapes(layer, **arguments))


def _read(spec: LayerSpec, params: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The given arguments, checked against the weights' shapes and completed by them and by the
    class's defaults (required arguments the weights cannot tell may still be absent)."""
    unknown = sorted(set(given) - set(spec.constructor))
    if unknown:
        raise TypeError(
            f"{spec.name} takes no argument(s) {unknown}; its arguments are {list(spec.constructor)}"
        )
    check_mapping(params)
    implied = spec.implied({key: check_array(f"params[{key!r}]", value) for key, value in params.items()})
    for name, (value, evidence) in implied.items():
        if name in given and given[name] != value:
            raise ValueError(
                f"{name}={given[name]!r} contradicts the weights: {evidence}, so {name}={value!r}"
            )
    arguments = dict(spec.defaults) | dict(given) | {name: value for name, (value, _) in implied.items()}
    check_sizes(spec.name, arguments)
    return arguments


def check_sizes(layer: str, arguments: Mapping[str, Any]) -> None:
    """The sizes among ``arguments`` that the torch class would refuse: ``num_heads`` must divide
    the width it splits; ``FusedSingleHeadAttention``'s head size ``hidden_size // 4`` must be
    at least 1."""
    spec = layer_spec(layer)
    if spec.head_width and "num_heads" in arguments:
        check_divisible(spec.head_width, arguments[spec.head_width], arguments["num_heads"])
    if layer == "FusedSingleHeadAttention" and arguments.get("hidden_size", 4) < 4:
        raise ValueError(
            f"hidden_size={arguments['hidden_size']} must be at least 4 for {layer} "
            "(its head size is hidden_size // 4)"
        )


def without_buffers(layer: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The weights of a torch ``state_dict()`` of ``layer``: its buffers (``mask``,
    ``heads.{i}.mask``, ``causal_mask``) left out, every other key kept for the checks to name."""
    check_mapping(params)
    buffers = layer_spec(layer).buffers
    return {name: value for name, value in params.items() if name.rsplit(".", 1)[-1] not in buffers}


def constructor_arguments(layer: str, params: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """The full keyword arguments of the torch class ``layer``'s constructor for weights ``params``.

    ``params`` may hold NumPy, JAX or torch arrays, and may be a torch ``state_dict()`` as is:
    the class's buffers (``mask``, ``causal_mask``) are ignored. Sizes and bias flags come from
    the weights' shapes; the other arguments from ``given``, else the class's defaults. Raises
    ValueError naming both values where a given argument contradicts the weights ("d_in=8
    contradicts the weights: W_query.weight has shape (4, 3), so d_in=3"), naming the required
    arguments the weights cannot tell (``context_length``) when they are missing, and naming every
    missing, unexpected and mis-shaped weight; TypeError for an argument the class does not take.
    A context length given is checked as the layer function checks it (``check_size``).
    """
    spec = layer_spec(layer)
    weights = without_buffers(layer, params)
    arguments = _read(spec, weights, given)
    if spec.context in arguments:  # the layer function's check: a positive int
        check_size(spec.context, arguments[spec.context])
    missing = [name for name in spec.constructor if name not in arguments]
    if missing:
        raise ValueError(f"{layer} needs {', '.join(missing)}: the weights do not tell them")
    check_params(weights, spec.weights(**arguments), layer=layer)
    return {name: arguments[name] for name in spec.constructor}


def check_weights(layer: str, params: Mapping[str, Any], num_heads: int = 1) -> dict[str, Any]:
    """Check that ``params`` are ``layer``'s weights (``num_heads`` must agree with them where the
    class takes it): one ValueError names every missing, unexpected and mis-shaped key. Returns
    the constructor arguments known from them (those the weights imply, ``num_heads``, the
    class's defaults), from which ``parameter_shapes`` gives the names in torch's order."""
    spec = layer_spec(layer)
    arguments = _read(spec, params, {"num_heads": num_heads} if "num_heads" in spec.constructor else {})
    check_params(params, spec.weights(**arguments), layer=layer)
    return arguments


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
    block_size: int = DEFAULT_BLOCK_SIZE,
    return_steps: bool = False,
) -> dict[str, Any]:
    """Validate one layer call up front; return the constructor arguments known so far (those the
    weights imply, ``num_heads``, the defaults).

    Checks, in order: the layer's ``context_length`` (named ``context_name``) is a positive int,
    ``implementation`` and ``block_size``, ``num_heads`` against the weights,
    each dropout probability in ``dropouts`` (name -> p), the input's dtype (one of
    ``floating``), rank, non-empty axes and width, the weights' keys, shapes (every bad key
    named, from ``SPECS``) and dtype, ``T <= context_length``, the shapes and dtypes of the
    masks given (``attn_keep_mask`` must match the attention weights, ``(B, N, T, S)``, no N for
    single-head classes; ``out_keep_mask`` the output ``(B, T, D)``; ``padding_mask`` ``(B, S)``,
    True = padding); then, with ``check_values``, that every weight is finite; last, that
    ``return_steps`` is a bool (``check_flag``: the string ``"no"`` would have meant yes).

    All but the last two look at shapes, dtypes and the other arguments only. When every array
    is a NumPy array, their verdict is remembered (``_check_described``), keyed by those shapes,
    dtypes and arguments: a call like an earlier one that passed costs the last two alone.
    A failing call is never remembered: it raises the same error every time.
    """
    masks = (attn_keep_mask, out_keep_mask, padding_mask)
    dropouts = dropouts or {}
    scalars = (num_heads, context_length, implementation, block_size, *dropouts.values())
    described = _describe(params, x, masks)
    if described is None or not _hashable(scalars):  # another framework's arrays, a list...
        arguments = _check_structure(
            layer, params, x, masks, context_name, floating, dropouts, num_heads, context_length,
            implementation, block_size,
        )  # fmt: skip
    else:
        arguments = _check_described(layer, *described, context_name, floating, tuple(dropouts), *scalars)
    if check_values:
        check_finite(params)
    check_flag("return_steps", return_steps)
    return dict(arguments)  # a copy: the remembered one stays as it is


_MASK_TYPES = (type(None), np.ndarray)


def _describe(params: Any, x: Any, masks: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The shapes and dtypes of a call's arrays, ``(weights, x, masks)``, when the weights are a
    dict of NumPy arrays and x and the masks given are NumPy arrays; None otherwise."""
    if type(params) is not dict or type(x) is not np.ndarray:
        return None
    weights = tuple([(name, w.shape, w.dtype) for name, w in params.items() if type(w) is np.ndarray])
    given = tuple([m if m is None else (m.shape, m.dtype) for m in masks if type(m) in _MASK_TYPES])
    if len(weights) != len(params) or len(given) != len(masks):
        return None
    return weights, (x.shape, x.dtype), given


def _hashable(values: tuple[Any, ...]) -> bool:
    """Whether ``values`` can key the remembered verdicts (``num_heads=[2]`` cannot)."""
    try:
        hash(values)
    except TypeError:
        return False
    return True


@functools.lru_cache(maxsize=256, typed=True)  # typed: 1 and True (refused) get their own verdicts
def _check_described(
    layer: str,
    weights: tuple[tuple[str, tuple[int, ...], np.dtype], ...],
    x: tuple[tuple[int, ...], np.dtype],
    masks: tuple[tuple[tuple[int, ...], np.dtype] | None, ...],
    context_name: str,
    floating: tuple[str, ...],
    dropout_names: tuple[str, ...],
    num_heads: int,
    context_length: int | None,
    implementation: str,
    block_size: int,
    *dropout_values: float,
) -> dict[str, Any]:
    """``_check_structure`` of the call ``_describe`` described, on stand-in arrays: read-only
    views of one element with the real shapes and dtypes (the checks read nothing else)."""

    def stand_in(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.broadcast_to(np.empty((), dtype), shape)

    return _check_structure(
        layer, {name: stand_in(shape, dtype) for name, shape, dtype in weights}, stand_in(*x),
        tuple(None if mask is None else stand_in(*mask) for mask in masks), context_name, floating,
        dict(zip(dropout_names, dropout_values, strict=True)), num_heads, context_length,
        implementation, block_size,
    )  # fmt: skip


def _check_structure(
    layer: str,
    params: Mapping[str, Any],
    x: Any,
    masks: tuple[Any, Any, Any],
    context_name: str,
    floating: tuple[str, ...],
    dropouts: Mapping[str, float],
    num_heads: int,
    context_length: int | None,
    implementation: str,
    block_size: int,
) -> dict[str, Any]:
    """Every check of ``check_layer`` but the finite weights, in its order."""
    spec = layer_spec(layer)
    if spec.context is not None:  # the classes whose mask buffer bounds T
        check_size(context_name, context_length)
    check_implementation(implementation, block_size)
    arguments = _read(spec, params, {"num_heads": num_heads} if "num_heads" in spec.constructor else {})
    for name, p in dropouts.items():
        check_dropout(name, p)
    d_in = arguments["hidden_size"] if "hidden_size" in arguments else arguments["d_in"]
    shape = check_input(x, layout=spec.input_layout, d_in=d_in, floating=floating)
    check_params(params, spec.weights(**arguments), layer=layer, dtype=x.dtype)
    if context_length is not None:
        check_context_length(shape, context_length, context_name)
    check_masks(layer, shape, arguments.get("num_heads", 1), *masks)
    return arguments


def check_masks(
    layer: str,
    shape: tuple[int, ...],
    num_heads: int,
    attn_keep_mask: Any = None,
    out_keep_mask: Any = None,
    padding_mask: Any = None,
) -> None:
    """The shapes and dtypes of the masks a call of ``layer`` on an input of ``shape`` was given:
    ``attn_keep_mask`` must match the attention weights (``(B, N, T, S)``, no N for single-head
    classes), ``out_keep_mask`` the output ``(B, T, D)`` (True = keep), ``padding_mask``
    ``(B, S)`` (True = padding)."""
    if attn_keep_mask is not None:
        heads = (num_heads,) if layer_spec(layer).multi_head else ()
        attn_shape = tuple(shape[:-2]) + heads + (shape[-2], shape[-2])
        check_keep_mask("attn_keep_mask", attn_keep_mask, attn_shape)
    if out_keep_mask is not None:
        check_keep_mask("out_keep_mask", out_keep_mask, shape)
    if padding_mask is not None:
        check_padding_mask(padding_mask, shape[0], shape[1])
