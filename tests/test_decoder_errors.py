"""Bad input to the decoders raises the same ValueError or TypeError, naming the argument, in
numpy_attn and jax_attn (one check at the door: ``numpy_attn.decoder_checks``)."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_attn
import numpy_attn
import torch_ref
from tests.decoder_cases import LLAMA, QWEN, ROPE_FREQ, token_ids, torch_decoder

PACKAGES = [numpy_attn, jax_attn]
IDS = ["numpy", "jax"]


@pytest.fixture(scope="module")
def weights():
    return {model: torch_ref.to_params(torch_decoder(model)) for model in ("Llama3Model", "Qwen3Model")}


def without(cfg, key):
    return {name: value for name, value in cfg.items() if name != key}


Q, L, V, T = "qwen3_model", "llama3_model", ValueError, TypeError
BAD_CFGS = [
    (Q, QWEN | {"n_kv_groups": 3}, V, "cfg['n_heads']=4 is not divisible by cfg['n_kv_groups']=3"),
    (Q, QWEN | {"head_dim": 7}, V, "head_dim=7 must be even: RoPE rotates pairs"),
    (Q, without(QWEN, "qk_norm"), V, "cfg is missing keys ['qk_norm']; a Qwen3Model cfg has"),
    (Q, QWEN | {"qk_norm": 1}, T, "cfg['qk_norm'] must be a bool, got 1 (int)"),
    (Q, QWEN | {"num_experts": 8}, V, "cfg['num_experts']=8: mixture-of-experts models are not supported"),
    (L, LLAMA | {"emb_dim": 30}, V, "cfg['emb_dim']=30 is not divisible by cfg['n_heads']=4"),
    (L, LLAMA | {"rope_base": 0.5}, V, "cfg['rope_base'] must be a finite number above 1, got 0.5"),
    (L, LLAMA | {"rope_freq": ROPE_FREQ | {"high_freq_factor": 1.0}}, V,
     "cfg['rope_freq']['high_freq_factor']=1.0 must exceed cfg['rope_freq']['low_freq_factor']=1.0"),
    (L, LLAMA | {"rope_freq": without(ROPE_FREQ, "factor")}, V, "cfg['rope_freq'] is missing keys ['factor"),
    (L, LLAMA | {"dtype": "int8"}, T, "cfg['dtype'] must be a floating dtype"),
    (L, LLAMA | {"n_layers": 2.0}, T, "cfg['n_layers'] must be a positive int, got 2.0 (float)"),
]  # fmt: skip


@pytest.mark.parametrize("package", PACKAGES, ids=IDS)
@pytest.mark.parametrize("function, cfg, error, message", BAD_CFGS)
def test_a_bad_cfg_is_named(weights, package, function, cfg, error, message):
    params = weights["Qwen3Model" if function == "qwen3_model" else "Llama3Model"]
    with pytest.raises(error, match=re.escape(message)):
        getattr(package, function)(params, token_ids(), cfg)


@pytest.mark.parametrize("package", PACKAGES, ids=IDS)
def test_weights_of_the_other_model_name_every_misfit(weights, package):
    with pytest.raises(ValueError) as raised:
        package.llama3_model(weights["Qwen3Model"], token_ids(), LLAMA)
    message = str(raised.value)
    assert message.startswith("params do not fit Llama3Model: missing keys ['trf_blocks.0.norm1.weight'")
    assert "unexpected keys ['final_norm.scale', 'trf_blocks.0.att.k_norm.scale'" in message
    assert "'trf_blocks.0.att.W_query.weight' has shape (48, 32), expected (32, 32)" in message


@pytest.mark.parametrize("package", PACKAGES, ids=IDS)
def test_weights_of_mixed_dtypes_and_bad_ids_are_named(weights, package):
    params = dict(weights["Llama3Model"])
    mixed = params | {"out_head.weight": params["out_head.weight"].astype(np.float16)}
    with pytest.raises(
        TypeError, match=re.escape("params['out_head.weight'] has dtype float16 but params['tok_emb")
    ):
        package.llama3_model(mixed, token_ids(), LLAMA)
    with pytest.raises(ValueError, match=re.escape("token_ids has T=17 tokens, more than context_length 16")):
        package.llama3_model(params, token_ids(num_tokens=17), LLAMA)
    with pytest.raises(ValueError, match=re.escape("outside the vocabulary [0, 61)")):
        package.llama3_model(params, token_ids() + 61, LLAMA)


@pytest.mark.parametrize("package", PACKAGES, ids=IDS)
def test_a_cache_of_the_query_heads_or_the_wrong_count_is_refused(weights, package):
    params, ids = weights["Qwen3Model"], token_ids(num_tokens=3)
    per_head = tuple(package.init_kv_cache(2, 4, 16, 12) for _ in range(2))  # N = 4 heads, not G = 2
    with pytest.raises(
        ValueError, match=re.escape("caches[0].keys has shape (2, 4, 16, 12), but a grouped cache")
    ):
        package.qwen3_model_decode(params, ids, per_head, QWEN)
    with pytest.raises(ValueError, match=re.escape("caches has 1 KVCache, but cfg['n_layers'] = 2 blocks")):
        package.qwen3_model_decode(params, ids, package.init_decoder_cache(QWEN, 2)[:1], QWEN)
    _, full = package.qwen3_model_decode(
        params, token_ids(num_tokens=15), package.init_decoder_cache(QWEN, 2), QWEN
    )
    with pytest.raises(ValueError, match=re.escape("caches[0] holds 15 of 16 tokens; 3 more do not fit")):
        package.qwen3_model_decode(params, ids, full, QWEN)


@pytest.mark.parametrize("package", PACKAGES, ids=IDS)
def test_the_building_blocks_name_their_bad_arguments(weights, package):
    att = {k.removeprefix("trf_blocks.0.att."): v for k, v in weights["Qwen3Model"].items() if ".0.att." in k}
    x = np.zeros((2, 5, 32), np.float32)
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_groups=3"):
        package.grouped_query_attention(att, x, num_heads=4, num_kv_groups=3)
    with pytest.raises(ValueError, match=re.escape("params['W_query.weight'] has 48 rows, not num_heads=5")):
        package.grouped_query_attention(att, x, num_heads=5, num_kv_groups=1)
    with pytest.raises(
        ValueError, match=re.escape("x has head size H=5 (shape (2, 3, 5)); RoPE rotates pairs")
    ):
        package.rope(np.zeros((2, 3, 5), np.float32))
    with pytest.raises(ValueError, match=re.escape("offset must be in [0, 2**31 - 1 - T]")):
        package.rope(np.zeros((2, 3, 4), np.float32), offset=-1)
    with pytest.raises(
        ValueError, match=re.escape("weight must have shape (D,) = (4,) for x of shape (3, 4)")
    ):
        package.rms_norm(np.zeros((3, 4), np.float32), np.ones(3, np.float32))
    with pytest.raises(TypeError, match=re.escape("eps must be a finite number >= 0, got '1e-6' (str)")):
        package.rms_norm(np.zeros((3, 4), np.float32), np.ones(4, np.float32), eps="1e-6")


@pytest.mark.parametrize("model", ["Llama3Model", "Qwen3Model"])
def test_the_flax_models_refuse_what_the_functions_refuse(weights, model):
    cfg = LLAMA if model == "Llama3Model" else QWEN
    with pytest.raises(
        ValueError, match=re.escape("cfg['n_heads']=4 is not divisible by cfg['n_kv_groups']=3")
    ):
        getattr(jax_attn, model)(cfg | {"n_kv_groups": 3}, rngs=nnx.Rngs(0))
    params = dict(weights[model])
    del params["out_head.weight"]
    with pytest.raises(
        ValueError, match=re.escape(f"params do not fit {model}: missing keys ['out_head.weight']")
    ):
        getattr(jax_attn, model).from_params(params, cfg)
    loaded = getattr(jax_attn, model).from_params(weights[model], cfg)
    with pytest.raises(
        ValueError, match=re.escape(f"params do not fit {model}: missing keys ['out_head.weight']")
    ):
        loaded.load_params(params)
    assert np.array_equal(
        loaded.to_params()["out_head.weight"], weights[model]["out_head.weight"]
    )  # unchanged
    with pytest.raises(ValueError, match=re.escape("token_ids has T=17 tokens, more than context_length 16")):
        loaded(jnp.asarray(token_ids(num_tokens=17)))
