"""What builds arrays from arguments, the same error in numpy_attn and jax_attn: weight names that
are not str."""

import re

import numpy as np
import pytest
from flax import nnx

import jax_attn
import numpy_attn
from numpy_attn.validation import check_mapping
from tests.gpt_cases import TINY, token_ids

PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}

# ------------------------------------------------------------------ weight names that are not str

NOT_STR_KEY = "params must be a mapping of str to arrays, got key 1 (int)"


def causal_params():
    rng = np.random.default_rng(0)
    shapes = numpy_attn.parameter_shapes("CausalAttention", d_in=4, d_out=4)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def test_check_mapping_names_the_first_key_that_is_not_a_str():
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        check_mapping({"W_query.weight": np.ones(2), 1: np.ones(2), (2,): np.ones(2)})


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_a_layer_function_refuses_a_weight_name_that_is_not_a_str_alike(package):
    """jax_attn raised JAX's "Comparator raised exception while sorting pytree dictionary keys"."""
    x = np.random.default_rng(1).standard_normal((1, 2, 4)).astype(np.float32)
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        PACKAGES[package].causal_attention(
            {**causal_params(), 1: np.ones(4, np.float32)}, x, context_length=4
        )


@pytest.mark.parametrize("package", ["numpy", "jax"])
def test_the_gpt_refuses_a_weight_name_that_is_not_a_str_alike(package):
    rng = np.random.default_rng(0)
    params = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in numpy_attn.gpt_param_shapes(TINY).items()
    }
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        PACKAGES[package].gpt_model({**params, 1: np.ones(4, np.float32)}, token_ids(1, 4), TINY)
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        jax_attn.GPTModel.from_params({**params, 1: np.ones(4, np.float32)}, TINY)


def test_the_flax_loaders_refuse_a_weight_name_that_is_not_a_str():
    """``from_params`` raised AttributeError ('int' object has no attribute 'rsplit')."""
    params = {**causal_params(), 1: np.ones(4, np.float32)}
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        jax_attn.CausalAttention.from_params(params, context_length=4)
    module = jax_attn.CausalAttention(4, 4, 4, 0.0, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=f"^{re.escape(NOT_STR_KEY)}$"):
        module.load_params(params)
