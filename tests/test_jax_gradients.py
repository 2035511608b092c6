"""Gradients: jax.grad of sum(output * cotangent) equals torch autograd, for x and every weight."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_attn
from jax_attn.convert import torch_name, torch_value
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context
from parity_tests.gradients import jax_gradients, torch_gradients
from torch_ref import from_numpy, to_params


def grad_case(layer: str, bias: bool, dtype: str) -> Case:
    return Case(layer, batch=2, tokens=5, d_in=6, d_out=8, num_heads=2, bias=bias, dtype=dtype, seed=11)


def cotangent_for(case, output_shape):
    rng = np.random.default_rng(99)
    return rng.standard_normal(output_shape).astype(case.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bias", [False, True], ids=["bias0", "bias1"])
@pytest.mark.parametrize("layer", list(FUNCTION_NAMES))
def test_gradients_match_torch_autograd(layer, bias, dtype):
    case = grad_case(layer, bias, dtype)
    module = case.build_torch()
    x = case.make_input()
    cotangent = cotangent_for(case, module(from_numpy(x)).shape)
    expected = torch_gradients(module, x, cotangent)
    with jax_context(dtype):
        actual = jax_gradients(case, to_params(module), x, cotangent)
        report = compare_steps(expected, actual)
    assert report.ok, f"\n{report}"
    assert set(actual) == set(expected) == {"x", *to_params(module)}


@pytest.mark.parametrize("layer", list(FUNCTION_NAMES))
def test_flax_module_gradients_match_torch_autograd(layer):
    """nnx.grad through a module: its kernel gradients are torch's weight gradients, transposed."""
    case = grad_case(layer, True, "float64")
    module = case.build_torch()
    x = case.make_input()
    cotangent = cotangent_for(case, module(from_numpy(x)).shape)
    expected = torch_gradients(module, x, cotangent)
    expected.pop("x")
    with jax_context("float64"):
        flax_module = getattr(jax_attn, layer).from_params(to_params(module), **case.kwargs())

        @nnx.jit
        def grads(flax_module, x):
            return nnx.grad(lambda m: jnp.sum(m(x) * cotangent))(flax_module)

        actual = {  # the gradient state, read back in torch names and layout
            torch_name(path): torch_value(path, variable[...])
            for path, variable in nnx.to_flat_state(grads(flax_module, x))
        }
        report = compare_steps(expected, actual)
    assert report.ok, f"\n{report}"
