"""generate for the book's Llama 3 and Qwen3, against transformers' generate on the same small random
models: greedy tokens (left-padded batches, stop ids, min_new_tokens), the grouped caches, the
door's errors. Folders written by numpy_attn.save_hf, read by transformers' LlamaForCausalLM and
Qwen3ForCausalLM."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import jax_attn
import numpy_attn
import torch_ref
from jax_attn import generation as jax_generation
from numpy_attn import decoders as numpy_decoders
from numpy_attn import generation as numpy_generation
from parity_tests.frameworks import jax_context
from tests import gpt_cases
from tests.decoder_cases import CFGS, token_ids, torch_decoder
from tests.test_gpt_generate_hf import PAD, hf_generate

pytestmark = pytest.mark.xdist_group("transformers")  # on the worker that imports transformers' models

# prompts of 5, 3 and 1 tokens, left-padded to 5: with 8 new tokens, 13 of the cfgs' 16 positions
MASK = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
PROMPTS = np.where(MASK == 1, token_ids(3, 5, seed=11), PAD)
CLASSES = {"Llama3Model": transformers.LlamaForCausalLM, "Qwen3Model": transformers.Qwen3ForCausalLM}


@pytest.fixture(scope="module", params=list(CFGS))
def models(request, tmp_path_factory):
    """``(params, cfg, jax_attn's model, transformers' model)``, the same weights: the folder
    numpy_attn.save_hf writes, loaded by transformers."""
    cfg = CFGS[request.param]
    params = torch_ref.to_params(torch_decoder(request.param, seed=3))
    folder = tmp_path_factory.mktemp(request.param)
    numpy_attn.save_hf(folder, params, cfg)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert type(hf) is CLASSES[request.param]
    return params, cfg, jax_attn.from_hf(folder), hf


def ours(models, ids, max_new_tokens, **options):
    """numpy_attn's and jax_attn's generate, as NumPy: ``{"numpy": ..., "jax": ...}``."""
    params, cfg, model, _ = models
    jax_options = {name: jnp.asarray(v) if name == "attention_mask" else v for name, v in options.items()}
    return {
        "numpy": numpy_attn.generate(params, ids, cfg, max_new_tokens, **options),
        "jax": np.asarray(jax_attn.generate(model, jnp.asarray(ids), max_new_tokens, **jax_options)),
    }


@pytest.fixture(scope="module")
def free_run(models):
    """transformers' greedy tokens for PROMPTS with no stop id: ``(3, 5 + 8)``, read-only."""
    tokens = hf_generate(models[3], PROMPTS, MASK, max_new_tokens=8)
    tokens.flags.writeable = False
    return tokens


def test_greedy_tokens_equal_transformers_for_a_left_padded_batch_and_each_row_alone(models, free_run):
    """The rows' RoPE positions count from their first token, their padding hidden: the batch's
    tokens are transformers' (its position_ids from the attention_mask) and each row's alone."""
    hf, expected = models[3], free_run
    assert expected.shape == (3, 13)
    for name, actual in ours(models, PROMPTS, 8, attention_mask=MASK).items():
        np.testing.assert_array_equal(actual, expected, err_msg=name)
    for row, pads in enumerate((MASK == 0).sum(axis=1)):
        alone = hf_generate(hf, PROMPTS[row : row + 1, pads:], max_new_tokens=8)
        np.testing.assert_array_equal(expected[row : row + 1, pads:], alone)
    unpadded = hf_generate(hf, PROMPTS[:1], max_new_tokens=8)
    for name, actual in ours(models, PROMPTS[:1], 8).items():
        np.testing.assert_array_equal(actual, unpadded, err_msg=name)


@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
def test_a_padded_rows_keys_are_rotated_from_its_first_token(models, package):
    """RoPE scores depend on p - s alone, so tokens cannot tell per-row positions from shifted ones:
    the cached keys can. The public decode functions' padding_mask: each row's keys (every block's)
    and last logits are those of the row alone."""
    params, cfg, _, _ = models
    decode = getattr(package, "llama3_model_decode" if "rope_freq" in cfg else "qwen3_model_decode")
    batch_logits, caches = decode(params, PROMPTS, package.init_decoder_cache(cfg, 3), cfg, MASK == 0)
    for row, pads in enumerate((MASK == 0).sum(axis=1)):
        logits, alone = decode(params, PROMPTS[row : row + 1, pads:], package.init_decoder_cache(cfg, 1), cfg)
        np.testing.assert_allclose(batch_logits[row, -1], logits[0, -1], rtol=1e-5, atol=1e-5)
        for index, (cache, own) in enumerate(zip(caches, alone, strict=True)):
            np.testing.assert_allclose(
                cache.keys[row, :, pads:5],
                own.keys[0, :, : 5 - pads],
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"block {index}",
            )


