"""Hugging Face Llama and Qwen3 folders: read with NumPy alone, loaded as Flax models, written back;
logits and greedy tokens against transformers' own."""

from __future__ import annotations

import json
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import jax_attn
import numpy_attn
import torch_ref
from numpy_attn.decoder_spec import model_of, rope_frequencies
from parity_tests.compare import compare_arrays
from tests.decoder_cases import ROPE_FREQ, randomize_norms, token_ids

# one worker imports transformers' models, not both (tests/test_gpt_hf.py joins it)
pytestmark = pytest.mark.xdist_group("transformers")

SIZES = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=16)  # fmt: skip
SIZES |= dict(eos_token_id=None, bos_token_id=None)  # no token ends a greedy run early
FACTORS = ("factor", "low_freq_factor", "high_freq_factor")
LLAMA3_SCALING = {
    "rope_type": "llama3", **{key: ROPE_FREQ[key] for key in FACTORS},
    "original_max_position_embeddings": ROPE_FREQ["original_context_length"],
}  # fmt: skip
CONFIGS = {  # random tiny models: Llama 3.2's tied embeddings and RoPE scaling; Qwen3's own head size
    "llama": transformers.LlamaConfig(**SIZES, rope_theta=500_000.0, rope_scaling=LLAMA3_SCALING,
                                      tie_word_embeddings=True, rms_norm_eps=1e-5),
    "qwen3": transformers.Qwen3Config(**SIZES, head_dim=12, rope_theta=1_000_000.0),
}  # fmt: skip
CLASSES = {"llama": transformers.LlamaForCausalLM, "qwen3": transformers.Qwen3ForCausalLM}


def hf_model(
    model_type: str, seed: int = 0, dtype: torch.dtype = torch.float32
) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = CONFIGS[model_type]
    config._attn_implementation = "eager"
    return randomize_norms(CLASSES[model_type](config).eval(), seed).to(dtype)


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory):
    model = hf_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return model, directory


