"""Same inputs, weights and key: bit-identical results, call after call."""

import jax
import numpy as np
import pytest
from flax import nnx

import jax_attn
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.frameworks import jax_context, run_case, run_jax
from tests.covering import each_value_params
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)
# the layers with dropout run at this probability in both tests: the float32 programs compiled
# for the first test serve the second from the run's compilation cache
DROPOUT = 0.5


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
    dropout = DROPOUT if case.kwargs(DROPOUT) != case.kwargs(0.0) else 0.0
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


DTYPES = ["float32", "float64", "bfloat16"]


# every layer and every dtype in `make test` (one mechanism, jax_attn.compiled, serves them all;
# each run compiles two programs); `make test-slow` runs the rest of layer x dtype
@pytest.mark.parametrize("layer, dtype", each_value_params({"layer": LAYERS, "dtype": DTYPES}))
def test_eager_and_jit_are_bit_identical(layer, dtype):
    """An eager call runs the very program jax.jit compiles (jax_attn.compiled)."""
    case = case_for(layer).with_(dtype=dtype)
    params, x = to_params(case.build_torch()), case.make_input()
    with jax_context(dtype):
        keep = {}
        if case.kwargs(DROPOUT) != case.kwargs(0.0):
            keep = {"key": jax.random.key(5)}
        dropout = DROPOUT if keep else 0.0
        eager = run_jax(case, params, x, dropout=dropout, **keep)[1]
        jitted = run_jax(case, params, x, dropout=dropout, jit=True, **keep)[1]
        assert_identical(eager, jitted)