def test_a_padding_mask_of_another_shape_is_refused_with_one_text(models):
    params, cfg, _, _ = models
    name = "llama3_model_decode" if "rope_freq" in cfg else "qwen3_model_decode"
    messages = []
    for package, convert in ((numpy_attn, np.asarray), (jax_attn, jnp.asarray)):
        caches = package.init_decoder_cache(cfg, 3)
        with pytest.raises(ValueError, match="padding_mask") as error:
            getattr(package, name)(params, convert(PROMPTS), caches, cfg, convert(MASK[:, 1:] == 0))
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_stop_ids_and_min_new_tokens_equal_transformers(models, free_run):
    """Row 0's third new token is the stop: row 0 finishes there and gets pad_token_id after it,
    min_new_tokens keeps it from stopping before; generation ends when every row has."""
    stop = int(free_run[0, 5 + 2])
    for options in (
        {"eos_token_id": stop, "pad_token_id": 7},
        {"eos_token_id": [stop, 60], "min_new_tokens": 4, "pad_token_id": PAD},
    ):
        expected = hf_generate(models[3], PROMPTS, MASK, max_new_tokens=8, **options)
        for name, actual in ours(models, PROMPTS, 8, attention_mask=MASK, **options).items():
            np.testing.assert_array_equal(actual, expected, err_msg=f"{name} {options}")


def test_sampling_repeats_its_seed_and_top_k_1_is_greedy(models):
    params, cfg, model, _ = models
    greedy = ours(models, PROMPTS, 4, attention_mask=MASK)
    options = {"temperature": 0.8, "top_k": 1, "attention_mask": MASK}
    np.testing.assert_array_equal(
        numpy_attn.generate(params, PROMPTS, cfg, 4, rng=np.random.default_rng(0), **options), greedy["numpy"]
    )
    jax_options = options | {"attention_mask": jnp.asarray(MASK)}
    for seed in (0, 1):
        sampled = jax_attn.generate(model, jnp.asarray(PROMPTS), 4, rng=jax.random.key(seed), **jax_options)
        np.testing.assert_array_equal(sampled, greedy["jax"])
    draws = [
        numpy_attn.generate(params, PROMPTS, cfg, 6, temperature=5.0, top_p=0.9, rng=np.random.default_rng(1))
        for _ in range(2)
    ]
    np.testing.assert_array_equal(*draws)


def test_numpy_generate_allocates_grouped_caches_once_and_writes_them_in_place(models, monkeypatch):
    """The caches hold the key/value heads alone, ``(B, n_kv_groups, T + max_new_tokens, H)``, made
    once and written by every step."""
    params, cfg, _, _ = models
    seen = []

    def decode(params, token_ids, caches, *args, **kwargs):
        seen.append((caches[0].keys, kwargs))
        return numpy_decoders.decode(params, token_ids, caches, *args, **kwargs)

    kind = numpy_attn.decoder_spec.model_of(cfg)
    monkeypatch.setitem(
        numpy_generation.DECODING, kind, numpy_generation.Decoding(numpy_decoders.init_decoder_cache, decode)
    )
    numpy_attn.generate(params, PROMPTS, cfg, 3)
    head_dim = numpy_attn.decoder_spec.head_dim(cfg, kind)
    assert (
        seen[0][0].shape == (3, cfg["n_kv_groups"], 5 + 3, head_dim) and cfg["n_kv_groups"] < cfg["n_heads"]
    )
    assert len(seen) == 3 and all(keys is seen[0][0] for keys, _ in seen)
    assert all(kwargs == {"last_only": True, "in_place": True} for _, kwargs in seen)


