"""Gradients: jax.grad of sum(output * cotangent) equals torch autograd, for x and every weight."""

import itertools

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
from tests.covering import covering_params, pairwise
from torch_ref import from_numpy, to_params


def grad_case(layer: str, bias: bool, dtype: str) -> Case:
    return Case(layer, batch=2, tokens=5, d_in=6, d_out=8, num_heads=2, bias=bias, dtype=dtype, seed=11)


def cotangent_for(case, output_shape):
    rng = np.random.default_rng(99)
    return rng.standard_normal(output_shape).astype(case.dtype)


# class x bias x dtype: `make test` runs a pairwise covering set, `make test-slow` the rest
AXES = {"layer": list(FUNCTION_NAMES), "bias": [False, True], "dtype": ["float32", "float64"]}
RUNS = list(itertools.product(*AXES.values()))
FAST_RUNS = [tuple(row[axis] for axis in AXES) for row in pairwise(AXES)]


def run_id(run):
    layer, bias, dtype = run
    return f"{layer}-bias{int(bias)}-{dtype}"


@pytest.mark.parametrize("layer, bias, dtype", covering_params(RUNS, FAST_RUNS), ids=map(run_id, RUNS))
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
