"""Checks and steps made cheaper for small calls behave exactly as before: the same errors, the
same values, inputs left untouched."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

import numpy_attn
from numpy_attn.validation import check_finite
from parity_tests.tolerances import TOLERANCES


def weights(dtype=np.float32):
    rng = np.random.default_rng(3)
    return {name: rng.standard_normal((4, 3)).astype(dtype) for name in ("a", "b", "c", "d")}


@pytest.mark.parametrize("to_array", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
def test_check_finite_names_the_first_non_finite_weight(to_array):
    params = weights()
    params["b"][1, 2] = np.nan
    params["d"][0, 0] = -np.inf
    with pytest.raises(ValueError, match=re.escape("params['b'] has non-finite values (NaN or inf)")):
        check_finite({k: to_array(v) for k, v in params.items()})
    params["b"][1, 2] = 0.0
    with pytest.raises(ValueError, match=re.escape("params['d'] has non-finite values (NaN or inf)")):
        check_finite({k: to_array(v) for k, v in params.items()})


def test_check_finite_accepts_finite_weights_whatever_their_size():
    params = weights()
    params["a"][:] = np.finfo(np.float32).max  # a sum of these would overflow to inf: none is taken
    params["e"] = np.float32(2.5)  # a 0-d weight
    assert check_finite(params) is None
    assert check_finite({}) is None


def test_softmax_leaves_its_input_alone_and_zeroes_fully_masked_rows():
    scores = np.array([[1.0, 2.0, -np.inf], [-np.inf, -np.inf, -np.inf], [0.5, -np.inf, 0.5]], np.float32)
    before = scores.copy()
    actual = numpy_attn.softmax(scores)
    np.testing.assert_array_equal(scores, before)
    e = np.exp(np.float32(-1.0))
    expected = np.array([[e / (1 + e), 1 / (1 + e), 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.5]], np.float32)
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    single = np.array([[-np.inf], [3.0]])  # one key: the reduction's output could alias a view
    np.testing.assert_array_equal(numpy_attn.softmax(single), [[0.0], [1.0]])
    np.testing.assert_array_equal(single, [[-np.inf], [3.0]])
