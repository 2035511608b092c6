"""Same inputs, weights and key: bit-identical results, call after call."""

import jax
import numpy as np
import pytest
from flax import nnx

import jax_attn
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context, run_case, run_jax
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)


def case_for(layer):
    return Case(layer, batch=2, tokens=7, d_in=5, d_out=8, num_heads=2, bias=True, seed=12)


def assert_identical(first, second):
    assert list(first) == list(second)
    for name in first:
        np.testing.assert_array_equal(np.asarray(first[name]), np.asarray(second[name]), err_msg=name)


@pytest.mark.parametrize("layer", LAYERS)
def test_repeated_calls_are_bit_identical(layer):
    case = case_for(layer)
    params, x = to_params(case.build_torch()), case.make_input()
    rng = lambda: np.random.default_rng(7)  # noqa: E731
    key = jax.random.key(7)
    dropout = 0.2 if case.kwargs(0.2) != case.kwargs(0.0) else 0.0
    random = {"rng": rng} if dropout else {}
    numpy_runs = [
        run_case("numpy", case, params, x, dropout=dropout, **{k: v() for k, v in random.items()})[1]
        for _ in range(2)
    ]
    assert_identical(*numpy_runs)
    with jax_context("float32"):
        keys = {"key": key} if dropout else {}
        assert_identical(*(run_jax(case, params, x, dropout=dropout, **keys)[1] for _ in range(2)))
        assert_identical(*(run_jax(case, params, x, dropout=dropout, jit=True, **keys)[1] for _ in range(2)))
        modules = [
            getattr(jax_attn, layer).from_params(params, **case.kwargs(dropout), rngs=nnx.Rngs(3))
            for _ in range(2)
        ]
        np.testing.assert_array_equal(*(np.asarray(module(x)) for module in modules))


@pytest.mark.parametrize("layer", LAYERS)
def test_eager_and_jit_agree_within_the_float32_tolerance(layer):
    """Not bit for bit: under jit XLA fuses the softmax and reorders its reductions, so the two
    differ in the last bits (measured over the float32 shape table: at most 3.6e-7 of a step's
    largest magnitude, about 3 ulps); the tolerance table holds."""
    case = case_for(layer)
    params, x = to_params(case.build_torch()), case.make_input()
    with jax_context("float32"):
        report = compare_steps(run_jax(case, params, x)[1], run_jax(case, params, x, jit=True)[1])
    assert report.ok, f"\n{report}"
