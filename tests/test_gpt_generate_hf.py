"""generate against transformers' generate on the same small random GPT-2: every option.

Greedy results equal transformers' token for token (left-padded batches, stop ids, min_new_tokens,
the streamer's calls). Sampling draws with another generator than torch's, so there the promises
are tested: each token sampled is one transformers' warpers keep, a seed repeats, and the
frequencies follow the softmax.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers  # its models load on first use (tests/test_gpt_hf.py)

import jax_attn
import numpy_attn
import torch_ref
from jax_attn import sampling as jax_sampling
from numpy_attn import sampling as numpy_sampling
from tests.gpt_cases import TINY, token_ids, torch_model

pytestmark = pytest.mark.xdist_group("transformers")  # on the worker that runs tests/test_gpt_hf.py

PAD = 0
# three prompts of 6, 4 and 1 tokens, left-padded to 6
MASK = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])
PROMPTS = np.where(MASK == 1, token_ids(3, 6, seed=11), PAD)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``(params, jax_attn's GPTModel, transformers' GPT2LMHeadModel)``, the same weights."""
    params = torch_ref.to_params(torch_model(seed=7))
    folder = tmp_path_factory.mktemp("gpt2")
    numpy_attn.save_hf_gpt2(folder, params, TINY)
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    return params, jax_attn.GPTModel.from_params(params, TINY), hf


def hf_generate(hf, ids, mask=None, **options):
    """transformers' greedy generate (or as ``options`` say), as NumPy."""
    mask = np.ones_like(ids) if mask is None else mask
    options = {"do_sample": False, "pad_token_id": PAD} | options
    with torch.no_grad():
        return hf.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), **options).numpy()


def ours(models, ids, max_new_tokens, **options):
    """numpy_attn's and jax_attn's generate, as NumPy: ``{"numpy": ..., "jax": ...}``."""
    params, model, _ = models
    jax_options = {name: jnp.asarray(v) if name == "attention_mask" else v for name, v in options.items()}
    return {
        "numpy": numpy_attn.generate(params, ids, TINY, max_new_tokens, **options),
        "jax": np.asarray(jax_attn.generate(model, jnp.asarray(ids), max_new_tokens, **jax_options)),
    }


@pytest.fixture(scope="module")
def free_run(models):
    """transformers' greedy tokens with no stop id: ``(3, 6 + 8)``, read-only."""
    tokens = hf_generate(models[2], PROMPTS, MASK, max_new_tokens=8)
    tokens.flags.writeable = False
    return tokens


def test_left_padded_prompts_equal_transformers_batch_and_each_row_alone(models, free_run):
    expected = free_run  # transformers' greedy tokens for the batch
    assert expected.shape == (3, 14)
    for name, actual in ours(models, PROMPTS, 8, attention_mask=MASK).items():
        np.testing.assert_array_equal(actual, expected, err_msg=name)
    for row, pads in enumerate((MASK == 0).sum(axis=1)):
        alone = hf_generate(models[2], PROMPTS[row : row + 1, pads:], max_new_tokens=8)
        np.testing.assert_array_equal(expected[row : row + 1, pads:], alone)


def test_a_bool_attention_mask_means_what_its_ints_mean(models):
    expected = ours(models, PROMPTS, 4, attention_mask=MASK)
    for name, actual in ours(models, PROMPTS, 4, attention_mask=MASK.astype(bool)).items():
        np.testing.assert_array_equal(actual, expected[name], err_msg=name)


