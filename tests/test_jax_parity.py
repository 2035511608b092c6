"""Every step of jax_attn (eager and jitted) and of the Flax modules equals torch_ref."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
from parity_tests.cases import FUNCTION_NAMES, SHAPES, case_product
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context, run_flax, run_jax, run_torch
from tests.covering import covering_params, pairwise
from torch_ref import to_params

DTYPES = ["float32", "float64", "bfloat16"]
RUNNERS = {
    "jax_eager": lambda case, params, x: run_jax(case, params, x),
    "jax_jit": lambda case, params, x: run_jax(case, params, x, jit=True),
    "flax_nnx_jit": run_flax,
}
# Every run of the product class x shape x bias x dtype x runner is checked: `make test` runs a
# pairwise covering set of it (every value of each axis meets every value of every other axis;
# each run compiles a program), `make test-slow` runs the rest.
AXES = {"layer": list(FUNCTION_NAMES), "shape": list(SHAPES), "bias": [False, True], "dtype": DTYPES}
RUNS = [(case, runner) for case in case_product(*AXES.values()) for runner in RUNNERS]
FAST_RUNS = [
    (next(case_product(*([row[axis]] for axis in AXES))), row["runner"])
    for row in pairwise({**AXES, "runner": list(RUNNERS)})
]


def check_every_step(case, runner):
    module = case.build_torch()
    x = case.make_input()
    expected = run_torch(module, x)[1]
    with jax_context(case.dtype):
        actual_output, actual = RUNNERS[runner](case, to_params(module), x)
        report = compare_steps(expected, actual)
    assert report.ok, f"\n{report}"
    assert list(actual) == list(expected)
    assert actual_output.dtype == case.dtype  # bfloat16 stays bfloat16, float64 stays float64


@pytest.mark.parametrize(
    "case, runner", covering_params(RUNS, FAST_RUNS), ids=[f"{case.id}-{runner}" for case, runner in RUNS]
)
def test_functions_and_modules_match_torch(case, runner):
    check_every_step(case, runner)


BATCHED = [layer for layer in FUNCTION_NAMES if layer not in ("SelfAttentionV1", "SelfAttentionV2")]


@pytest.mark.parametrize("layer", BATCHED)
def test_vmap_over_examples_agrees_with_batching(layer):
    case = next(case_product([layer], ["full_context"], [True], ["float64"]))
    params, x = to_params(case.build_torch()), case.make_input()
    fn = getattr(jax_attn, case.function_name)
    with jax_context("float64"):
        batched = fn(params, x, **case.kwargs())
        one_example = lambda example: fn(params, example[None], **case.kwargs())[0]  # noqa: E731
        mapped = jax.vmap(one_example)(jnp.asarray(x))
    np.testing.assert_allclose(mapped, batched, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["SelfAttentionV1", "SelfAttentionV2"])
def test_vmap_gives_the_two_dimensional_classes_a_batch(layer):
    case = next(case_product([layer], ["full_context"], [True], ["float64"]))
    params = to_params(case.build_torch())
    xs = np.random.default_rng(5).standard_normal((4, *case.input_shape))
    fn = getattr(jax_attn, case.function_name)
    with jax_context("float64"):
        mapped = jax.vmap(lambda x: fn(params, x))(jnp.asarray(xs))
        one_by_one = np.stack([fn(params, x) for x in xs])
    np.testing.assert_allclose(mapped, one_by_one, rtol=1e-12, atol=1e-12)
