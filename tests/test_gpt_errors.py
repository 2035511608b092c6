"""Bad input to the GPT: the same ValueError, naming the problem, in numpy_attn and jax_attn."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import jax_attn
import numpy_attn
import torch_ref
from tests.gpt_cases import TINY, token_ids, torch_model


@pytest.fixture(scope="module")
def params():
    return torch_ref.to_params(torch_model())


def numpy_call(params, ids, config):
    return numpy_attn.gpt_model(params, ids, config)


def jax_call(params, ids, config):
    return jax_attn.gpt_model(params, jnp.asarray(ids), config)


def module_call(params, ids, config):
    return jax_attn.GPTModel.from_params(params, config)(jnp.asarray(ids))


CALLS = pytest.mark.parametrize("call", [numpy_call, jax_call, module_call], ids=["numpy", "jax", "nnx"])


@CALLS
@pytest.mark.parametrize("bad_id", [-1, TINY["vocab_size"]], ids=["negative", "vocab_size"])
def test_token_ids_outside_the_vocabulary(params, call, bad_id):
    ids = token_ids(2, 5)
    ids[1, 3] = bad_id
    with pytest.raises(
        ValueError, match=r"token_ids hold ids in \[-?\d+, \d+\], outside the vocabulary \[0, 61\)"
    ):
        call(params, ids, TINY)


@CALLS
def test_more_tokens_than_the_context_length(params, call):
    with pytest.raises(ValueError, match="token_ids has T=17 tokens, more than context_length 16"):
        call(params, token_ids(1, 17), TINY)


@CALLS
def test_an_empty_batch_of_token_ids(params, call):
    """One rule for every GPT entry point (check_token_ids): generate's caches need B >= 1."""
    message = "token_ids must have shape (B, T) with B >= 1 and T >= 1, got (0, 4)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(params, token_ids(0, 4), TINY)


def test_torch_ref_refuses_more_tokens_than_the_context_length():
    with pytest.raises(ValueError, match="token_ids has 17 tokens, more than context_length 16"):
        torch_model()(torch.tensor(token_ids(1, 17)))


@CALLS
def test_float_token_ids(params, call):
    with pytest.raises(TypeError, match="token_ids must be an integer array"):
        call(params, token_ids(1, 4).astype(np.float32), TINY)


@CALLS
def test_a_config_missing_keys(params, call):
    config = {k: v for k, v in TINY.items() if k not in ("n_heads", "qkv_bias")}
    with pytest.raises(ValueError, match=r"config is missing keys \['n_heads', 'qkv_bias'\]"):
        call(params, token_ids(1, 4), config)


def test_torch_ref_and_the_jax_constructor_refuse_a_config_missing_keys():
    config = {k: v for k, v in TINY.items() if k != "emb_dim"}
    with pytest.raises(ValueError, match=r"config is missing keys \['emb_dim'\]"):
        torch_ref.GPTModel(config)
    with pytest.raises(ValueError, match=r"config is missing keys \['emb_dim'\]"):
        jax_attn.GPTModel(config, rngs=None)


@CALLS
def test_a_config_contradicting_the_weights(params, call):
    config = TINY | {"n_layers": 3, "qkv_bias": False, "context_length": 20}
    with pytest.raises(
        ValueError, match=r"params do not fit GPTModel: missing keys \['trf_blocks\.2\."
    ) as error:
        call(params, token_ids(1, 4), config)
    message = str(error.value)
    assert "unexpected keys ['trf_blocks.0.att.W_key.bias'" in message
    assert "'pos_emb.weight' has shape (16, 32), expected (20, 32)" in message


@CALLS
def test_heads_that_do_not_divide_the_width(params, call):
    with pytest.raises(ValueError, match="emb_dim"):
        call(params, token_ids(1, 4), TINY | {"n_heads": 3})


def test_loading_bad_weights_into_a_jax_model_leaves_it_untouched(params):
    model = jax_attn.GPTModel.from_params(params, TINY)
    bad = dict(params) | {"out_head.weight": np.full((61, 32), np.nan, np.float32)}
    with pytest.raises(ValueError, match=r"params\['out_head.weight'\] has non-finite values"):
        model.load_params(bad)
    del bad["final_norm.scale"]
    with pytest.raises(ValueError, match=r"missing keys \['final_norm.scale'\]"):
        model.load_params(bad)
    actual = model.to_params()
    assert all(np.array_equal(actual[name], params[name]) for name in params)


