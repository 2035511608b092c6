"""Numerics at the edges: huge scores, half precision, long sequences, NaN, fully masked rows."""

import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn
from parity_tests.arrays import to_float64
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context, run_case, run_jax, run_torch
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)
CAUSAL = {"CausalAttention", "MultiHeadAttentionWrapper", "MultiHeadAttention", "FusedCausalAttention"}


def as_float64(params):
    return {name: value.astype(np.float64) for name, value in params.items()}


def max_score(steps):
    return max(np.abs(v).max() for k, v in steps.items() if k.endswith("attn_scores"))


@pytest.mark.parametrize("layer", LAYERS)
def test_scores_of_1e4_in_float32_stay_finite_and_match_float64(layer):
    case = Case(layer, batch=2, tokens=8, d_in=6, d_out=8, num_heads=2, bias=True, seed=4)
    params = to_params(case.build_torch())
    x = case.make_input()
    while (scores := max_score(run_case("numpy", case, params, x)[1])) < 1e4:
        x = (x * np.sqrt(1.05e4 / scores)).astype(np.float32)  # scores grow about as |x|^2
    expected = run_case("numpy", case.with_(dtype="float64"), as_float64(params), x.astype(np.float64))[1]
    with jax_context("float32"):
        actual = {"numpy": run_case("numpy", case, params, x)[1], "jax": run_jax(case, params, x)[1]}
    for framework, steps in actual.items():
        for name, value in steps.items():
            assert np.isfinite(np.asarray(value)[np.isfinite(expected[name])]).all(), (framework, name)
        report = compare_steps(expected, steps)  # float32 tolerances: the less precise dtype
        assert report.ok, f"{framework}\n{report}"


@pytest.mark.parametrize("layer", ["MultiHeadAttention", "FusedCausalAttention", "SelfAttentionV2"])
def test_long_sequences_with_tiny_widths(layer):
    case = Case(layer, batch=1, tokens=1024, d_in=2, d_out=2, num_heads=1, bias=True, dtype="float64")
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = run_torch(module, x)[1]
    with jax_context("float64"):
        reports = [compare_steps(expected, run_case("numpy", case, params, x)[1])]
        reports.append(compare_steps(expected, run_jax(case, params, x)[1]))
    for report in reports:
        assert report.ok, f"\n{report}"


@pytest.mark.parametrize("layer", LAYERS)
def test_nan_in_one_token_stays_in_its_sequence(layer):
    """A NaN in token t of sequence 0 reaches the attention weights of the queries that see key t
    (queries t.. in causal classes, every query otherwise) and every output of sequence 0: a
    hidden key's weight is 0, and 0 * NaN is NaN in the weights @ values product, in torch as in
    NumPy and JAX. It never reaches another sequence of the batch."""
    case = Case(layer, batch=2, tokens=6, d_in=4, d_out=4, num_heads=2, bias=True, dtype="float64", seed=6)
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    t = 3
    x[(0, t, 1) if x.ndim == 3 else (t, 1)] = np.nan
    with jax_context("float64"):
        traces = {
            "torch": run_torch(module, x)[1],
            "numpy": run_case("numpy", case, params, x)[1],
            "jax": run_jax(case, params, x)[1],
        }
    sequence = (0,) if x.ndim == 3 else ()
    for framework, steps in traces.items():
        output = to_float64(steps["output"])
        assert np.isnan(output[sequence]).all(), framework
        if x.ndim == 3:
            assert np.isfinite(output[1]).all(), framework
        weights = to_float64(steps["attn_weights" if "attn_weights" in steps else "heads.0.attn_weights"])
        weights = weights[sequence]  # (N, T, S) or (T, S)
        first_reached = t if layer in CAUSAL else 0
        assert np.isfinite(weights[..., :first_reached, :]).all(), framework
        assert np.isnan(weights[..., first_reached:, :]).any(axis=-1).all(), framework


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_fully_masked_rows_give_zeros_in_jax(jit):
    case = Case("FusedCausalAttention", batch=2, tokens=5, d_out=8, num_heads=2, bias=True, dtype="float64")
    params, x = to_params(case.build_torch()), case.make_input()
    padding_mask = np.array([[True, True, False, False, False], [False] * 5])
    with jax_context("float64"):
        output, steps = run_jax(case, params, x, padding_mask, jit=jit)
        numpy_output = run_case("numpy", case, params, x, padding_mask)[0]
    assert (np.asarray(steps["attn_weights"])[0, :, :2] == 0).all()
    np.testing.assert_array_equal(np.asarray(output)[0, :2], np.broadcast_to(params["Wo.bias"], (2, 8)))
    np.testing.assert_allclose(np.asarray(output), numpy_output, rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_have_zero_gradients_in_jax():
    """The softmax's maximum is a constant for differentiation: no NaN gradient leaks in."""
    import jax

    scores = jnp.array([[-jnp.inf, -jnp.inf], [0.5, 1.0]])
    grads = jax.grad(lambda s: jnp.sum(jax_attn.softmax(s) * jnp.array([[1.0, 2.0], [3.0, 4.0]])))(scores)
    assert np.isfinite(np.asarray(grads)).all()
    np.testing.assert_array_equal(np.asarray(grads)[0], [0.0, 0.0])


@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
def test_a_float16_softmax_over_thousands_of_keys_is_the_float32_one_rounded(package):
    """Half precision is accumulated in float32: a float16 sum over 8192 weights of ~1e-4 would lose
    the last ~30% of the row (float16's spacing near 1 is ~1e-3)."""
    rng = np.random.default_rng(12)
    scores = rng.standard_normal((3, 8192)).astype(np.float16)
    expected = numpy_attn.softmax(scores.astype(np.float32)).astype(np.float16)  # rounded once
    actual = np.asarray(package.softmax(scores))
    assert actual.dtype == np.float16
    np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32), rtol=1e-3, atol=0)
    assert abs(actual.astype(np.float64).sum(axis=-1) - 1).max() < 1e-2  # the weights sum to 1