@pytest.mark.parametrize("stops", ["one row", "every row", "a list"])
def test_stop_ids_end_each_row_and_pad_after_as_transformers(models, free_run, stops):
    """A row that picks an eos id gets ``pad_token_id`` after it; when every row has, generation
    ends early: transformers' shape and tokens, whatever the kind of stop."""
    if stops == "one row":
        eos = int(free_run[1, 6 + 2])  # row 1's third new token
    elif stops == "every row":
        eos = sorted({int(free_run[row, 6 + 1]) for row in range(3)})  # each row's second new token
    else:
        eos = [int(free_run[0, 6 + 4]), int(free_run[2, 6])]
    expected = hf_generate(models[2], PROMPTS, MASK, max_new_tokens=8, eos_token_id=eos, pad_token_id=60)
    if stops == "every row":
        assert expected.shape[1] < 14  # stopped before max_new_tokens
    else:
        assert (expected == 60).any()  # a row padded after its stop
    for name, actual in ours(
        models, PROMPTS, 8, attention_mask=MASK, eos_token_id=eos, pad_token_id=60
    ).items():
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def test_the_pad_id_defaults_to_the_eos_id_as_in_transformers(models, free_run):
    eos = int(free_run[1, 6 + 2])
    expected = hf_generate(models[2], PROMPTS, MASK, max_new_tokens=8, eos_token_id=eos, pad_token_id=eos)
    for name, actual in ours(models, PROMPTS, 8, attention_mask=MASK, eos_token_id=eos).items():
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def test_min_new_tokens_holds_the_stop_id_back_as_in_transformers(models, free_run):
    eos = int(free_run[0, 6])  # row 0's first new token: it would stop at once
    options = {"max_new_tokens": 8, "eos_token_id": eos, "pad_token_id": 60}
    expected = hf_generate(models[2], PROMPTS, MASK, min_new_tokens=3, **options)
    assert expected[0, 6] != eos and expected.shape[1] >= 9
    for name, actual in ours(models, PROMPTS, 8, attention_mask=MASK, min_new_tokens=3, eos_token_id=eos,
                             pad_token_id=60).items():  # fmt: skip
        np.testing.assert_array_equal(actual, expected, err_msg=name)


class Recorder:
    """A streamer: what ``put`` got, as NumPy arrays (transformers passes torch tensors), then "end"."""

    def __init__(self):
        self.calls = []

    def put(self, ids):
        self.calls.append(np.array(ids.numpy() if hasattr(ids, "numpy") else ids))

    def end(self):
        self.calls.append("end")


def test_a_streamer_gets_what_transformers_streamer_gets(models, free_run):
    """The prompt, then each step's tokens ``(B,)`` (pad after a row's eos), then ``end()``."""
    eos = int(free_run[1, 6 + 2])
    expected = Recorder()
    hf_generate(
        models[2], PROMPTS, MASK, max_new_tokens=6, eos_token_id=eos, pad_token_id=60, streamer=expected
    )
    assert len(expected.calls) == 1 + 6 + 1
    for run in (
        lambda s: numpy_attn.generate(models[0], PROMPTS, TINY, 6, attention_mask=MASK, eos_token_id=eos,
                                      pad_token_id=60, streamer=s),
        lambda s: jax_attn.generate(models[1], jnp.asarray(PROMPTS), 6, attention_mask=jnp.asarray(MASK),
                                    eos_token_id=eos, pad_token_id=60, streamer=s),
    ):  # fmt: skip
        actual = Recorder()
        result = run(actual)
        assert len(actual.calls) == len(expected.calls) and actual.calls[-1] == "end"
        for got, want in zip(actual.calls[:-1], expected.calls[:-1], strict=True):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.stack(actual.calls[1:-1], axis=1), np.asarray(result)[:, 6:])


WARPERS = pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, None, 0.7), (0.6, 5, 0.9), (1.7, 12, 0.3), (0.9, None, 0.0)]
)


def allowed(logits, temperature, top_k, top_p):
    """The tokens transformers' warpers keep from ``logits`` ``(B, V)``: bool ``(B, V)``."""
    from transformers.generation import logits_process as lp

    warpers = [lp.TemperatureLogitsWarper(temperature)] + (
        [] if top_k is None else [lp.TopKLogitsWarper(top_k)]
    )
    processed = lp.LogitsProcessorList([*warpers, lp.TopPLogitsWarper(top_p)])(None, torch.tensor(logits))
    return np.isfinite(processed.numpy())


