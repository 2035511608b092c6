"""The automatic torch -> NNX weight mapping, checked by locate against the torch module itself, and
GPT-2's weights mapped onto the book's torch GPT."""

import functools

import numpy as np
import pytest
import torch
from flax import nnx

from parity_tests.compare import compare_arrays
from parity_tests.locate import locate
from parity_tests.locate.weights import map_weights
from tests.gpt_cases import TINY, token_ids, torch_model
from tests.ports.catalogue import inputs
from tests.test_gpt_hf import hf_model


def flax_mha():
    return nnx.MultiHeadAttention(num_heads=2, in_features=8, qkv_features=8, decode=False, rngs=nnx.Rngs(0))


def test_torch_multihead_attention_maps_onto_flax_multihead_attention():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    mapping = map_weights(mha.state_dict(), flax_mha())
    assert mapping.rows[:2] == (
        ("query.kernel", "in_proj_weight[q]", "transposed, reshaped to (8, 2, 4)"),
        ("query.bias", "in_proj_bias[q]", "reshaped to (2, 4)"),
    )
    assert mapping.rows[-2][:2] == ("out.kernel", "out_proj.weight")
    assert "key.kernel    <-  in_proj_weight[k]" in str(mapping)
    candidate = mapping.apply(flax_mha())
    x = inputs()
    report = locate(functools.partial(mha, need_weights=False), candidate, (x, x, x))
    assert report.ok, f"\n{report}"
    doubled = {**mha.state_dict(), "out_proj.weight": 2 * mha.state_dict()["out_proj.weight"]}
    wrong = map_weights(doubled, flax_mha()).apply(flax_mha())
    assert not locate(functools.partial(mha, need_weights=False), wrong, (x, x, x)).ok


def test_a_tensor_that_fits_nothing_is_named():
    state = {
        "in_proj_weight": np.zeros((24, 8)),
        "in_proj_bias": np.zeros(24),
        "out_proj.weight": np.zeros((8, 8)),
    }
    with pytest.raises(
        ValueError, match=r"no torch tensor left fits NNX parameter out\.bias of shape \(8,\)"
    ):
        map_weights(state, flax_mha())
    with pytest.raises(ValueError, match=r"left unmapped: extra\.weight"):
        map_weights({**state, "out_proj.bias": np.zeros(8), "extra.weight": np.zeros((3, 3))}, flax_mha())


def test_gpt2_maps_onto_the_books_torch_gpt_and_gives_its_logits():
    """transformers' GPT2LMHeadModel (Conv1D weights ``(in, out)``, a fused ``c_attn``) onto
    torch_ref's GPTModel (``nn.Linear`` ``(out, in)``, separate query, key and value): the rows read
    from ``numpy_attn.hf_gpt2.HF_NAMES``, the logits equal."""
    config = TINY | {"qkv_bias": True}
    hf = hf_model(vocab_size=61, n_positions=16, n_embd=32, n_head=2, n_layer=2)
    book = torch_model(config, seed=1)
    mapping = map_weights(hf, book)
    assert mapping.target == "torch"
    assert mapping.rows[:3] == (
        ("tok_emb.weight", "transformer.wte.weight", "as is"),
        ("pos_emb.weight", "transformer.wpe.weight", "as is"),
        (
            "trf_blocks.0.att.W_query.weight",
            "transformer.h.0.attn.c_attn.weight",
            "transposed, q third of the output axis",
        ),
    )
    assert (
        "trf_blocks.1.att.out_proj.weight",
        "transformer.h.1.attn.c_proj.weight",
        "transposed",
    ) in mapping.rows
    printed = {line.split()[0]: line for line in str(mapping).splitlines()}  # for the user to confirm
    assert printed["trf_blocks.0.att.W_key.bias"].endswith(
        "<-  transformer.h.0.attn.c_attn.bias  (as is, k third of the output axis)"
    )
    assert mapping.apply(book) is book
    ids = token_ids(2, 9, config)
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()
        actual = book(torch.tensor(ids)).numpy()
    assert compare_arrays("logits", expected, actual).ok


def test_a_torch_target_takes_gpt2s_weights_only():
    with pytest.raises(ValueError, match=r"maps GPT-2's weights .* no GPT-2 block found"):
        map_weights({"weight": np.zeros((2, 2))}, torch_model(TINY))
    hf = hf_model(vocab_size=61, n_positions=16, n_embd=32, n_head=2, n_layer=2)
    with pytest.raises(
        ValueError, match=r"no torch tensor left fits torch parameter tok_emb\.weight of shape"
    ):
        map_weights(hf, torch_model(TINY | {"vocab_size": 60}))
