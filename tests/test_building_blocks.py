"""The building blocks on tiny cases worked out by hand (what a learner reads first)."""

import math

import numpy as np
import pytest

import jax_attn
import numpy_attn
from parity_tests.tolerances import tolerance_for


def test_softmax_by_hand():
    np.testing.assert_allclose(numpy_attn.softmax(np.array([0.0, math.log(3.0)])), [0.25, 0.75], rtol=1e-15)
    np.testing.assert_array_equal(numpy_attn.softmax(np.array([[2.0, 2.0], [-1.0, -1.0]])), [[0.5, 0.5]] * 2)


def test_softmax_subtracts_the_row_maximum():
    big = np.array([1000.0, 1000.0 + math.log(3.0)])
    np.testing.assert_allclose(numpy_attn.softmax(big), [0.25, 0.75], rtol=1e-12)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(numpy_attn.softmax_naive(big)).all()  # exp(1000) overflows: inf / inf


def test_softmax_of_a_fully_masked_row_is_zero_and_nan_stays_in_its_row():
    scores = np.array([[-np.inf, -np.inf, -np.inf], [0.0, np.nan, 1.0], [0.0, -np.inf, 0.0]])
    weights = numpy_attn.softmax(scores)
    np.testing.assert_array_equal(weights[0], [0.0, 0.0, 0.0])
    assert np.isnan(weights[1]).all()
    np.testing.assert_array_equal(weights[2], [0.5, 0.0, 0.5])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_softmax_keeps_the_dtype(dtype):
    weights = numpy_attn.softmax(np.array([[1.0, 2.0, 3.0]], dtype=dtype))
    assert weights.dtype == dtype
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-3)


def test_causal_mask_literal():
    np.testing.assert_array_equal(
        numpy_attn.causal_mask(3),
        [[False, True, True], [False, False, True], [False, False, False]],
    )
    np.testing.assert_array_equal(
        numpy_attn.causal_mask(2, 4), [[False, True, True, True], [False, False, True, True]]
    )


def test_scaled_dot_product_attention_by_hand():
    queries = np.array([[1.0, 0.0]])  # one query
    keys = np.array([[1.0, 0.0], [0.0, 1.0]])  # scores [1, 0], scaled by 1/sqrt(2)
    values = np.array([[1.0, 2.0], [3.0, 4.0]])
    w0 = 1.0 / (1.0 + math.exp(-1.0 / math.sqrt(2.0)))  # softmax([1/sqrt(2), 0])[0]
    context_vec, steps = numpy_attn.scaled_dot_product_attention(queries, keys, values, return_steps=True)
    np.testing.assert_array_equal(steps["attn_scores"], [[1.0, 0.0]])
    np.testing.assert_allclose(steps["attn_weights"], [[w0, 1 - w0]], rtol=1e-15)
    np.testing.assert_allclose(context_vec, [[w0 * 1 + (1 - w0) * 3, w0 * 2 + (1 - w0) * 4]], rtol=1e-15)
    assert list(steps) == ["attn_scores", "attn_weights"]


def test_scaled_dot_product_attention_mask_hides_keys():
    queries = np.array([[1.0, 0.0]])
    keys = np.array([[1.0, 0.0], [0.0, 1.0]])
    values = np.array([[1.0, 2.0], [3.0, 4.0]])
    mask = np.array([[False, True]])  # True = hidden: the second key
    context_vec, steps = numpy_attn.scaled_dot_product_attention(
        queries, keys, values, mask, dropout=0.0, return_steps=True
    )
    np.testing.assert_array_equal(context_vec, [[1.0, 2.0]])
    np.testing.assert_array_equal(steps["masked_scores"], [[1.0, -np.inf]])
    assert list(steps) == ["attn_scores", "masked_scores", "attn_weights", "attn_weights_dropped"]


def test_split_and_merge_heads_literal():
    x = np.arange(8.0).reshape(1, 2, 4)  # B=1, T=2, E=4
    heads = numpy_attn.split_heads(x, 2)  # (1, 2, 2, 2): head 0 takes features 0-1
    np.testing.assert_array_equal(heads[0, 0], [[0, 1], [4, 5]])
    np.testing.assert_array_equal(heads[0, 1], [[2, 3], [6, 7]])
    np.testing.assert_array_equal(numpy_attn.merge_heads(heads), x)


def test_linear_uses_torch_layout():
    x = np.array([[1.0, 2.0]])
    weight = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # (out=3, in=2)
    np.testing.assert_array_equal(numpy_attn.linear(x, weight), [[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(numpy_attn.linear(x, weight, np.array([1.0, 1.0, 1.0])), [[2.0, 3.0, 4.0]])


def test_linear_adds_the_bias_in_place_and_refuses_a_wider_bias():
    x, weight = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    out = numpy_attn.linear(x, weight, np.full(4, 0.5, np.float32))
    assert out.dtype == np.float32 and out.flags.owndata  # one (2, 4) array, no second for the sum
    np.testing.assert_array_equal(out, np.full((2, 4), 3.5, np.float32))
    with pytest.raises(TypeError, match=r"^bias has dtype float64 but x has dtype float32$"):
        numpy_attn.linear(x, weight, np.full(4, 0.1, np.float64))


def test_split_projection_fused_or_not_gives_the_thirds_of_one_linear():
    rng = np.random.default_rng(4)
    x, weight, bias = rng.standard_normal((2, 5, 3)), rng.standard_normal((12, 3)), rng.standard_normal(12)
    whole = numpy_attn.linear(x, weight, bias)  # (2, 5, 12)
    for fused in (True, False):
        parts = numpy_attn.split_projection(x, weight, bias, fused=fused)
        assert len(parts) == 3
        for i, part in enumerate(parts):
            np.testing.assert_allclose(part, whole[..., 4 * i : 4 * (i + 1)], rtol=1e-14, atol=1e-14)
    first, second = numpy_attn.split_projection(x, weight, None, parts=2, fused=False)
    np.testing.assert_allclose(first, x @ weight[:6].T, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(second, x @ weight[6:].T, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
def test_qkv_projections_are_the_query_key_and_value_projections_in_that_order(package, fused):
    """Three products or one over the stacked weights (``fused``): W_query(x), W_key(x), W_value(x)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    params = {
        f"W_{name}.{kind}": rng.standard_normal((4, 3) if kind == "weight" else 4).astype(np.float32)
        for name in ("query", "key", "value")
        for kind in ("weight", "bias")
    }
    rtol, atol = tolerance_for("float32")
    actual = package.qkv_projections(x, params, fused=fused)
    assert len(actual) == 3
    for part, name in zip(actual, ("query", "key", "value"), strict=True):
        expected = x @ params[f"W_{name}.weight"].T + params[f"W_{name}.bias"]  # (2, 5, 4)
        np.testing.assert_allclose(np.asarray(part), expected, rtol=rtol, atol=atol, err_msg=name)


def test_simplified_self_attention_steps():
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    output, steps = numpy_attn.simplified_self_attention(x, return_steps=True)
    np.testing.assert_array_equal(steps["attn_scores"], np.eye(2))
    e = math.e / (math.e + 1.0)
    np.testing.assert_allclose(output, [[e, 1 - e], [1 - e, e]], rtol=1e-15)
    assert list(steps) == ["attn_scores", "attn_weights", "context_vec", "output"]