@WARPERS
def test_the_tokens_kept_for_sampling_are_transformers_warpers(temperature, top_k, top_p):
    """temperature, then top_k, then top_p, on random logits: the same tokens kept (finite) as
    transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper."""
    logits = np.random.default_rng(3).standard_normal((4, 61)).astype(np.float32) * 3
    expected = allowed(logits, temperature, top_k, top_p)
    scaled = logits / temperature
    if top_k is not None:
        scaled = np.where(scaled < np.sort(scaled, axis=-1)[:, -top_k : -top_k + 1], -np.inf, scaled)
    for keep_top_p in (numpy_sampling.keep_top_p, jax_sampling.keep_top_p):
        actual = np.isfinite(np.asarray(keep_top_p(scaled.astype(np.float32), np.float32(top_p))))
        np.testing.assert_array_equal(actual, expected)


def test_a_top_p_of_one_keeps_every_token_as_transformers_does():
    """top_p = 1 keeps all V tokens (transformers adds no TopPLogitsWarper at 1), also where the
    cumulative probability rounds up to 1 before the least probable tokens (each row here, in
    float32, would drop some of its last ones)."""
    logits = np.random.default_rng(5).standard_normal((8, 1000)).astype(np.float32) * 3
    for keep_top_p in (numpy_sampling.keep_top_p, jax_sampling.keep_top_p):
        kept = np.isfinite(np.asarray(keep_top_p(logits, np.float32(1.0))))
        assert kept.sum(axis=-1).tolist() == [1000] * 8, keep_top_p.__module__


@WARPERS
def test_every_sampled_token_is_one_transformers_would_allow(models, temperature, top_k, top_p):
    """At each step, the token sampled is among those transformers' warpers keep from the logits of
    the sequence so far (the full pass's, numpy_attn.gpt_model); a seed repeats its tokens."""
    params, model, _ = models
    options = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    prompt = token_ids(4, 3, seed=12)
    runs = {
        "numpy": lambda seed: numpy_attn.generate(
            params, prompt, TINY, 6, rng=np.random.default_rng(seed), **options
        ),
        "jax": lambda seed: np.asarray(
            jax_attn.generate(model, jnp.asarray(prompt), 6, rng=jax.random.key(seed), **options)
        ),
    }
    for name, run in runs.items():
        sequences = run(0)
        np.testing.assert_array_equal(run(0), sequences, err_msg=name)
        for step in range(3, 9):
            logits = numpy_attn.gpt_model(params, sequences[:, :step], TINY)[:, -1]  # (B, V)
            keep = allowed(logits, temperature, top_k, top_p)
            assert keep[np.arange(4), sequences[:, step]].all(), (name, step)


def test_sampled_frequencies_follow_the_softmax(models):
    """4096 rows of one prompt, one token each: the frequencies of the tokens drawn are within 0.08
    (total variation) of softmax(logits / temperature), in both packages (the sampling noise alone
    is about 0.04 there; softmax(logits), the temperature left out, is 0.24 away)."""
    params, model, _ = models
    prompt = np.repeat(token_ids(1, 4, seed=13), 4096, axis=0)
    logits = numpy_attn.gpt_model(params, prompt[:1], TINY)[0, -1].astype(np.float64) / 0.5
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    for actual in (
        numpy_attn.generate(params, prompt, TINY, 1, temperature=0.5, rng=np.random.default_rng(5))[:, -1],
        np.asarray(jax_attn.generate(model, jnp.asarray(prompt), 1, temperature=0.5, rng=jax.random.key(5)))[
            :, -1
        ],
    ):
        frequencies = np.bincount(actual, minlength=TINY["vocab_size"]) / len(actual)
        assert 0.5 * np.abs(frequencies - expected).sum() < 0.08
