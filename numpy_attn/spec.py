"""One definition per layer: ``SPECS``, and every view the project derives from it.

A ``LayerSpec`` describes one torch class of the notes, framework-neutrally: its name, the
numpy_attn/jax_attn function that computes it, its constructor's arguments and defaults, its
weights as templates over those arguments, its buffers, its steps and its structure (how it
projects, whether it is causal, what it drops). One table gives the weights from the arguments
(``parameter_shapes``) and the arguments from the weights (``constructor_arguments``); the door's
checks, the fast paths, the Flax modules, the CLI's choices and the tests' cases all read it.

The weights format of the whole project is a plain ``dict[str, array]`` keyed by the torch
class's ``state_dict`` names (buffers excluded), in torch's layout: ``nn.Linear`` stores
``weight`` as ``(out_features, in_features)``; ``SelfAttentionV1`` stores ``W_query`` as
``(d_in, d_out)`` and uses it as ``x @ W_query``.

Adding a layer: its ``LayerSpec`` here, its math in one file per framework (``numpy_attn/<module>.py``,
``jax_attn/<module>.py``: both packages export it from the spec), its torch class in torch_ref and
its Flax module.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numpy_attn.checks import check_array, check_divisible, check_mapping, check_params, check_size

Shapes = dict[str, tuple[int, ...]]
QKV = ("W_query", "W_key", "W_value")  # the notes' three projections
ATTENTION_STEPS = ("queries", "keys", "values", "attn_scores", "attn_weights", "context_vec", "output")
CAUSAL_STEPS = (
    "queries", "keys", "values", "attn_scores", "masked_scores", "attn_weights",
    "attn_weights_dropped", "context_vec", "output",
)  # fmt: skip
_DIM = re.compile(r"^(?:(\d+) \* )?\(?([a-z_]+)(?: // (\d+))?\)?$")  # "3 * (hidden_size // 4)"


@dataclass(frozen=True)
class Weight:
    """One ``state_dict`` entry: its ``name`` (``{i}``: once per head of a stack), its ``shape`` as
    expressions of the constructor's arguments (``"d_out"``, ``"3 * hidden_size"``,
    ``"hidden_size // 4"``) and the bool argument that adds it (``flag``; None: always there)."""

    name: str
    shape: tuple[str, ...]
    flag: str | None = None

    def size(self, axis: int, arguments: Mapping[str, Any]) -> int:
        times, name, per = _parse(self.shape[axis])
        return int(arguments[name]) // per * times


@functools.cache
def _parse(dim: str) -> tuple[int, str, int]:
    """``"3 * (hidden_size // 4)"`` -> ``(3, "hidden_size", 4)``."""
    times, name, per = _DIM.match(dim).groups()
    return int(times or 1), name, int(per or 1)


def linear(name: str, d_in: str, d_out: str, bias: str | None) -> tuple[Weight, ...]:
    """An ``nn.Linear(d_in, d_out, bias=...)``: ``weight`` ``(d_out, d_in)``, and ``bias``
    ``(d_out,)`` when the flag argument ``bias`` is true (None: never)."""
    biases = () if bias is None else (Weight(f"{name}.bias", (d_out,), bias),)
    return (Weight(f"{name}.weight", (d_out, d_in)), *biases)


def _qkv(bias: str) -> tuple[Weight, ...]:
    return tuple(w for name in QKV for w in linear(name, "d_in", "d_out", bias))


@dataclass(frozen=True)
class LayerSpec:
    """Everything about one attention class that is not its math.

    ``module`` is the file of each package that holds its math (``numpy_attn/<module>.py``,
    ``jax_attn/<module>.py``), ``function`` its name there and in the packages. ``arguments``:
    the constructor arguments the layer function takes as keywords; ``context``: the one
    bounding T (the class's mask buffer); ``dropouts``: dropout probabilities (the first on the
    attention weights, ``out_dropout`` on the output); ``head_width``: the argument that
    ``num_heads`` divides; ``buffers``: the last name parts of the class's buffers (in its
    ``state_dict()``, not in the weights format). Structure: ``qkv`` is ``"matrices"``
    (``x @ W``), ``"linear"`` (three ``nn.Linear``) or ``"fused"`` (one ``Wqkv``), ``out`` the
    output projection, ``heads`` the class of each head of a stack (the wrapper).
    """

    name: str
    module: str
    function: str
    constructor: tuple[str, ...]
    defaults: Mapping[str, Any]
    weights: tuple[Weight, ...]
    arguments: tuple[str, ...] = ()
    context: str | None = None
    dropouts: tuple[str, ...] = ()
    out_dropout: str | None = None
    head_width: str | None = None
    buffers: tuple[str, ...] = ()
    steps: tuple[str, ...] = ATTENTION_STEPS
    input_layout: str = "(B, T, D)"
    qkv: str = "linear"
    out: str | None = None
    causal: bool = False
    padding: bool = False
    heads: str | None = None

    @property
    def multi_head(self) -> bool:
        """Whether the attention weights carry the N axis."""
        return "num_heads" in self.constructor

    @property
    def input_width(self) -> str:
        return "hidden_size" if "hidden_size" in self.constructor else "d_in"

    @property
    def static(self) -> tuple[str, ...]:
        """The function's arguments that shape the computation: static under ``jax.jit``."""
        return self.arguments

    def shapes(self, **arguments: Any) -> Shapes:
        """The weights' names and torch-layout shapes, in torch's order."""
        arguments = {**self.defaults, **arguments}
        try:
            return dict(_shapes(self.name, tuple(sorted(arguments.items()))))
        except TypeError:  # an unhashable argument: the checks name it
            return self._shapes(arguments)

    def _shapes(self, arguments: Mapping[str, Any]) -> Shapes:
        stack = range(arguments["num_heads"]) if self.heads else [None]
        return {
            weight.name.format(i=i): tuple(weight.size(axis, arguments) for axis in range(len(weight.shape)))
            for i in stack
            for weight in self.weights
            if weight.flag is None or arguments[weight.flag]
        }

    def count(self, **arguments: Any) -> int:
        """How many weights the class holds, counted without listing them (a stack of heads too)."""
        one = self.shapes(**{**arguments, "num_heads": 1}) if self.heads else self.shapes(**arguments)
        return sum(math.prod(shape) for shape in one.values()) * (arguments["num_heads"] if self.heads else 1)

    def implied(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[Any, str]]:
        """The constructor arguments the weights' ``shapes`` tell, each with its evidence
        (``"W_query.weight has shape (4, 3)"``), for the messages."""
        return dict(_implied(self.name, tuple(shapes.items())))

    def _implied(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[Any, str]]:
        implied: dict[str, tuple[Any, str]] = {}
        if self.heads:
            first = self.weights[0].name
            pattern = re.compile(re.escape(first).replace(r"\{i\}", r"\d+"))
            held = sum(1 for key in shapes if pattern.fullmatch(key))
            implied["num_heads"] = (held, f"they hold {held} heads (heads.0 to heads.{held - 1})")
        for weight in self.weights:
            key = weight.name.format(i=0)
            if weight.flag is not None:
                present = key in shapes
                implied.setdefault(weight.flag, (present, f"{key} is {'present' if present else 'absent'}"))
                continue
            bare = [(axis, dim) for axis, dim in enumerate(weight.shape) if dim.isidentifier()]
            if any(dim not in implied for _, dim in bare):
                shape = _evidence_shape(self.name, shapes, key, len(weight.shape))
                for axis, dim in bare:
                    implied.setdefault(dim, (shape[axis], f"{key} has shape {shape}"))
        return implied