def hf_logits(model: transformers.PreTrainedModel, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def greedy(package, params, cfg, prompt: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """The prompt and ``max_new_tokens`` argmax tokens, decoded from the grouped KV caches: the
    prompt's pass, then one token at a time."""
    decode = getattr(
        package, "llama3_model_decode" if model_of(cfg) == "Llama3Model" else "qwen3_model_decode"
    )
    caches = package.init_decoder_cache(cfg, prompt.shape[0], np.dtype(cfg["dtype"]))
    logits, caches = decode(params, prompt, caches, cfg)
    tokens = [prompt]
    for _ in range(max_new_tokens):
        tokens.append(np.asarray(logits[:, -1]).argmax(axis=-1)[:, None])  # (B, 1)
        logits, caches = decode(params, tokens[-1], caches, cfg)
    return np.concatenate(tokens, axis=1)


def test_a_folder_loads_with_numpy_and_as_a_flax_model_with_transformers_logits_and_tokens(checkpoint):
    model, directory = checkpoint
    params, cfg = numpy_attn.load_hf(directory)
    llama = model.config.model_type == "llama"
    assert cfg["rope_freq" if llama else "head_dim"] == (ROPE_FREQ if llama else 12)
    ids = token_ids(num_tokens=16)
    expected = hf_logits(model, ids)
    function = getattr(numpy_attn, "llama3_model" if llama else "qwen3_model")
    assert compare_arrays("logits", expected, function(params, ids, cfg)).ok
    flax_model = jax_attn.from_hf(directory)
    own, other = (jax_attn.Llama3Model, jax_attn.Qwen3Model)[:: 1 if llama else -1]
    assert type(flax_model) is own and type(own.from_hf(directory)) is own
    with pytest.raises(ValueError, match=f"holds no {other.__name__}: load it with jax_attn.from_hf"):
        other.from_hf(directory)
    assert compare_arrays("logits", expected, nnx.jit(lambda m, x: m(x))(flax_model, jnp.asarray(ids))).ok
    # Llama 3.2 ties lm_head to embed_tokens: the file holds embed_tokens alone, the weights format both
    assert np.array_equal(params["out_head.weight"], params["tok_emb.weight"]) == llama
    prompt = ids[:, :4]
    with torch.no_grad():
        expected_tokens = model.generate(torch.tensor(prompt), max_new_tokens=8, do_sample=False).numpy()
    assert np.array_equal(greedy(numpy_attn, params, cfg, prompt, 8), expected_tokens)
    assert np.array_equal(greedy(jax_attn, flax_model.torch_params(), cfg, prompt, 8), expected_tokens)


def test_a_written_folder_loads_in_transformers_and_gives_torch_ref_logits(checkpoint, tmp_path):
    model, directory = checkpoint
    params, cfg = numpy_attn.load_hf(directory)
    torch_model = torch_ref.load_params(getattr(torch_ref, model_of(cfg))(cfg).eval(), params)
    ids = token_ids(num_tokens=16)
    with torch.no_grad():
        expected = torch_model(torch.tensor(ids)).numpy()
    numpy_attn.save_hf(tmp_path / "numpy", params, cfg)
    jax_attn.from_hf(directory).save_hf(tmp_path / "jax")
    for folder in ("numpy", "jax"):
        written = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / folder).eval()
        assert type(written) is type(model)
        assert compare_arrays("logits", expected, hf_logits(written, ids)).ok
        params_back, cfg_back = numpy_attn.load_hf(tmp_path / folder)
        assert cfg_back == cfg and all(np.array_equal(params_back[k], params[k]) for k in params)


def test_a_transformers_4_config_reads_rope_theta_and_rope_scaling(checkpoint, tmp_path):
    model, directory = checkpoint
    hf_config = json.loads((directory / "config.json").read_text())
    rope = hf_config.pop("rope_parameters")
    legacy = {
        "rope_theta": rope.pop("rope_theta"),
        "rope_scaling": None if rope["rope_type"] == "default" else rope,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf_config | legacy))
    (tmp_path / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
    assert numpy_attn.load_hf(tmp_path)[1] == numpy_attn.load_hf(directory)[1]


def test_a_bfloat16_checkpoint_loads_in_bfloat16():
    model = hf_model("qwen3", seed=1, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        params, cfg = numpy_attn.load_hf(directory)
        flax_model = jax_attn.from_hf(directory)
    assert cfg["dtype"] == "bfloat16" and params["tok_emb.weight"].dtype.name == "bfloat16"
    ids = token_ids(num_tokens=16)
    assert flax_model.tok_emb.embedding[...].dtype == jnp.bfloat16
    actual = nnx.jit(lambda m, x: m(x))(flax_model, jnp.asarray(ids))
    assert compare_arrays("logits", hf_logits(model, ids), actual).ok  # bfloat16's tolerance


def test_the_llama3_frequencies_are_transformers():
    config = transformers.LlamaConfig(**SIZES | {"hidden_size": 64, "num_attention_heads": 2},
                                      rope_theta=500_000.0, rope_scaling=LLAMA3_SCALING)  # fmt: skip
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    assert compare_arrays("inv_freq", expected, rope_frequencies(32, 500_000.0, ROPE_FREQ)).ok


def test_load_hf_reads_gpt2_folders_and_from_hf_returns_a_gpt(tmp_path):
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=53, n_positions=20, n_embd=24,
                                                                n_layer=1, n_head=3)).eval()  # fmt: skip
    gpt2.save_pretrained(tmp_path)
    params, config = numpy_attn.load_hf(tmp_path)
    assert config["qkv_bias"] is True and "tok_emb.weight" in params
    assert isinstance(jax_attn.from_hf(tmp_path), jax_attn.GPTModel)


def _copy_with_config(directory, target, **changes):
    hf_config = json.loads((directory / "config.json").read_text()) | changes
    (target / "config.json").write_text(json.dumps(hf_config))
    (target / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"attention_bias": True}, "attention_bias=True is not supported, only (False,)"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported, only ('silu',)"),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}},
            "RoPE type 'yarn' is not supported",
        ),
        ({"num_hidden_layers": 3}, "missing keys ['model.layers.2.self_attn.q_proj.weight'"),
        ({"model_type": "mistral"}, "holds a 'mistral' model, not one of ['gpt2', 'llama', 'qwen3']"),
    ],
    ids=["bias", "gelu", "yarn", "layers", "mistral"],
)
def test_an_unsupported_or_contradicting_config_is_named(checkpoint, tmp_path, changes, message):
    _, directory = checkpoint
    _copy_with_config(directory, tmp_path, **changes)
    with pytest.raises(ValueError, match=re.escape(message)):
        numpy_attn.load_hf(tmp_path)


def test_a_folder_without_its_weights_is_refused(checkpoint, tmp_path):
    _, directory = checkpoint
    (tmp_path / "config.json").write_bytes((directory / "config.json").read_bytes())
    with pytest.raises(
        ValueError, match=re.escape("not a Hugging Face checkpoint folder: model.safetensors is missing")
    ):
        jax_attn.from_hf(tmp_path)
    assert jax.devices()  # the refusal left JAX as it was
