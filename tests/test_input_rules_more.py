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