@functools.lru_cache(maxsize=256)
def _implied(
    layer: str, shapes: tuple[tuple[str, tuple[int, ...]], ...]
) -> tuple[tuple[str, tuple[Any, str]], ...]:
    """``LayerSpec.implied``, a pure function of the weights' shapes: read once per layer and shapes."""
    return tuple(SPECS[layer]._implied(dict(shapes)).items())


@functools.lru_cache(maxsize=256)
def _shapes(layer: str, arguments: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``LayerSpec.shapes``, a pure function of the sizes: evaluated once per layer and sizes."""
    return tuple(SPECS[layer]._shapes(dict(arguments)).items())


def _evidence_shape(
    layer: str, shapes: Mapping[str, tuple[int, ...]], key: str, rank: int
) -> tuple[int, ...]:
    """The shape of the weight that fixes a layer's sizes, with a clear error if it cannot."""
    if key not in shapes:
        raise ValueError(f"params do not fit {layer}: missing keys [{key!r}] (got keys {sorted(shapes)})")
    shape = tuple(shapes[key])
    if len(shape) != rank or 0 in shape:
        raise ValueError(
            f"params do not fit {layer}: mis-shaped keys: {key!r} has shape {shape}, "
            "expected a non-empty 2-D matrix"
        )
    return shape


# The eight classes of the notes, in the book's order.
SPECS: dict[str, LayerSpec] = {
    spec.name: spec
    for spec in (
        LayerSpec(
            "SelfAttentionV1", "self_attention", "self_attention_v1", ("d_in", "d_out"), {},
            weights=tuple(Weight(name, ("d_in", "d_out")) for name in QKV),
            input_layout="(T, D)", qkv="matrices",
        ),
        LayerSpec(
            "SelfAttentionV2", "self_attention", "self_attention_v2", ("d_in", "d_out", "qkv_bias"),
            {"qkv_bias": False},
            weights=_qkv("qkv_bias"), input_layout="(T, D)",
        ),
        LayerSpec(
            "CausalAttention", "causal", "causal_attention",
            ("d_in", "d_out", "context_length", "dropout", "qkv_bias"), {"dropout": 0.0, "qkv_bias": False},
            weights=_qkv("qkv_bias"), arguments=("context_length", "dropout"), context="context_length",
            dropouts=("dropout",), buffers=("mask",), steps=CAUSAL_STEPS, causal=True,
        ),
        LayerSpec(
            "MultiHeadAttentionWrapper", "causal", "multi_head_attention_wrapper",
            ("d_in", "d_out", "context_length", "dropout", "num_heads", "qkv_bias"),
            {"dropout": 0.0, "qkv_bias": False},
            weights=tuple(Weight("heads.{i}." + w.name, w.shape, w.flag) for w in _qkv("qkv_bias")),
            arguments=("num_heads", "context_length", "dropout"), context="context_length",
            dropouts=("dropout",), buffers=("mask",), steps=("context_vec", "output"), causal=True,
            heads="CausalAttention",
        ),
        LayerSpec(
            "MultiHeadAttention", "multi_head", "multi_head_attention",
            ("d_in", "d_out", "context_length", "dropout", "num_heads", "qkv_bias", "out_bias"),
            {"dropout": 0.0, "qkv_bias": False, "out_bias": True},
            weights=(*_qkv("qkv_bias"), *linear("out_proj", "d_out", "d_out", "out_bias")),
            arguments=("num_heads", "context_length", "dropout"), context="context_length",
            dropouts=("dropout",), head_width="d_out", buffers=("mask",), steps=CAUSAL_STEPS,
            out="out_proj", causal=True,
        ),
        LayerSpec(
            "FusedSingleHeadAttention", "fused", "fused_single_head_attention", ("hidden_size", "bias"),
            {"bias": True},
            weights=(
                *linear("Wqkv", "hidden_size", "3 * (hidden_size // 4)", "bias"),
                *linear("Wo", "hidden_size // 4", "hidden_size", "bias"),
            ),
            qkv="fused", out="Wo",
        ),
        LayerSpec(
            "FusedMultiHeadAttention", "fused", "fused_multi_head_attention",
            ("hidden_size", "num_heads", "bias"), {"bias": True},
            weights=(
                *linear("Wqkv", "hidden_size", "3 * hidden_size", "bias"),
                *linear("Wo", "hidden_size", "hidden_size", "bias"),
            ),
            arguments=("num_heads",), head_width="hidden_size", qkv="fused", out="Wo",
        ),
        LayerSpec(
            "FusedCausalAttention", "fused", "fused_causal_attention",
            ("hidden_size", "num_heads", "context_size", "attn_drop", "out_drop", "bias"),
            {"attn_drop": 0.1, "out_drop": 0.1, "bias": True},
            weights=(
                *linear("Wqkv", "hidden_size", "3 * hidden_size", "bias"),
                *linear("Wo", "hidden_size", "hidden_size", "bias"),
            ),
            arguments=("num_heads", "context_size", "attn_drop", "out_drop"), context="context_size",
            dropouts=("attn_drop", "out_drop"), out_dropout="out_drop", head_width="hidden_size",
            buffers=("causal_mask",), steps=(*CAUSAL_STEPS[:-1], "projected", "output"),
            qkv="fused", out="Wo", causal=True, padding=True,
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
    return layer_spec(layer).shapes(**arguments)


def parameter_names(layer: str, **arguments: Any) -> list[str]:
    """The state_dict names of ``layer``'s weights (buffers excluded), in torch's order."""
    return list(parameter_shapes(layer, **arguments))


def check_sizes(spec: LayerSpec, arguments: Mapping[str, Any]) -> None:
    """The sizes the torch class would refuse: ``num_heads`` must divide the width it splits, and
    every weight dimension must be at least 1 (``hidden_size // 4`` needs ``hidden_size >= 4``)."""
    if spec.head_width and "num_heads" in arguments:
        check_divisible(spec.head_width, arguments[spec.head_width], arguments["num_heads"])
    for weight, dim, name, per in _divided(spec.name):
        if name in arguments and arguments[name] < per:
            raise ValueError(
                f"{name}={arguments[name]} must be at least {per} for {spec.name} "
                f"({weight} has a dimension {dim})"
            )


@functools.cache
def _divided(layer: str) -> tuple[tuple[str, str, str, int], ...]:
    """The dimensions of ``layer``'s weights that divide an argument: (weight, dim, argument, divisor)."""
    return tuple(
        (weight.name, dim, _parse(dim)[1], _parse(dim)[2])
        for weight in SPECS[layer].weights
        for dim in weight.shape
        if _parse(dim)[2] > 1
    )


def read_arguments(spec: LayerSpec, params: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The given constructor arguments, checked against the weights' shapes and completed by them
    and by the class's defaults (the required ones the weights cannot tell may still be absent)."""
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
    arguments = {**spec.defaults, **given, **{name: value for name, (value, _) in implied.items()}}
    check_sizes(spec, arguments)
    return arguments


def without_buffers(layer: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The weights of a torch ``state_dict()`` of ``layer``: its buffers (``mask``,
    ``heads.{i}.mask``, ``causal_mask``) left out, every other key kept for the checks to name."""
    check_mapping(params)
    buffers = layer_spec(layer).buffers
    return {name: value for name, value in params.items() if name.rsplit(".", 1)[-1] not in buffers}


def constructor_arguments(layer: str, params: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """The full keyword arguments of the torch class ``layer``'s constructor for weights ``params``.

    ``params`` may hold NumPy, JAX or torch arrays, and may be a torch ``state_dict()`` as is (its
    buffers are ignored). Sizes and bias flags come from the weights' shapes; the other arguments
    from ``given``, else the class's defaults.
    Raises: ValueError naming both values where a given argument contradicts the weights ("d_in=8
    contradicts the weights: W_query.weight has shape (4, 3), so d_in=3"), the required arguments
    the weights cannot tell, and every missing, unexpected and mis-shaped weight; TypeError for an
    argument the class does not take.
    """
    spec = layer_spec(layer)
    weights = without_buffers(layer, params)
    arguments = read_arguments(spec, weights, given)
    if spec.context in arguments:  # the layer function's check: a positive int
        check_size(spec.context, arguments[spec.context])
    missing = [name for name in spec.constructor if name not in arguments]
    if missing:
        raise ValueError(f"{layer} needs {', '.join(missing)}: the weights do not tell them")
    check_params(weights, spec.shapes(**arguments), layer=layer)
    return {name: arguments[name] for name in spec.constructor}
