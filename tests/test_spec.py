"""The layer specs: each has its three implementations, and agrees with the torch class it describes."""

import inspect
import re

import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn
import torch_ref
from numpy_attn.spec import SPECS, constructor_arguments, parameter_names, parameter_shapes, step_names
from parity_tests.cases import Case
from torch_ref import to_params

LAYERS = list(SPECS)
# keyword arguments every layer function has beside the constructor's (the framework's randomness,
# keep-masks, the implementation and the step trace)
CALL_OPTIONS = {
    "rng", "key", "attn_keep_mask", "out_keep_mask", "implementation", "block_size", "return_steps",
}  # fmt: skip


@pytest.mark.parametrize("layer", LAYERS)
def test_every_spec_has_its_three_implementations(layer):
    spec = SPECS[layer]
    assert inspect.isclass(getattr(torch_ref, spec.name))
    assert callable(getattr(numpy_attn, spec.function))
    assert callable(getattr(jax_attn, spec.function))
    assert inspect.isclass(getattr(jax_attn, spec.name))  # the Flax NNX module


@pytest.mark.parametrize("layer", LAYERS)
def test_constructor_and_defaults_are_the_torch_class(layer):
    spec = SPECS[layer]
    parameters = inspect.signature(getattr(torch_ref, layer).__init__).parameters
    assert tuple(parameters)[1:] == spec.constructor
    torch_defaults = {n: p.default for n, p in parameters.items() if p.default is not p.empty}
    assert {n: v for n, v in spec.defaults.items() if n in torch_defaults} == torch_defaults
    assert set(spec.defaults) - set(torch_defaults) <= {"dropout"}  # the notes require it; 0 = eval


