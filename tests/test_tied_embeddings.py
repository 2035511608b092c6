"""Tied embeddings: a transformers checkpoint with ``tie_word_embeddings`` (every GPT-2, Llama 3.2
1B and 3B, the small Qwen3s) loads as a model whose ``out_head`` is its ``tok_emb``, one variable
under both torch names, and trains as transformers trains it: one shared matrix. It loaded as two
equal copies, trained apart (6 AdamW steps: losses 0.0136 apart for a GPT-2, 0.0114 for a Qwen3)."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import safetensors.numpy
import torch
import transformers
from flax import nnx

import jax_attn
from parity_tests.compare import compare_arrays

# one worker imports transformers' models, not both (as tests/test_gpt_hf.py)
pytestmark = pytest.mark.xdist_group("transformers")

STEPS, LR, WEIGHT_DECAY, VOCAB = 4, 3e-3, 0.1, 53
GPT2 = dict(vocab_size=VOCAB, n_positions=20, n_embd=24, n_layer=2, n_head=3,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
QWEN3 = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, head_dim=12,
             rope_theta=1_000_000.0)  # fmt: skip
CONFIGS = {
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config, GPT2),
    "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config, QWEN3),
}
# transformers' Qwen3 computes RoPE's tables from float32 frequencies in a float64 model too (its
# first loss is ours within 1e-9): its training is compared at float32's bounds, GPT-2's at float64's
LOSS_DTYPE = {"gpt2": "float64", "qwen3": "float32"}


def hf_model(kind: str, tied: bool = True, seed: int = 0) -> transformers.PreTrainedModel:
    """A random tiny transformers model in float64 (no dropout, no special tokens), its embeddings
    tied or not; the norms' weights drawn too, so that a mix-up shows."""
    cls, config_cls, sizes = CONFIGS[kind]
    config = config_cls(**sizes, tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).to(torch.float64)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln_" in name:
                param.copy_(torch.rand(param.shape, dtype=param.dtype) + 0.5)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """``(kind, the float64 transformers model, the folder it saved)``, tied."""
    model = hf_model(request.param)
    directory = tmp_path_factory.mktemp(f"{request.param}_tied")
    model.save_pretrained(directory)
    return request.param, model, directory


def batches(seed: int = 3) -> list[np.ndarray]:
    return list(np.random.default_rng(seed).integers(0, VOCAB, (STEPS, 2, 12)))


def train_transformers(model: transformers.PreTrainedModel) -> tuple[list[float], np.ndarray]:
    """``STEPS`` steps of ``torch.optim.AdamW``: the losses, then the final token embedding."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, eps=1e-8)
    losses = []
    for batch in map(torch.tensor, batches()):
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model.get_input_embeddings().weight.detach().numpy()


def train_jax(model: nnx.Module) -> list[float]:
    """``STEPS`` steps of ``optax.adamw`` (torch's formula), under ``nnx.jit`` and ``nnx.value_and_grad``."""
    optimizer = nnx.Optimizer(model, optax.adamw(LR, eps=1e-8, weight_decay=WEIGHT_DECAY), wrt=nnx.Param)

    def loss_fn(model, inputs, targets):
        return optax.softmax_cross_entropy_with_integer_labels(model(inputs), targets).mean()

    @nnx.jit
    def step(model, optimizer, inputs, targets):
        loss, grads = nnx.value_and_grad(loss_fn)(model, inputs, targets)
        optimizer.update(model, grads)
        return loss

    return [float(step(model, optimizer, jnp.asarray(b[:, :-1]), jnp.asarray(b[:, 1:]))) for b in batches()]


def test_a_tied_checkpoint_loads_as_one_variable_and_trains_as_transformers(checkpoint):
    kind, hf, directory = checkpoint
    with jax.enable_x64(True):
        model = jax_attn.from_hf(directory)
        assert model.tie_embeddings and model.out_head is model.tok_emb
        params = nnx.state(model, nnx.Param)
        weights = model.to_params()
        assert len(jax.tree.leaves(params)) == len(weights) - 1  # one variable, two names
        assert np.array_equal(weights["out_head.weight"], weights["tok_emb.weight"])
        assert model.tok_emb.embedding[...].dtype == jnp.float64
        losses = train_jax(model)
        final = model.to_params()
    expected, embedding = train_transformers(hf_model(kind))
    compared = functools.partial(np.asarray, dtype=LOSS_DTYPE[kind])
    rows = [
        compare_arrays("losses", compared(expected), compared(losses)),
        compare_arrays("tok_emb.weight", compared(embedding), compared(final["tok_emb.weight"])),
    ]
    assert all(row.ok for row in rows), rows
    assert np.array_equal(final["out_head.weight"], final["tok_emb.weight"])  # trained as one


def test_an_untied_checkpoint_still_loads_untied(tmp_path):
    hf_model("gpt2", tied=False).save_pretrained(tmp_path)
    with jax.enable_x64(True):
        model = jax_attn.GPTModel.from_hf_gpt2(tmp_path)
    assert not model.tie_embeddings and isinstance(model.out_head, nnx.Linear)


def test_a_tied_model_generates_transformers_tokens(checkpoint):
    """``generate`` reads the one variable under both names, in torch's layout, not transposed."""
    kind, hf, directory = checkpoint
    prompt = np.random.default_rng(5).integers(0, VOCAB, (2, 4))
    with torch.no_grad():
        expected = hf.eval().generate(torch.tensor(prompt), max_new_tokens=6, do_sample=False).numpy()
    with jax.enable_x64(True):
        model = jax_attn.from_hf(directory)
        stored, transposed = model.stored_params()
        assert stored["out_head.weight"] is stored["tok_emb.weight"] and "out_head.weight" not in transposed
        assert np.array_equal(jax_attn.generate(model, jnp.asarray(prompt), 6), expected)


def test_a_tied_model_saves_a_tied_folder_that_loads_tied(checkpoint, tmp_path):
    kind, _, directory = checkpoint
    with jax.enable_x64(True):
        model = jax_attn.from_hf(directory)
        getattr(model, "save_hf_gpt2" if kind == "gpt2" else "save_hf")(tmp_path)  # the model's saver
        back = jax_attn.from_hf(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is True
    assert "lm_head.weight" not in safetensors.numpy.load_file(tmp_path / "model.safetensors")
    assert back.tie_embeddings and back.out_head is back.tok_emb
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf.lm_head.weight is hf.get_input_embeddings().weight


def test_tie_embeddings_is_refused_for_unequal_weights_and_taken_as_a_bool(checkpoint):
    _, _, directory = checkpoint
    with jax.enable_x64(True):
        model = jax_attn.from_hf(directory)
        params, config = dict(model.to_params()), model.model_config
        params["out_head.weight"] = params["out_head.weight"] + 1.0
        with pytest.raises(ValueError, match=r"share one variable in this module \(tied weights\) but"):
            type(model).from_params(params, config, tie_embeddings=True)
        apart = type(model).from_params(params, config)  # untied: two variables
    assert np.array_equal(apart.to_params()["out_head.weight"], params["out_head.weight"])
    with pytest.raises(TypeError, match="tie_embeddings must be a bool"):
        type(model)(config, tie_embeddings="yes", dtype=jnp.float32, rngs=nnx.Rngs(0))
