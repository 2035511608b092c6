"""Generation: cached decoding equals the full pass, greedy equals transformers', one compile per shape."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

import jax_attn
import numpy_attn
import torch_ref
from jax_attn import gpt_generate as jax_generate
from numpy_attn import gpt_generate as numpy_generate
from parity_tests.compare import compare_arrays
from tests.gpt_cases import TINY, token_ids, torch_model


@pytest.fixture(scope="module")
def params():
    return torch_ref.to_params(torch_model(seed=7))


@pytest.fixture(scope="module")
def model(params):
    return jax_attn.GPTModel.from_params(params, TINY)


@pytest.mark.parametrize(
    "framework, decode, init, convert",
    [
        ("numpy", numpy_generate.gpt_model_decode, numpy_generate.init_gpt_cache, np.asarray),
        ("jax", jax_generate.gpt_model_decode, jax_generate.init_gpt_cache, jnp.asarray),
    ],
)
def test_cached_decode_logits_equal_the_full_pass(params, framework, decode, init, convert):
    ids = token_ids(2, 12)
    expected = numpy_attn.gpt_model(params, ids, TINY)  # (B, T, V)
    weights = {name: convert(value) for name, value in params.items()}
    caches = init(TINY, 2)
    prefill, caches = decode(weights, convert(ids[:, :7]), caches, TINY)  # 7 tokens at once
    actual = [prefill]
    for position in range(7, 12):  # then one at a time
        logits, caches = decode(weights, convert(ids[:, position : position + 1]), caches, TINY)
        actual.append(logits)
    assert int(caches[0].length) == 12
    assert compare_arrays(f"{framework} logits", expected, np.concatenate(actual, axis=1)).ok


def test_greedy_generation_equals_transformers_greedy_generate(params, model, tmp_path):
    numpy_attn.save_hf_gpt2(tmp_path, params, TINY)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    prompt = token_ids(2, 4, seed=3)
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompt), attention_mask=torch.ones(prompt.shape, dtype=torch.long),
            max_new_tokens=9, do_sample=False, pad_token_id=0,
        ).numpy()  # fmt: skip
    assert expected.shape == (2, 13)
    np.testing.assert_array_equal(jax_attn.generate(model, jnp.asarray(prompt), 9), expected)
    np.testing.assert_array_equal(numpy_attn.generate(params, prompt, TINY, 9), expected)


def test_the_decode_step_compiles_once_per_shape_not_per_token(model):
    prompt = jnp.asarray(token_ids(1, 3, seed=5))
    jax_attn.generate(model, prompt, 2)  # compiles the prompt's step and the one-token step
    compiled = jax_generate._step._cache_size()
    longer = jax_attn.generate(model, prompt, 12)
    assert longer.shape == (1, 15)
    assert jax_generate._step._cache_size() == compiled


def test_sampling_is_reproducible_and_top_k_1_is_greedy(params, model):
    prompt = token_ids(2, 3, seed=6)
    first = jax_attn.generate(model, jnp.asarray(prompt), 8, temperature=1.5, rng=jax.random.key(0))
    again = jax_attn.generate(model, jnp.asarray(prompt), 8, temperature=1.5, rng=jax.random.key(0))
    other = jax_attn.generate(model, jnp.asarray(prompt), 8, temperature=1.5, rng=jax.random.key(1))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    greedy = numpy_attn.generate(params, prompt, TINY, 8)
    for actual in (
        jax_attn.generate(model, jnp.asarray(prompt), 8, temperature=0.7, top_k=1, rng=jax.random.key(2)),
        numpy_attn.generate(params, prompt, TINY, 8, temperature=0.7, top_k=1, rng=np.random.default_rng(2)),
    ):
        np.testing.assert_array_equal(actual, greedy)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"max_new_tokens": 14},
            "token_ids has T=3 tokens; with max_new_tokens=14 that exceeds context_length 16",
        ),
        ({"max_new_tokens": -1}, "max_new_tokens must be a non-negative integer, got -1"),
        ({"temperature": 1.0}, r"sampling \(temperature > 0\) needs rng"),
        ({"temperature": -1.0}, "temperature must be a number >= 0, got -1.0"),
        ({"top_k": 0}, r"top_k must be None or an integer in \[1, 61\], got 0"),
    ],
)
def test_bad_generate_arguments(params, model, arguments, message):
    prompt = token_ids(1, 3)
    arguments = {"max_new_tokens": 2} | arguments
    max_new_tokens = arguments.pop("max_new_tokens")
    with pytest.raises(ValueError, match=message):
        jax_attn.generate(model, jnp.asarray(prompt), max_new_tokens, **arguments)
    with pytest.raises(ValueError, match=message):
        numpy_attn.generate(params, prompt, TINY, max_new_tokens, **arguments)


def the_layers_error(dropout, **rng):
    """The TypeError a layer's dropout raises for ``rng`` (numpy_attn) or ``key`` (jax_attn)."""
    with pytest.raises(TypeError) as expected:
        dropout(np.ones((2, 3), np.float32), 0.5, **rng)
    return str(expected.value)


@pytest.mark.parametrize(
    "rng", [0, np.random.RandomState(0), jax.random.key(0)], ids=["int", "RandomState", "key"]
)
def test_numpy_generate_refuses_an_rng_that_is_not_a_generator(params, rng):
    """Not ``'int' object has no attribute 'choice'``, nor a legacy RandomState taken: the layers'
    rng TypeError, word for word."""
    message = the_layers_error(numpy_attn.dropout, rng=rng)
    assert message.startswith("rng must be a numpy.random.Generator")
    for temperature in (0.0, 1.0):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            numpy_attn.generate(params, token_ids(1, 3), TINY, 2, temperature=temperature, rng=rng)


@pytest.mark.parametrize(
    "rng", [0, np.random.default_rng(0), np.zeros(2, np.int32)], ids=["int", "Generator", "ints"]
)
def test_jax_generate_refuses_an_rng_that_is_not_a_key(model, rng):
    """The layers' key TypeError, word for word but for the argument's name, instead of JAX's own
    error."""
    message = the_layers_error(jax_attn.dropout, key=rng).replace("key must be", "rng must be", 1)
    assert message.startswith("rng must be a jax.random key")
    for temperature in (0.0, 1.0):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            jax_attn.generate(model, jnp.asarray(token_ids(1, 3)), 2, temperature=temperature, rng=rng)
