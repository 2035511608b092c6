"""torch_ref's Llama 3 and Qwen3 against the book's own classes, and RoPE worked out by hand."""

import math

import numpy as np
import pytest
import torch
from llms_from_scratch import llama3, qwen3

import numpy_attn
import torch_ref
from numpy_attn.decoder_spec import rope_frequencies
from parity_tests.compare import compare_arrays
from tests.decoder_cases import CFGS, ROPE_FREQ, randomize_norms, token_ids

BOOK = {"Llama3Model": llama3.Llama3Model, "Qwen3Model": qwen3.Qwen3Model}


def book_model(model: str, seed: int = 3) -> torch.nn.Module:
    """The book's ``model`` (float32, its cfg's dtype a torch dtype), random norms, eval mode."""
    torch.manual_seed(seed)
    return randomize_norms(BOOK[model](CFGS[model] | {"dtype": torch.float32}).eval(), seed)


@pytest.mark.parametrize("model", list(BOOK))
def test_the_books_state_dict_loads_strictly_and_gives_the_books_logits(model):
    book = book_model(model)
    ours = getattr(torch_ref, model)(CFGS[model] | {"dtype": torch.float32}).eval()
    ours.load_state_dict(book.state_dict(), strict=True)  # RoPE's cos and sin: in neither state_dict
    assert set(ours.state_dict()) == set(book.state_dict())
    ids = torch.tensor(token_ids(num_tokens=16))
    with torch.no_grad():
        expected, actual = book(ids), ours(ids)
    assert compare_arrays("logits", expected, actual).ok  # RoPE's tables differ in rounding (torch_ref.rope)


@pytest.mark.parametrize("model", list(BOOK))
def test_the_rope_tables_are_the_books(model):
    book, ours = book_model(model), getattr(torch_ref, model)(CFGS[model])
    for name in ("cos", "sin"):
        assert compare_arrays(name, getattr(book, name), getattr(ours, name)).ok


def test_rope_rotates_each_pair_by_its_position_worked_by_hand():
    """H = 2: one pair, inv_freq = base^0 = 1, so the token at position p turns by p radians."""
    cos, sin = torch_ref.compute_rope_params(2, theta_base=10_000.0, context_length=4)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [3.0, 4.0]])[None, None]  # (1, 1, T=4, H=2)
    expected = [[1.0, 0.0], [-math.sin(1), math.cos(1)], [math.cos(2), math.sin(2)],
                [3 * math.cos(3) - 4 * math.sin(3), 3 * math.sin(3) + 4 * math.cos(3)]]  # fmt: skip
    actual = torch_ref.apply_rope(x, cos, sin)[0, 0]
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(numpy_attn.rope(x.numpy())[0, 0], expected, rtol=1e-6, atol=1e-6)


def test_rope_halves_are_paired_not_neighbours():
    """H = 4: pairs (x[0], x[2]) at frequency 1 and (x[1], x[3]) at base^(-1/2) = 0.01: the
    half-split rotation of the book and transformers, not the RoFormer paper's (x[0], x[1])."""
    cos, sin = torch_ref.compute_rope_params(4, theta_base=10_000.0, context_length=2)
    x = torch.tensor([1.0, 0.0, 0.0, 0.0])[None, None, None].repeat(1, 1, 2, 1)  # (1, 1, 2, 4)
    actual = torch_ref.apply_rope(x, cos, sin)[0, 0, 1]
    np.testing.assert_allclose(actual.numpy(), [math.cos(1), 0.0, math.sin(1), 0.0], rtol=1e-6, atol=1e-7)


def test_llama3_scaling_keeps_high_divides_low_and_interpolates_between_frequencies():
    """Head size 8, base 500000: frequencies 1, 500000^-1/4, ^-1/2, ^-3/4, wavelengths 2 pi / f =
    6.3, 170, 4400, 120000 against 1024 / 32 = 32 and 1024 / 1 = 1024 (``decoder_cases.ROPE_FREQ``)."""
    plain = [500_000.0 ** (-i / 4) for i in range(4)]
    smooth = (1024 / (2 * math.pi / plain[1]) - 1) / (32 - 1)
    expected = [plain[0], (1 - smooth) * plain[1] / 8 + smooth * plain[1], plain[2] / 8, plain[3] / 8]
    actual = torch_ref.rope.rope_frequencies(8, 500_000.0, ROPE_FREQ)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-7)
    np.testing.assert_array_equal(rope_frequencies(8, 500_000.0, ROPE_FREQ), actual.numpy())  # NumPy's


def test_rope_scores_depend_on_the_distance_alone():
    """q at position p against k at position s: the same score for (p, s) = (3, 1) and (7, 5), to the
    rounding of the float32 angles (the book's and transformers')."""
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, generator=generator, dtype=torch.float64)
    cos, sin = torch_ref.compute_rope_params(8, context_length=8, dtype=torch.float64)
    rows = torch.stack([q, k])[None, :, None].repeat(1, 1, 8, 1)  # (1, 2, T=8, H=8): at every position
    q_at, k_at = torch_ref.apply_rope(rows, cos, sin)[0]  # (8, 8) each
    assert torch.isclose(q_at[3] @ k_at[1], q_at[7] @ k_at[5], rtol=1e-6)
    assert not torch.isclose(q_at[3] @ k_at[1], q_at[3] @ k_at[2], rtol=1e-3)


@pytest.mark.parametrize("model", list(BOOK))
def test_the_trace_names_every_step_of_every_block(model):
    ours = getattr(torch_ref, model)(CFGS[model]).eval()
    with torch.no_grad():
        logits, steps = ours(torch.tensor(token_ids()), return_steps=True)
    block = ["norm1", "att", "shortcut1", "norm2", "ff", "output"]
    expected = [
        "embeddings",
        *(f"trf_blocks.{i}.{s}" for i in range(2) for s in block),
        "final_norm",
        "output",
    ]
    assert list(steps) == expected
    assert torch.equal(steps["output"], logits)
    att = ours.trf_blocks[0].att
    with torch.no_grad():
        _, att_steps = att(steps["trf_blocks.0.norm1"], ours.cos, ours.sin, return_steps=True)
    qk_norm = ["q_norm", "k_norm"] if model == "Qwen3Model" else []
    attention = ["attn_scores", "masked_scores", "attn_weights", "context_vec", "output"]
    expected = ["queries", "keys", "values", *qk_norm, "queries_rope", "keys_rope", *attention]
    assert list(att_steps) == expected
    assert att_steps["keys_rope"].shape == (
        2,
        2,
        11,
        att.head_dim,
    )  # the key/value heads, not the query heads


@pytest.mark.parametrize("model", list(BOOK))
def test_a_cfg_missing_a_key_is_named(model):
    cfg = {key: value for key, value in CFGS[model].items() if key != "n_kv_groups"}
    with pytest.raises(ValueError, match=rf"cfg is missing keys \['n_kv_groups'\]; a {model} cfg has"):
        getattr(torch_ref, model)(cfg)