@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
@pytest.mark.parametrize("layer", LAYERS)
def test_layer_functions_take_the_arguments_the_weights_cannot_tell(layer, package):
    parameters = inspect.signature(getattr(package, SPECS[layer].function)).parameters
    keywords = [n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [n for n in keywords if n not in CALL_OPTIONS] == list(SPECS[layer].arguments)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layer", LAYERS)
def test_weights_and_buffers_are_the_torch_state_dict(layer, bias):
    case = Case(layer, d_in=5, d_out=8, num_heads=2, bias=bias, out_bias=not bias)
    module = case.build_torch()
    arguments = case.constructor_arguments()
    expected = {k: tuple(v.shape) for k, v in module.named_parameters()}
    assert list(parameter_shapes(layer, **arguments).items()) == list(expected.items())  # order too
    assert parameter_names(layer, **arguments) == list(expected)
    buffers = {name.rsplit(".", 1)[-1] for name, _ in module.named_buffers()}
    assert buffers == set(SPECS[layer].buffers)


@pytest.mark.parametrize("layer", LAYERS)
def test_step_names_are_the_steps_every_framework_returns(layer):
    case = Case(layer, num_heads=2)
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = step_names(layer, num_heads=2)
    torch_steps = module(torch_ref.from_numpy(x), return_steps=True)[1]
    numpy_steps = getattr(numpy_attn, case.function_name)(params, x, **case.kwargs(), return_steps=True)[1]
    assert list(torch_steps) == expected
    assert list(numpy_steps) == expected


CONVERSIONS = {
    "torch": lambda state: state,
    "numpy": lambda state: {k: v.numpy() for k, v in state.items()},
    "jax": lambda state: {k: jnp.asarray(v.numpy()) for k, v in state.items()},
}


@pytest.mark.parametrize("arrays", list(CONVERSIONS))
@pytest.mark.parametrize("layer", LAYERS)
def test_constructor_arguments_of_a_state_dict(layer, arrays):
    case = Case(layer, d_in=5, d_out=8, num_heads=2, bias=True, out_bias=False, context_length=7)
    state = CONVERSIONS[arrays](case.build_torch().state_dict())  # buffers included
    expected = case.constructor_arguments()
    actual = constructor_arguments(layer, state, **case.kwargs())
    assert actual == expected
    assert list(actual) == list(SPECS[layer].constructor)


def mha_params():
    return to_params(Case("MultiHeadAttention", d_in=3, d_out=4, bias=False).build_torch())


@pytest.mark.parametrize(
    "layer, given, message",
    [
        (
            "MultiHeadAttention",
            {"d_in": 8},
            "d_in=8 contradicts the weights: W_query.weight has shape (4, 3), so d_in=3",
        ),
        (
            "MultiHeadAttention",
            {"d_out": 2},
            "d_out=2 contradicts the weights: W_query.weight has shape (4, 3), so d_out=4",
        ),
        (
            "MultiHeadAttention",
            {"qkv_bias": True},
            "qkv_bias=True contradicts the weights: W_query.bias is absent, so qkv_bias=False",
        ),
        (
            "MultiHeadAttention",
            {"out_bias": False},
            "out_bias=False contradicts the weights: out_proj.bias is present, so out_bias=True",
        ),
        (
            "MultiHeadAttentionWrapper",
            {"num_heads": 3},
            "num_heads=3 contradicts the weights: they hold 2 heads (heads.0 to heads.1), so num_heads=2",
        ),
        (
            "FusedCausalAttention",
            {"hidden_size": 6},
            "hidden_size=6 contradicts the weights: Wqkv.weight has shape (12, 4), so hidden_size=4",
        ),
        (
            "FusedCausalAttention",
            {"bias": False},
            "bias=False contradicts the weights: Wqkv.bias is present, so bias=True",
        ),
    ],
)  # fmt: skip
def test_an_argument_that_contradicts_the_weights_names_both_values(layer, given, message):
    case = Case(layer, d_in=3, d_out=4, num_heads=2, bias=layer.startswith("Fused"))
    params = to_params(case.build_torch())
    with pytest.raises(ValueError, match=re.escape(message)):
        constructor_arguments(layer, params, **(case.kwargs() | given))


def test_missing_required_arguments_are_named():
    message = "MultiHeadAttention needs context_length, num_heads: the weights do not tell them"
    with pytest.raises(ValueError, match=message):
        constructor_arguments("MultiHeadAttention", mha_params())


def test_defaults_fill_what_is_not_given():
    arguments = constructor_arguments("MultiHeadAttention", mha_params(), context_length=6, num_heads=2)
    assert arguments["dropout"] == 0.0 and arguments["qkv_bias"] is False and arguments["out_bias"] is True
    fused = to_params(Case("FusedCausalAttention", d_out=4, num_heads=2).build_torch())
    arguments = constructor_arguments("FusedCausalAttention", fused, num_heads=2, context_size=6)
    assert (arguments["attn_drop"], arguments["out_drop"]) == (0.1, 0.1)  # the notes' defaults


@pytest.mark.parametrize(
    "given, error, message",
    [
        ({"num_heads": 3}, ValueError, "d_out=4 is not divisible by num_heads=3"),
        ({"num_heads": 2, "heads": 2}, TypeError, r"MultiHeadAttention takes no argument\(s\) \['heads'\]"),
    ],
)
def test_arguments_the_class_refuses(given, error, message):
    with pytest.raises(error, match=message):
        constructor_arguments("MultiHeadAttention", mha_params(), context_length=6, **given)


def test_weights_are_checked_by_name_and_shape():
    params = mha_params()
    params["out_proj.weight"] = np.zeros((4, 3), np.float32)
    params["W_key.bais"] = np.zeros(4, np.float32)
    message = (
        r"params do not fit MultiHeadAttention: unexpected keys \['W_key.bais'\]; mis-shaped keys: "
        r"'out_proj.weight' has shape \(4, 3\), expected \(4, 4\)"
    )
    with pytest.raises(ValueError, match=message):
        constructor_arguments("MultiHeadAttention", params, context_length=6, num_heads=2)


def test_unknown_layer_is_named():
    with pytest.raises(ValueError, match=r"unknown layer 'Attention'; known layers: \['SelfAttentionV1'"):
        constructor_arguments("Attention", {})
