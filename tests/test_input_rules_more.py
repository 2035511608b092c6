"""More input rules, the same error in numpy_attn and jax_attn: causal_mask's arguments and
softmax's edge cases."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn

PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}

# ------------------------------------------------------------------ causal_mask

BAD_MASK_ARGS = [
    ((2.0,), {}, TypeError, "num_queries must be a positive int, got 2.0 (float)"),
    ((True,), {}, TypeError, "num_queries must be a positive int, got True (bool)"),
    ((0,), {}, ValueError, "num_queries must be a positive int, got 0"),
    ((-2,), {}, ValueError, "num_queries must be a positive int, got -2"),
    (([3],), {}, TypeError, "num_queries must be a positive int, got [3] (list)"),
    ((3, 2.5), {}, TypeError, "num_keys must be a positive int, got 2.5 (float)"),
    ((3, -1), {}, ValueError, "num_keys must be a positive int, got -1"),
    ((3, 4), {"offset": 1.5}, TypeError, "offset must be an int, got 1.5 (float)"),
    ((3, 4), {"offset": True}, TypeError, "offset must be an int, got True (bool)"),
    ((3, 4), {"offset": [1]}, TypeError, "offset must be an int, got [1] (list)"),
]


@pytest.mark.parametrize("args, kwargs, error, message", BAD_MASK_ARGS, ids=[repr(a) for a in BAD_MASK_ARGS])
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_causal_mask_refuses_bad_arguments_alike(package, args, kwargs, error, message):
    """Unhashable arguments too (numpy_attn checks before its cache: not 'unhashable type')."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        PACKAGES[package].causal_mask(*args, **kwargs)


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_causal_mask_takes_numpy_ints_and_offsets_of_either_sign(package):
    causal_mask = PACKAGES[package].causal_mask
    expected = np.array([[False, True, True], [False, False, True]])
    np.testing.assert_array_equal(causal_mask(np.int64(2), np.int32(3)), expected)
    np.testing.assert_array_equal(causal_mask(2, 3, offset=np.int64(1)), [[False, False, True], [False] * 3])
    np.testing.assert_array_equal(causal_mask(2, 3, offset=-1), [[True] * 3, [False, True, True]])


def test_jax_causal_mask_takes_a_traced_or_array_offset():
    expected = np.asarray(jax_attn.causal_mask(2, 4, offset=1))
    np.testing.assert_array_equal(jax_attn.causal_mask(2, 4, offset=jnp.int32(1)), expected)
    traced = jax.jit(lambda offset: jax_attn.causal_mask(2, 4, offset=offset))(jnp.int32(1))
    np.testing.assert_array_equal(traced, expected)
    with pytest.raises(TypeError, match=r"^offset must be an int, got "):
        jax_attn.causal_mask(2, 4, offset=jnp.float32(1))


# ------------------------------------------------------------------ softmax

SOFTMAXES = ["softmax", "softmax_naive"]


@pytest.mark.parametrize("fn", SOFTMAXES)
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_softmax_refuses_a_0d_input_or_an_axis_out_of_range_alike(package, fn):
    softmax = getattr(PACKAGES[package], fn)
    with pytest.raises(ValueError, match=r"^axis -1 is out of bounds for x of shape \(\)$"):
        softmax(np.float32(1))
    with pytest.raises(ValueError, match=r"^axis 2 is out of bounds for x of shape \(2, 3\)$"):
        softmax(np.zeros((2, 3), np.float32), axis=2)
    with pytest.raises(ValueError, match=r"^axis -3 is out of bounds for x of shape \(2, 3\)$"):
        softmax(np.zeros((2, 3), np.float32), axis=-3)
    with pytest.raises(TypeError, match=r"^axis must be an int, got 1.0 \(float\)$"):
        softmax(np.zeros((2, 3), np.float32), axis=1.0)


@pytest.mark.parametrize("fn", SOFTMAXES)
@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_softmax_of_an_empty_axis_is_empty(package, fn):
    softmax = getattr(PACKAGES[package], fn)
    for shape, axis in (((2, 0), -1), ((0, 3), 0), ((0, 3), 1)):
        weights = np.asarray(softmax(np.zeros(shape, np.float32), axis=axis))
        assert weights.shape == shape and weights.dtype == np.float32
    weights = jax.jit(jax_attn.softmax)(jnp.zeros((2, 0), jnp.float32))
    assert weights.shape == (2, 0)


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_softmax_naive_has_softmaxs_input_checks(package):
    """Not NumPy's or JAX's raw (and differing) errors for a torch tensor or an int array."""
    torch = pytest.importorskip("torch")
    softmax_naive = PACKAGES[package].softmax_naive
    with pytest.raises(TypeError) as checked:
        PACKAGES[package].softmax(torch.zeros(2, 3))
    assert str(checked.value).startswith("x ")
    with pytest.raises(TypeError, match=f"^{re.escape(str(checked.value))}$"):
        softmax_naive(torch.zeros(2, 3))
    message = "x must have a floating dtype"
    with pytest.raises(TypeError, match=f"^{message}"):
        softmax_naive(np.zeros((2, 3), np.int64))
    np.testing.assert_allclose(
        np.asarray(softmax_naive(np.array([0.0, np.log(3.0)], np.float32))), [0.25, 0.75], rtol=1e-6
    )


def test_jax_simplified_self_attention_refuses_float64_without_x64():
    """It computed float64 in float32 without a word; the layers' check_x64 error now."""
    x = np.ones((3, 2), np.float64)
    with pytest.raises(TypeError, match=r"^x has dtype float64, which JAX computes in float32"):
        jax_attn.simplified_self_attention(x)
    with jax.enable_x64(True):
        assert jax_attn.simplified_self_attention(x).dtype == np.float64