@pytest.mark.parametrize("rngs", [0, "seed"], ids=["int", "str"])
def test_rngs_that_are_not_an_nnx_rngs_are_named(params, rngs):
    """Not ``'int' object is not subscriptable``: a TypeError naming rngs, what it must be and
    what was given, from the constructor and from from_params."""
    message = f"rngs must be a flax.nnx.Rngs (nnx.Rngs(seed)), got {rngs!r} ({type(rngs).__name__})"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.GPTModel(TINY, rngs=rngs)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.GPTModel.from_params(params, TINY, rngs=rngs)


def load_call(params, ids, config):
    model = jax_attn.GPTModel.from_params(torch_ref.to_params(torch_model()), config)
    return model.load_params(params)(jnp.asarray(ids))


def one_changed(params, name, dtype):
    return {**params, name: params[name].astype(dtype)}


@pytest.mark.parametrize(
    "call", [numpy_call, jax_call, module_call, load_call], ids=["numpy", "jax", "nnx", "load"]
)
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: one_changed(p, "out_head.weight", np.float64),
         "params['out_head.weight'] has dtype float64 but params['tok_emb.weight'] has dtype float32"),
        (lambda p: one_changed(p, "final_norm.shift", np.int64),
         "params['final_norm.shift'] has dtype int64 but params['tok_emb.weight'] has dtype float32"),
        (lambda p: {k: v.astype(">f4") for k, v in p.items()},
         "params['tok_emb.weight'] has dtype >f4, big-endian; give it in the machine's byte order: "
         ".astype(np.float32)"),
    ],
    ids=["float64_among_float32", "int64_among_float32", "big_endian"],
)  # fmt: skip
def test_the_weights_share_one_floating_dtype_the_first_weights(params, call, change, message):
    """As a layer's weights must have x's dtype, the GPT's must have its first weight's: numpy
    promoted the logits to float64 (or took integer weights), JAX and the module cast silently."""
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        call(change(params), token_ids(2, 5), TINY)


@pytest.mark.parametrize("call", [jax_call, module_call], ids=["jax", "nnx"])
def test_float64_weights_without_x64_are_refused_by_the_jax_gpt(params, call):
    """Without JAX's 64-bit mode a float64 model computed in float32, without a word."""
    weights = {k: v.astype(np.float64) for k, v in params.items()}
    with pytest.raises(
        TypeError, match=r"^params\['tok_emb.weight'\] has dtype float64, which JAX computes in float32"
    ):
        call(weights, token_ids(2, 5), TINY)


def test_a_float64_kv_cache_without_x64_is_refused():
    """jax_attn.init_kv_cache(dtype=float64) made float32 arrays without x64."""
    with pytest.raises(TypeError, match=r"^dtype has dtype float64, which JAX computes in float32"):
        jax_attn.init_kv_cache(2, 2, 8, 2, dtype=np.float64)


@CALLS
@pytest.mark.parametrize(
    "key, value, error, message",
    [
        ("n_layers", 2.0, TypeError, "config['n_layers'] must be a positive int, got 2.0 (float)"),
        ("emb_dim", True, TypeError, "config['emb_dim'] must be a positive int, got True (bool)"),
        ("vocab_size", 0, ValueError, "config['vocab_size'] must be a positive int, got 0"),
    ],
)
def test_config_sizes_follow_the_one_size_rule(params, call, key, value, error, message):
    """TypeError for a size that is not an int, ValueError below 1: ``check_size``, as every size."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call(params, token_ids(1, 4), TINY | {key: value})


@pytest.mark.parametrize("params_given", [[1, 2], None], ids=["list", "None"])
def test_the_jax_model_refuses_weights_that_are_not_a_mapping(params_given):
    """The weights format's TypeError (not dict()'s "cannot convert dictionary update sequence")."""
    message = f"^params must be a mapping of str to arrays, got {type(params_given).__name__}$"
    with pytest.raises(TypeError, match=message):
        jax_attn.GPTModel.from_params(params_given, TINY)
    with pytest.raises(TypeError, match=message):
        jax_attn.GPTModel(TINY, rngs=nnx.Rngs(0)).load_params(params_given)
