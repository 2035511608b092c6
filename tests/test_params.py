"""The one weights format: torch state_dict names, torch layout, checked both ways."""

import itertools
import re

import numpy as np
import pytest
import torch

import numpy_attn
import torch_ref
from parity_tests.cases import FUNCTION_NAMES, Case
from torch_ref import load_params, to_params

LAYERS = list(FUNCTION_NAMES)


@pytest.mark.parametrize("layer, bias", list(itertools.product(LAYERS, [False, True])))
def test_parameter_shapes_is_the_torch_state_dict(layer, bias):
    case = Case(layer, d_in=5, d_out=8, num_heads=2, bias=bias)
    module = case.build_torch()
    buffers = {name for name, _ in module.named_buffers()}
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in buffers}
    arguments = numpy_attn.constructor_arguments(layer, module.state_dict(), **case.kwargs())
    actual = numpy_attn.parameter_shapes(layer, **arguments)
    assert list(actual.items()) == list(expected.items())  # same names, shapes and order
    assert set(to_params(module)) == set(expected)


@pytest.mark.parametrize("layer", LAYERS)
def test_round_trip_is_bit_identical(layer):
    case = Case(layer, d_in=5, d_out=8, num_heads=2, bias=True, dtype="float64")
    source = case.build_torch()
    params = to_params(source)
    target = case.with_(seed=1).build_torch()  # other weights
    load_params(target, params)
    for name, value in to_params(target).items():
        assert value.dtype == params[name].dtype
        np.testing.assert_array_equal(value, params[name])
    x = torch.from_numpy(case.make_input())
    args = (x,)
    assert torch.equal(source(*args), target(*args))


def test_bfloat16_round_trip():
    module = Case("MultiHeadAttention", d_in=4, d_out=4).build_torch().to(torch.bfloat16)
    params = to_params(module)
    assert params["W_query.weight"].dtype.name == "bfloat16"
    load_params(module, params)
    assert torch.equal(module.W_query.weight, torch_ref.from_numpy(params["W_query.weight"]))


def mha_params():
    return to_params(Case("MultiHeadAttention", d_in=3, d_out=4, bias=False).build_torch())


def test_load_names_every_missing_unexpected_and_misshaped_key():
    params = mha_params()
    del params["W_key.weight"]
    params["W_key.bais"] = np.zeros(4, np.float32)
    params["out_proj.weight"] = np.zeros((4, 3), np.float32)
    module = Case("MultiHeadAttention", d_in=3, d_out=4).build_torch()
    message = (
        r"params do not fit MultiHeadAttention: missing keys \['W_key.weight'\]; "
        r"unexpected keys \['W_key.bais'\]; mis-shaped keys: 'out_proj.weight' has shape "
        r"\(4, 3\), expected \(4, 4\)"
    )
    with pytest.raises(ValueError, match=message):
        load_params(module, params)
    with pytest.raises(ValueError, match=message):
        numpy_attn.multi_head_attention(
            params, np.zeros((1, 2, 3), np.float32), num_heads=2, context_length=6
        )


def test_load_rejects_non_finite_weights_and_non_mappings():
    params = mha_params()
    params["W_value.weight"] = params["W_value.weight"].copy()
    params["W_value.weight"][0, 0] = np.nan
    module = Case("MultiHeadAttention", d_in=3, d_out=4).build_torch()
    with pytest.raises(ValueError, match=re.escape("params['W_value.weight'] has non-finite values")):
        load_params(module, params)
    with pytest.raises(TypeError, match="params must be a mapping"):
        load_params(module, [("W_query.weight", np.zeros((4, 3)))])


def test_load_casts_to_the_module_dtype():
    params = {k: v.astype(np.float64) for k, v in mha_params().items()}
    module = load_params(Case("MultiHeadAttention", d_in=3, d_out=4).build_torch(), params)
    assert module.W_query.weight.dtype == torch.float32
    np.testing.assert_array_equal(
        to_params(module)["W_query.weight"], params["W_query.weight"].astype(np.float32)
    )


def numpy_attn_error(params):
    """The error numpy_attn's MultiHeadAttention function raises for these weights."""
    x = np.zeros((1, 2, 3), np.float32)
    with pytest.raises((TypeError, ValueError)) as error:
        numpy_attn.multi_head_attention(params, x, num_heads=2, context_length=6)
    return error


def bad_mha_params(key, value):
    params = dict(mha_params())
    params[key] = value
    return params


@pytest.mark.parametrize(
    "params",
    [
        bad_mha_params("W_key.weight", mha_params()["W_key.weight"].astype(">f4")),  # big-endian
        bad_mha_params("W_key.weight", np.full((4, 3), np.inf, np.float32)),
        bad_mha_params("W_key.weight", mha_params()["W_key.weight"].tolist()),  # not an array
        bad_mha_params(1, np.zeros(2, np.float32)),  # a non-str key
    ],
    ids=["big-endian", "inf", "list", "int key"],
)
def test_load_refuses_what_numpy_attn_refuses_with_its_text(params):
    """The same mistake, the same error type and text as numpy_attn's weights checks."""
    expected = numpy_attn_error(params)
    module = Case("MultiHeadAttention", d_in=3, d_out=4).build_torch()
    with pytest.raises(expected.type, match=f"^{re.escape(str(expected.value))}$"):
        load_params(module, params)


@pytest.mark.parametrize(
    "value, dtype",
    [
        (np.full((4, 3), 1 + 5j, np.complex64), "complex64"),  # was loaded as 1.0, the 5j dropped
        (np.ones((4, 3), bool), "bool"),  # was loaded as 1.0 / 0.0
        (np.ones((4, 3), np.int64), "int64"),
        (np.full((4, 3), None), "object"),
        (torch.ones(4, 3, dtype=torch.bool), "bool"),
        (torch.ones(4, 3, dtype=torch.complex64), "complex64"),
    ],
)
def test_load_refuses_weights_that_are_not_floating(value, dtype):
    module = Case("MultiHeadAttention", d_in=3, d_out=4).build_torch()
    before = to_params(module)
    message = (
        f"params['W_key.weight'] has dtype {dtype}; weights are float16, float32, float64 or bfloat16 "
        "(cast to the module's dtype)"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        load_params(module, bad_mha_params("W_key.weight", value))
    assert all(np.array_equal(to_params(module)[k], v) for k, v in before.items())  # nothing copied


@pytest.mark.parametrize("module_dtype, largest", [(torch.float32, "3.40282e+38"), (torch.float16, "65504")])
def test_load_names_finite_values_that_overflow_the_module_dtype(module_dtype, largest):
    """1e300 is finite: not 'non-finite values' (the check ran after the cast), but too large."""
    module = Case("MultiHeadAttention", d_in=3, d_out=4).build_torch().to(module_dtype)
    before = to_params(module)
    params = {k: v.astype(np.float64) for k, v in mha_params().items()}
    params["out_proj.weight"][1, 2] = 1e300 if module_dtype == torch.float32 else 1e5
    message = (
        f"params['out_proj.weight'] has values too large for the module's dtype "
        f"{str(module_dtype).removeprefix('torch.')} (largest finite {largest})"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_params(module, params)
    assert all(np.array_equal(to_params(module)[k], v) for k, v in before.items())  # nothing copied


def test_load_takes_torch_and_bfloat16_weights_as_floating():
    params = {k: torch.from_numpy(v).to(torch.bfloat16).requires_grad_() for k, v in mha_params().items()}
    module = load_params(Case("MultiHeadAttention", d_in=3, d_out=4).build_torch(), params)
    assert torch.equal(module.W_query.weight, params["W_query.weight"].detach().float())