def test_the_jax_program_keeps_its_grouped_caches_in_place(models):
    """One program, whose caches ``(B, G, L, H)`` are loop carries that XLA never copies."""
    _, cfg, model, _ = models
    arguments, static = jax_generation.program_arguments(model, jnp.asarray(PROMPTS), 3)
    assert static["kind"] == numpy_attn.decoder_spec.model_of(cfg)
    program = jax_generation._generate.lower(*arguments, **static).compile().as_text()
    head_dim = numpy_attn.decoder_spec.head_dim(cfg, static["kind"])
    cache = f"[3,{cfg['n_kv_groups']},{static['cache_length']},{head_dim}]"
    assert cache in program
    assert [line for line in program.splitlines() if " copy(" in line and cache in line] == []


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"max_new_tokens": 12}, ValueError,
         "token_ids has T=5 tokens; with max_new_tokens=12 that exceeds context_length 16"),
        ({"top_k": 62}, ValueError, "top_k must be None or an integer in [1, 61], got 62"),
        ({"eos_token_id": 61}, ValueError, "eos_token_id must be an id in [0, 61), got 61"),
    ],
)  # fmt: skip
def test_bad_options_raise_one_text_in_both_packages(models, arguments, error, message):
    params, cfg, model, _ = models
    arguments = {"max_new_tokens": 2} | arguments
    max_new_tokens = arguments.pop("max_new_tokens")
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        numpy_attn.generate(params, PROMPTS, cfg, max_new_tokens, **arguments)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        jax_attn.generate(model, jnp.asarray(PROMPTS), max_new_tokens, **arguments)


def test_numpy_generate_checks_the_weights_against_the_decoders_cfg(models):
    """A Llama's weights with a Qwen cfg (and the other way), or a missing weight: the decoders'
    own errors, at the door."""
    params, cfg, _, _ = models
    kind, other = ("Llama3Model", "Qwen3Model") if "rope_freq" in cfg else ("Qwen3Model", "Llama3Model")
    with pytest.raises(ValueError, match=f"^params do not fit {other}: missing keys"):
        numpy_attn.generate(params, PROMPTS, CFGS[other], 2)
    missing = {name: value for name, value in params.items() if name != "out_head.weight"}
    with pytest.raises(
        ValueError, match=re.escape(f"params do not fit {kind}: missing keys ['out_head.weight']")
    ):
        numpy_attn.generate(missing, PROMPTS, cfg, 2)


def test_jax_generate_takes_a_bfloat16_decoder_as_its_decode_functions_do(models):
    """16-bit weights reach the program in torch's layout (generation_params) through the decoders'
    products too: its greedy tokens are those of the public decode function's logits."""
    params, cfg, _, _ = models
    half = {name: jnp.asarray(value, jnp.bfloat16) for name, value in params.items()}
    model = jax_attn.Llama3Model if "rope_freq" in cfg else jax_attn.Qwen3Model
    generated = np.asarray(jax_attn.generate(model.from_params(half, cfg), jnp.asarray(PROMPTS[:1]), 4))
    decode = getattr(jax_attn, "llama3_model_decode" if "rope_freq" in cfg else "qwen3_model_decode")
    logits, caches = decode(
        half, jnp.asarray(PROMPTS[:1]), jax_attn.init_decoder_cache(cfg, 1, jnp.bfloat16), cfg
    )
    tokens = [PROMPTS[:1]]
    for _ in range(4):
        tokens.append(np.asarray(logits[:, -1].astype(jnp.float32)).argmax(axis=-1)[:, None])
        logits, caches = decode(half, jnp.asarray(tokens[-1]), caches, cfg)
    np.testing.assert_array_equal(generated, np.concatenate(tokens, axis=1))


@pytest.mark.parametrize("model", ["GPTModel", "Llama3Model"])
def test_a_float64_model_generates_in_jax_with_64_bit_types_as_in_numpy(model):
    """jax_attn.generate with x64 on, which float64 models need (its index arithmetic mixed int64
    and int32 there and raised): greedy tokens, a padded row and an eos id, numpy_attn's."""
    if model == "GPTModel":
        config, torch_module = gpt_cases.TINY, gpt_cases.torch_model(seed=3).double()
    else:
        config, torch_module = CFGS[model] | {"dtype": "float64"}, torch_decoder(model, dtype="float64")
    params, prompt = torch_ref.to_params(torch_module), token_ids(2, 4, seed=5)
    mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]])
    options = {"attention_mask": mask, "eos_token_id": int(prompt[1, -1]), "pad_token_id": 0}
    expected = numpy_attn.generate(params, prompt, config, 6, **options)
    with jax_context("float64"):
        jax_model = getattr(jax_attn, model).from_params(params, config)
        actual = jax_attn.generate(jax_model, jnp.asarray(prompt), 6, **options)
        assert jax_model.tok_emb.embedding.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(actual), expected)
