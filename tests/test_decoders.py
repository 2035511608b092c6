"""The book's Llama 3 and Qwen3 in NumPy and JAX: the book's weights give its logits, every step
matches torch_ref, the grouped KV cache decodes as the full pass does."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from llms_from_scratch import llama3, qwen3

import jax_attn
import numpy_attn
import torch_ref
from numpy_attn.decoder_spec import GQA_STEPS
from parity_tests.compare import compare_arrays, compare_steps
from parity_tests.frameworks import jax_context
from tests.decoder_cases import CFGS, FUNCTIONS, randomize_norms, token_ids, torch_decoder

MODELS = list(CFGS)
PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}


@pytest.mark.parametrize("model", MODELS)
def test_the_books_weights_in_numpy_and_jax_give_the_books_logits(model):
    book_class = {"Llama3Model": llama3.Llama3Model, "Qwen3Model": qwen3.Qwen3Model}[model]
    torch.manual_seed(4)
    book = randomize_norms(book_class(CFGS[model] | {"dtype": torch.float32}).eval(), 4)
    state_dict = {name: value.numpy() for name, value in book.state_dict().items()}
    ids = token_ids(num_tokens=16)
    with torch.no_grad():
        expected = book(torch.tensor(ids)).numpy()
    function, cfg = FUNCTIONS[model], CFGS[model]
    for actual in (
        getattr(numpy_attn, function)(state_dict, ids, cfg),
        getattr(jax_attn, function)(state_dict, jnp.asarray(ids), cfg),
        getattr(jax_attn, model).from_params(state_dict, cfg)(jnp.asarray(ids)),
    ):
        assert compare_arrays("logits", expected, actual).ok


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("model", MODELS)
def test_every_step_matches_torch_ref_in_float64(model, package):
    torch_model = torch_decoder(model, seed=5, dtype="float64")
    ids = token_ids()
    with torch.no_grad():
        _, expected = torch_model(torch.tensor(ids), return_steps=True)
    params = torch_ref.to_params(torch_model)
    with jax_context("float64"):
        _, actual = getattr(PACKAGES[package], FUNCTIONS[model])(params, ids, CFGS[model], return_steps=True)
        if package == "jax":  # the Flax model's steps too, under nnx.jit (one program, as the function's)
            module = getattr(jax_attn, model).from_params(params, CFGS[model])
            _, module_steps = nnx.jit(lambda m, x: m(x, return_steps=True))(module, ids)
            assert compare_steps(expected, module_steps).ok
    assert compare_steps(expected, actual).ok


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("model", MODELS)
def test_the_attention_steps_match_torch_ref(model, package):
    torch_model = torch_decoder(model, seed=6, dtype="float64")
    att, x = torch_model.trf_blocks[1].att, torch.randn(2, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        _, expected = att(x, torch_model.cos, torch_model.sin, return_steps=True)
    arguments = numpy_attn.decoder_spec.attention_arguments(CFGS[model], model)
    with jax_context("float64"):
        _, actual = PACKAGES[package].grouped_query_attention(
            torch_ref.to_params(att), x.numpy(), **arguments, return_steps=True
        )
    assert [name for name in GQA_STEPS if name in expected] == list(expected) == list(actual)
    assert compare_steps(expected, actual).ok


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("model", MODELS)
def test_decoding_with_the_grouped_cache_gives_the_full_pass(model, package):
    """Prefill 5 tokens, then one at a time: the full pass's logits, from caches of the G = 2
    key/value heads (not the 4 query heads)."""
    cfg, fw = CFGS[model], PACKAGES[package]
    params = torch_ref.to_params(torch_decoder(model, seed=7, dtype="float64"))
    ids = token_ids(num_tokens=9)
    decode = getattr(fw, f"{FUNCTIONS[model]}_decode")
    with jax_context("float64"):
        expected = getattr(fw, FUNCTIONS[model])(params, ids, cfg)
        caches = fw.init_decoder_cache(cfg, 2, np.float64)
        head_dim = numpy_attn.decoder_spec.head_dim(cfg, model)
        assert [cache.keys.shape for cache in caches] == [(2, 2, 16, head_dim)] * 2  # (B, G, L, H)
        logits, caches = decode(params, ids[:, :5], caches, cfg)
        pieces = [logits]
        for t in range(5, 9):
            logits, caches = decode(params, ids[:, t : t + 1], caches, cfg)
            pieces.append(logits)
    assert int(caches[0].length) == 9
    assert compare_arrays("logits", expected, np.concatenate([np.asarray(p) for p in pieces], axis=1)).ok


def expanded_groups(params: dict, num_heads: int, num_kv_groups: int, head_dim: int, order: str) -> dict:
    """A GQA layer's weights with each key/value head repeated for the query heads that read it
    (``order="repeat"``: K1 K1 K2 K2, the book's ``repeat_interleave``) or in turn (``"tile"``: K1
    K2 K1 K2), so that ``num_kv_groups = num_heads`` computes the same attention, or not."""
    expanded = dict(params)
    for name in ("W_key.weight", "W_value.weight"):
        heads = params[name].reshape(num_kv_groups, head_dim, -1)  # (G, H, D)
        heads = (
            np.repeat(heads, num_heads // num_kv_groups, axis=0)
            if order == "repeat"
            else np.tile(heads, (num_heads // num_kv_groups, 1, 1))
        )  # (N, H, D)
        expanded[name] = heads.reshape(num_heads * head_dim, -1)
    return expanded


@pytest.mark.parametrize("package", list(PACKAGES))
def test_query_head_n_reads_key_value_head_n_over_the_group_size(package):
    att = torch_decoder("Qwen3Model", seed=8, dtype="float64").trf_blocks[0].att
    params, x = torch_ref.to_params(att), np.random.default_rng(8).standard_normal((2, 6, 32))
    fw, options = PACKAGES[package], {"rope_base": 10_000.0, "num_heads": 4}
    with jax_context("float64"):
        expected = fw.grouped_query_attention(params, x, num_kv_groups=2, **options)
        repeated = fw.grouped_query_attention(
            expanded_groups(params, 4, 2, 12, "repeat"), x, num_kv_groups=4, **options
        )
        tiled = fw.grouped_query_attention(
            expanded_groups(params, 4, 2, 12, "tile"), x, num_kv_groups=4, **options
        )
    assert compare_arrays("output", expected, repeated).ok
    assert not compare_arrays("output", expected, tiled).ok


@pytest.mark.parametrize("model", MODELS)
def test_earlier_logits_do_not_see_later_tokens(model):
    params = torch_ref.to_params(torch_decoder(model, seed=9))
    ids = token_ids(num_tokens=8)
    changed = ids.copy()
    changed[:, 5:] = (changed[:, 5:] + 1) % 61
    function = getattr(numpy_attn, FUNCTIONS[model])
    before, after = function(params, ids, CFGS[model]), function(params, changed, CFGS[model])
    np.testing.assert_array_equal(before[:, :5], after[:, :5])  # the same ops on the same inputs
    assert not np.allclose(before[:, 5:], after[:, 5:])


@pytest.mark.parametrize("model", MODELS)
def test_the_jax_model_round_trips_the_weights_format_in_torch_order(model):
    expected = torch_ref.to_params(torch_decoder(model, seed=10))
    state_dict = expected | {"cos": np.zeros((16, 8), np.float32), "sin": np.zeros((16, 8), np.float32)}
    actual = getattr(jax_attn, model).from_params(state_dict, CFGS[model]).to_params()  # buffers ignored
    assert list(actual) == list(expected) == list(numpy_attn.decoder_param_shapes(CFGS[model], model))
    assert all(np.array_equal(actual[name], expected[name]) for name in expected)


@pytest.mark.parametrize("model", MODELS)
def test_a_randomly_built_jax_model_loads_into_torch_and_agrees_under_jit(model):
    jax_model = getattr(jax_attn, model)(CFGS[model], rngs=nnx.Rngs(11))
    params = jax_model.to_params()
    ids = token_ids()
    torch_model = torch_ref.load_params(getattr(torch_ref, model)(CFGS[model]).eval(), params)
    with torch.no_grad():
        expected = torch_model(torch.tensor(ids)).numpy()
    assert compare_arrays("logits", expected, nnx.jit(lambda m, x: m(x))(jax_model, jnp.asarray(ids))).ok
    # torch's initialisation: embeddings N(0, 1), RMSNorms ones, Linear within ±1/sqrt(in)
    assert 0.8 < params["tok_emb.weight"].std() < 1.2
    norm = "final_norm.weight" if model == "Llama3Model" else "final_norm.scale"
    assert np.array_equal(params[norm], np.ones(32, np.float32))
    assert np.abs(params["trf_blocks.0.ff.fc3.weight"]).max() <= 1 / np.sqrt(48)
