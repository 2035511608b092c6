"""Generation: cached decoding equals the full pass, greedy equals transformers', one compile per shape."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers  # its models load on first use (tests/test_gpt_hf.py)

import jax_attn
import numpy_attn
import torch_ref
from jax_attn import generation as jax_generation
from numpy_attn import gpt as numpy_gpt
from numpy_attn.gpt_spec import sub_params
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
        ("numpy", numpy_attn.gpt_model_decode, numpy_attn.init_gpt_cache, np.asarray),
        ("jax", jax_attn.gpt_model_decode, jax_attn.init_gpt_cache, jnp.asarray),
    ],
)
def test_cached_decode_logits_equal_the_full_pass(params, framework, decode, init, convert):
    ids = token_ids(2, 12)
    expected = numpy_attn.gpt_model(params, ids, TINY)  # (B, T, V)
    weights = {name: convert(value) for name, value in params.items()}

    def step(ids, caches):
        return decode(weights, ids, caches, TINY)

    if framework == "jax":  # two programs (7 tokens, then 1), where op by op compiles 140
        step = jax.jit(step)
    prefill, caches = step(convert(ids[:, :7]), init(TINY, 2))  # 7 tokens at once
    actual = [prefill]
    for position in range(7, 12):  # then one at a time
        logits, caches = step(convert(ids[:, position : position + 1]), caches)
        actual.append(logits)
    assert int(caches[0].length) == 12
    assert compare_arrays(f"{framework} logits", expected, np.concatenate(actual, axis=1)).ok


@pytest.mark.parametrize(
    "framework, decode, init, convert",
    [
        ("numpy", numpy_attn.gpt_model_decode, numpy_attn.init_gpt_cache, np.asarray),
        ("jax", jax_attn.gpt_model_decode, jax_attn.init_gpt_cache, jnp.asarray),
    ],
)
def test_a_left_padded_batch_decodes_as_each_row_alone(params, framework, decode, init, convert):
    """``padding_mask`` (True = padding) hides the padding and counts each row's positions from its
    first token: every row's logits are its own full pass's (prompt of 6, 3 and 1 tokens, 4 more
    decoded one at a time)."""
    pads = [0, 3, 5]
    ids = token_ids(3, 10, seed=4)
    padding = np.arange(10)[None, :] < np.array(pads)[:, None]  # (B, T)
    weights = {name: convert(value) for name, value in params.items()}

    def step(ids, caches, padding_mask=None):
        return decode(weights, ids, caches, TINY, padding_mask)

    if framework == "jax":  # two programs (6 tokens with a mask, then 1 without)
        step = jax.jit(step)
    logits, caches = step(convert(ids[:, :6]), init(TINY, 3), convert(padding[:, :6]))
    actual = [np.asarray(logits)]
    for position in range(6, 10):
        logits, caches = step(convert(ids[:, position : position + 1]), caches)
        actual.append(np.asarray(logits))
    actual = np.concatenate(actual, axis=1)  # (B, 10, V)
    for row, pad in enumerate(pads):
        expected = numpy_attn.gpt_model(params, ids[row : row + 1, pad:], TINY)  # (1, 10 - pad, V)
        assert compare_arrays(f"{framework} row {row}", expected, actual[row : row + 1, pad:]).ok


@pytest.mark.xdist_group("transformers")  # on the worker that runs tests/test_gpt_hf.py
def test_greedy_generation_equals_transformers_greedy_generate(params, model, tmp_path):
    numpy_attn.save_hf_gpt2(tmp_path, params, TINY)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    prompt = token_ids(2, 4, seed=3)
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor(prompt), attention_mask=torch.ones(prompt.shape, dtype=torch.long),
            max_new_tokens=9, do_sample=False, pad_token_id=0,
        ).numpy()  # fmt: skip
    assert expected.shape == (2, 13)
    np.testing.assert_array_equal(jax_attn.generate(model, jnp.asarray(prompt), 9), expected)
    np.testing.assert_array_equal(numpy_attn.generate(params, prompt, TINY, 9), expected)


def test_one_program_per_prompt_shape_and_cache_size_not_per_length_temperature_or_top_p(model):
    """The whole generation is one compiled program: its lengths, temperature, top_p, ids and key are
    arguments, so that other values of them reuse it (up to STOPS_STEP eos ids, none included, and
    an int or a bool attention_mask, too); the cache's size (T + max_new_tokens rounded up to
    CACHE_STEP, TINY's context at most), top_k and whether it samples are compiled in. The prompt's
    shape is the transformers test's, whose program the first call may reuse."""
    prompt = jnp.asarray(token_ids(2, 4, seed=5))
    jax_attn.generate(model, prompt, 2)
    compiled = jax_generation._generate._cache_size()
    assert jax_attn.generate(model, prompt, 12).shape == (2, 16)  # the same cache: TINY's 16 tokens
    jax_attn.generate(model, prompt, 2, eos_token_id=[3, 4], pad_token_id=5)
    jax_attn.generate(model, prompt, 2, eos_token_id=list(range(jax_generation.STOPS_STEP)))
    for mask in (np.ones((2, 4), np.int32), np.ones((2, 4), bool)):
        jax_attn.generate(model, prompt, 2, attention_mask=jnp.asarray(mask))
    assert jax_generation._generate._cache_size() == compiled
    jax_attn.generate(model, prompt, 2, temperature=0.5, top_p=0.9, rng=jax.random.key(0))  # sampling
    sampling = jax_generation._generate._cache_size()
    assert sampling == compiled + 1
    for temperature, top_p in ((0.7, 0.5), (1.5, 1.0), (10**30, 0.2)):
        jax_attn.generate(model, prompt, 3, temperature=temperature, top_p=top_p, rng=jax.random.key(1))
    assert jax_generation._generate._cache_size() == sampling


def test_the_program_keeps_its_caches_in_place(model):
    """No copy of a cache in the compiled program: XLA:CPU copied every cache two or three times per
    token (issue 31: 1.28 GB accessed per token for 0.50 GB of weights) while the attention read the
    cache it had just written, or without its copy insertion's region analysis (``IN_PLACE``)."""
    for dtype in (jnp.float32, jnp.bfloat16):
        half = jax_attn.GPTModel.from_params(
            {k: jnp.asarray(v, dtype) for k, v in model.to_params().items()}, TINY
        )
        prompt = jnp.asarray(token_ids(2, 4))  # the shape the other tests generate from in each dtype
        arguments, static = jax_generation.program_arguments(half, prompt, 5)
        program = jax_generation._generate.lower(*arguments, **static).compile().as_text()
        cache = f"[2,2,{static['cache_length']},16]"
        assert [line for line in program.splitlines() if " copy(" in line and cache in line] == []


def test_numpy_generate_writes_its_caches_in_place(params, monkeypatch):
    """One allocation of the caches, for T + max_new_tokens tokens, written at every step: the public
    decode functions copy a cache (caches are values), generate's own steps do not."""
    from numpy_attn import generation

    seen = []

    def decode(params, token_ids, caches, *args, **kwargs):
        seen.append((caches[0].keys, kwargs))
        return numpy_gpt.decode(params, token_ids, caches, *args, **kwargs)

    monkeypatch.setitem(
        generation.DECODING, "GPTModel", generation.Decoding(numpy_gpt.init_gpt_cache, decode)
    )
    numpy_attn.generate(params, token_ids(2, 3), TINY, 5)
    assert len(seen) == 5 and all(keys is seen[0][0] for keys, _ in seen)
    assert seen[0][0].shape == (2, 2, 3 + 5, 16)
    assert all(kwargs == {"last_only": True, "in_place": True} for _, kwargs in seen)


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
        ({"temperature": -1.0}, "temperature must be a finite number >= 0, got -1.0"),
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0, got inf"),
        (
            {"temperature": 10**400},
            "temperature must be a finite number >= 0, got an int of 1329 bits, beyond float64's range",
        ),
        (
            {"temperature": -(10**400)},
            "temperature must be a finite number >= 0, got an int of 1329 bits, beyond float64's range",
        ),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
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


class Recorder:
    """A streamer (transformers' protocol): what ``put`` got, as NumPy arrays, then ``"end"``."""

    def __init__(self):
        self.calls = []

    def put(self, ids):
        self.calls.append(np.array(ids))

    def end(self):
        self.calls.append("end")


LEFT_PADDED = np.array([[0, 0, 1], [1, 1, 1]])
NOT_LEFT_PADDED = (
    "attention_mask rows [0] are not left-padded: generate takes the padding before each row's tokens "
    "(transformers' padding_side='left'), and every row ends with a token"
)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"min_new_tokens": 3}, ValueError, "min_new_tokens=3 is more than max_new_tokens=2"),
        ({"min_new_tokens": -1}, ValueError, "min_new_tokens must be a non-negative integer, got -1"),
        ({"top_p": 1.5}, ValueError, "top_p must be None or a number in [0, 1], got 1.5"),
        ({"top_p": "0.9"}, TypeError, "top_p must be None or a number in [0, 1], got '0.9' (str)"),
        ({"top_p": True}, TypeError, "top_p must be None or a number in [0, 1], got True (bool)"),
        ({"eos_token_id": 61}, ValueError, "eos_token_id must be an id in [0, 61), got 61"),
        ({"eos_token_id": [3, -1]}, ValueError, "eos_token_id must be an id in [0, 61), got -1"),
        ({"eos_token_id": []}, ValueError,
         "eos_token_id must be None, an id in [0, 61) or a non-empty list of them, got []"),
        ({"eos_token_id": 2.0}, TypeError,
         "eos_token_id must be an id in [0, 61) (or, for eos_token_id, a list of them), got 2.0 (float)"),
        ({"pad_token_id": 61}, ValueError, "pad_token_id must be an id in [0, 61), got 61"),
        ({"attention_mask": np.ones((2, 4), np.int32)}, ValueError,
         "attention_mask must be a bool or integer array of token_ids' shape (2, 3) (1 = a token, 0 = "
         "padding), got int32 array of shape (2, 4)"),
        ({"attention_mask": np.ones((2, 3), np.float32)}, ValueError,
         "attention_mask must be a bool or integer array of token_ids' shape (2, 3) (1 = a token, 0 = "
         "padding), got float32 array of shape (2, 3)"),
        ({"attention_mask": np.full((2, 3), 2)}, ValueError,
         "attention_mask must hold 0 (padding) and 1 (a token) only"),
        ({"attention_mask": LEFT_PADDED[:, ::-1]}, ValueError, NOT_LEFT_PADDED),
        ({"attention_mask": np.array([[0, 0, 0], [1, 1, 1]])}, ValueError, NOT_LEFT_PADDED),
        ({"streamer": print}, TypeError,
         "streamer must be None or an object with methods put(ids) and end() (transformers' streamers: "
         "TextStreamer, TextIteratorStreamer), got builtin_function_or_method"),
    ],
)  # fmt: skip
def test_bad_generation_options_raise_one_text_in_both_packages(params, model, arguments, error, message):
    prompt = token_ids(2, 3)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        numpy_attn.generate(params, prompt, TINY, 2, **arguments)
    if "attention_mask" in arguments:
        arguments = arguments | {"attention_mask": jnp.asarray(arguments["attention_mask"])}
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        jax_attn.generate(model, jnp.asarray(prompt), 2, **arguments)


def test_a_streamer_that_raises_stops_nothing_but_its_error_reaches_the_caller(model):
    """The jitted loop calls the streamer from XLA's thread: its error is kept and raised by generate
    after the program, not lost there."""

    class Broken(Recorder):
        def put(self, ids):
            super().put(ids)
            if len(self.calls) == 3:
                raise RuntimeError("full")

    streamer = Broken()
    with pytest.raises(RuntimeError, match=r"^full$"):
        jax_attn.generate(model, jnp.asarray(token_ids(1, 3)), 4, streamer=streamer)
    assert len(streamer.calls) == 3  # the prompt and two steps: none after its error


def test_no_new_token_streams_the_prompt_and_ends(params, model):
    prompt = token_ids(2, 3)
    for run in (lambda s: numpy_attn.generate(params, prompt, TINY, 0, streamer=s),
                lambda s: jax_attn.generate(model, jnp.asarray(prompt), 0, streamer=s)):  # fmt: skip
        streamer = Recorder()
        np.testing.assert_array_equal(run(streamer), prompt)
        assert len(streamer.calls) == 2 and streamer.calls[1] == "end"
        np.testing.assert_array_equal(streamer.calls[0], prompt)


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


def generate_both(params, model, prompt, max_new_tokens, **arguments):
    """``(numpy_attn's, jax_attn's)`` generate, each with its own kind of rng when sampling."""
    numpy_rng = {"rng": np.random.default_rng(0)} if arguments.get("temperature") else {}
    jax_rng = {"rng": jax.random.key(0)} if arguments.get("temperature") else {}
    return (
        numpy_attn.generate(params, prompt, TINY, max_new_tokens, **arguments, **numpy_rng),
        jax_attn.generate(model, jnp.asarray(prompt), max_new_tokens, **arguments, **jax_rng),
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"max_new_tokens": True}, "max_new_tokens must be a non-negative integer, got True (bool)"),
        ({"temperature": True}, "temperature must be a finite number >= 0, got True (bool)"),
        ({"temperature": "0.5"}, "temperature must be a finite number >= 0, got '0.5' (str)"),
        ({"top_k": True}, "top_k must be None or an integer in [1, 61], got True (bool)"),
        ({"top_k": 2.0}, "top_k must be None or an integer in [1, 61], got 2.0 (float)"),
    ],
)  # fmt: skip
def test_generate_refuses_bools_and_other_types_for_its_numbers(params, model, arguments, message):
    """TypeError, as every size: ``top_k=True`` sampled as top_k=1 and ``temperature=True`` as 1.0."""
    arguments = {"max_new_tokens": 2, "temperature": 1.0} | arguments
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        generate_both(params, model, token_ids(1, 3), **arguments)


def test_a_tiny_temperature_samples_the_argmax_in_both_packages(params, model):
    """numpy_attn divided the logits by 1e-45 into inf and NaN ('Probabilities contain NaN', with
    RuntimeWarnings) while jax_attn returned tokens: now both take the greedy limit."""
    prompt = token_ids(2, 3, seed=6)
    greedy = numpy_attn.generate(params, prompt, TINY, 4)
    for temperature in (1e-45, 1e-320, np.float32(1e-45)):
        for top_k in (None, 3):
            actual = numpy_attn.generate(
                params, prompt, TINY, 4, temperature=temperature, top_k=top_k, rng=np.random.default_rng(0)
            )
            np.testing.assert_array_equal(actual, greedy)
            actual = jax_attn.generate(
                model, jnp.asarray(prompt), 4, temperature=temperature, top_k=top_k, rng=jax.random.key(0)
            )
            np.testing.assert_array_equal(actual, greedy)


def test_an_empty_batch_is_refused_naming_token_ids(params, model):
    """Not init_kv_cache's 'batch must be a positive int, got 0', which does not name token_ids."""
    message = "token_ids must have shape (B, T) with B >= 1 and T >= 1, got (0, 2)"
    prompt = np.zeros((0, 2), np.int64)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        numpy_attn.generate(params, prompt, TINY, 1)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        jax_attn.generate(model, jnp.asarray(prompt), 1)
    for decode, init in ((numpy_attn.gpt_model_decode, numpy_attn.init_gpt_cache),
                         (jax_attn.gpt_model_decode, jax_attn.init_gpt_cache)):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            decode(params, prompt, init(TINY, 1), TINY)


WIDE = {"vocab_size": 300, "context_length": 8, "emb_dim": 4, "n_heads": 2, "n_layers": 1,
        "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip


def greedy_280():
    """Weights under which greedy decoding always picks id 280, beyond uint8 and int8."""
    params = {name: np.zeros(shape, np.float32) for name, shape in numpy_attn.gpt_param_shapes(WIDE).items()}
    params["final_norm.shift"][:] = 1
    params["out_head.weight"][280] = 1
    return params


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_token_ids_too_narrow_for_the_vocabulary_are_refused(dtype):
    """uint8 ids made generate write 280 as 24 (wrapped), return it and feed it back: now every
    GPT entry point refuses a dtype that cannot hold vocab_size - 1."""
    params = greedy_280()
    wide_ids = numpy_attn.generate(params, np.array([[1, 2]]), WIDE, 2)
    np.testing.assert_array_equal(wide_ids, [[1, 2, 280, 280]])
    prompt = np.array([[1, 2]], dtype)
    name = np.dtype(dtype).name
    message = (
        f"token_ids has dtype {name}, which cannot hold the ids of vocab_size 300 (up to 299): "
        "give int32 or int64 ids"
    )
    model = jax_attn.GPTModel.from_params(params, WIDE)
    calls = [
        lambda: numpy_attn.generate(params, prompt, WIDE, 2),
        lambda: jax_attn.generate(model, jnp.asarray(prompt), 2),
        lambda: numpy_attn.gpt_model(params, prompt, WIDE),
        lambda: jax_attn.gpt_model(params, jnp.asarray(prompt), WIDE),
        lambda: model(jnp.asarray(prompt)),
        lambda: numpy_attn.gpt_model_decode(params, prompt, numpy_attn.init_gpt_cache(WIDE, 1), WIDE),
        lambda: jax_attn.gpt_model_decode(
            params, jnp.asarray(prompt), jax_attn.init_gpt_cache(WIDE, 1), WIDE
        ),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            call()


def test_narrow_token_ids_that_hold_the_vocabulary_are_kept(params, model):
    prompt = token_ids(2, 3, seed=6)
    expected = numpy_attn.generate(params, prompt, TINY, 5)  # vocab_size 61: int8 holds every id
    for actual in (
        numpy_attn.generate(params, prompt.astype(np.int8), TINY, 5),
        jax_attn.generate(model, jnp.asarray(prompt, jnp.int8), 5),
    ):
        assert actual.dtype == np.int8
        np.testing.assert_array_equal(actual, expected)


DECODERS = pytest.mark.parametrize(
    "package, convert", [(numpy_attn, np.asarray), (jax_attn, jnp.asarray)], ids=["numpy", "jax"]
)


def caches_of(package, batch=1, **changes):
    return package.init_gpt_cache(TINY | changes, batch)


@DECODERS
@pytest.mark.parametrize(
    "case, error, message",
    [
        ("one_cache_for_two_blocks", ValueError,
         "caches has 1 KVCache, but config['n_layers'] = 2 blocks need one each"),
        ("no_caches", ValueError, "caches has 0 KVCache, but config['n_layers'] = 2 blocks need one each"),
        ("a_kv_cache", TypeError,
         "caches must be a tuple of KVCache, one per block (init_gpt_cache(config, batch)), got KVCache"),
        ("other_batch", ValueError,
         "caches[0].keys has shape (2, 2, 16, 16), but the blocks' input of shape (1, 3, 32) with "
         "num_heads=2 needs (B, N, L, H) = (1, 2, L, 16)"),
        ("second_other_batch", ValueError,
         "caches[1].keys has shape (2, 2, 16, 16), but the blocks' input of shape (1, 3, 32) with "
         "num_heads=2 needs (B, N, L, H) = (1, 2, L, 16)"),
        ("float16_caches", TypeError, "caches[0] has dtype float16 but the blocks' input has dtype float32"),
        ("second_float16", TypeError, "caches[1] has dtype float16 but the blocks' input has dtype float32"),
        ("second_not_a_cache", TypeError,
         "caches[1] must be the KVCache of {package}.init_kv_cache(...), got builtins.tuple"),
        ("lengths_differ", ValueError,
         "the caches hold [3, 0] tokens: every block's cache must hold the same tokens"),
        ("full", ValueError, "caches[0] holds 15 of 16 tokens; 3 more do not fit"),
        ("id_minus_one", ValueError, "token_ids hold ids in [-1, 2], outside the vocabulary [0, 61)"),
        ("id_vocab_size", ValueError, "token_ids hold ids in [1, 61], outside the vocabulary [0, 61)"),
        ("float_ids", TypeError, "token_ids must be an integer array (B, T), got "),  # ndarray float64, ...
        ("one_axis_ids", ValueError,
         "token_ids must have shape (B, T) with B >= 1 and T >= 1, got (3,)"),
        ("config_missing_keys", ValueError,
         "config is missing keys ['n_heads']; a GPT config has ['vocab_size', 'context_length', "
         "'emb_dim', 'n_heads', 'n_layers', 'drop_rate', 'qkv_bias']"),
        ("missing_weight", ValueError, "params do not fit GPTModel: missing keys ['final_norm.scale']"),
    ],
)  # fmt: skip
def test_gpt_model_decode_checks_its_input(params, package, convert, case, error, message):
    """gpt_model_decode checked nothing: a cache short ran one block of two without a word, ids
    out of the vocabulary were read as others or raised IndexError. Now it makes gpt_model's and
    the decode functions' checks, with one text in both packages. A bad cache is named by its
    block (``caches[1]``): the decode functions' texts said ``cache`` and ``x``, whichever block."""
    ids, caches, config = np.array([[1, 2, 3]]), caches_of(package), TINY
    weights = {name: convert(value) for name, value in params.items()}
    if case == "one_cache_for_two_blocks":
        caches = caches[:1]
    elif case == "no_caches":
        caches = ()
    elif case == "a_kv_cache":
        caches = caches[0]
    elif case == "other_batch":
        caches = caches_of(package, batch=2)
    elif case == "second_other_batch":
        caches = (caches[0], caches_of(package, batch=2)[1])
    elif case == "float16_caches":
        caches = package.init_gpt_cache(TINY, 1, np.float16)
    elif case == "second_float16":
        caches = (caches[0], package.init_gpt_cache(TINY, 1, np.float16)[1])
    elif case == "second_not_a_cache":
        caches = (caches[0], tuple(caches[1]))
    elif case == "lengths_differ":
        _, advanced = package.gpt_model_decode(weights, convert(ids), caches, config)
        caches = (advanced[0], caches[1])
    elif case == "full":
        _, caches = package.gpt_model_decode(weights, convert(token_ids(1, 15)), caches, config)
    elif case.startswith("id_"):
        ids = np.array([[-1, 2, 1]]) if case == "id_minus_one" else np.array([[61, 2, 1]])
    elif case == "float_ids":
        ids = ids.astype(np.float64)
    elif case == "one_axis_ids":
        ids = ids[0]
    elif case == "config_missing_keys":
        config = {key: value for key, value in TINY.items() if key != "n_heads"}
    elif case == "missing_weight":
        weights = {name: value for name, value in weights.items() if name != "final_norm.scale"}
    message = message.format(package=package.__name__)
    with pytest.raises(error, match=f"^{re.escape(message)}"):
        package.gpt_model_decode(weights, convert(ids), caches, config)


def test_jitted_gpt_model_decode_checks_the_caches_as_it_traces(params):
    weights = {name: jnp.asarray(value) for name, value in params.items()}
    decode = jax.jit(lambda ids, caches: jax_attn.gpt_model_decode(weights, ids, caches, TINY))
    logits, caches = decode(jnp.asarray(token_ids(1, 3)), jax_attn.init_gpt_cache(TINY, 1))
    assert logits.shape == (1, 3, 61) and int(caches[0].length) == 3
    message = "caches has 1 KVCache, but config['n_layers'] = 2 blocks need one each"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):  # JAX adds a note on its frames
        decode(jnp.asarray(token_ids(1, 3)), jax_attn.init_gpt_cache(TINY, 1)[:1])


@pytest.mark.parametrize("package, jit", [(numpy_attn, False), (jax_attn, False), (jax_attn, True)])
def test_a_narrow_integer_cache_length_does_not_wrap_in_gpt_model_decode(package, jit):
    """numpy_attn's gpt_model_decode sliced the position embeddings at ``start + num_tokens`` in
    the caches' length type: np.uint8(255) + 1 wrapped to 0, the slice was empty, and the logits
    (1, 0, V) came back with no error, the length left at 255. Now the start is an int, as in the
    layers' decode: the logits are the full pass's, and the new length 256."""
    config = TINY | {"context_length": 300}
    weights = torch_ref.to_params(torch_model(config, seed=7))
    ids = token_ids(1, 256, config)
    expected = numpy_attn.gpt_model(weights, ids, config)[:, 255:]  # (1, 1, V)
    convert = np.asarray if package is numpy_attn else jnp.asarray
    weights = {name: convert(value) for name, value in weights.items()}

    def step(ids, caches):
        return package.gpt_model_decode(weights, ids, caches, config)

    if jit:
        step = jax.jit(step)
    _, caches = step(convert(ids[:, :255]), package.init_gpt_cache(config, 1))
    narrow = tuple(cache._replace(length=np.uint8(255)) for cache in caches)
    logits, caches = step(convert(ids[:, 255:]), narrow)
    assert logits.shape == (1, 1, 61)
    assert compare_arrays(f"{package.__name__} logits", expected, np.asarray(logits)).ok
    assert [int(cache.length) for cache in caches] == [256, 256]


@DECODERS
@pytest.mark.parametrize(
    "held, message",
    [
        (15, "x has 3 tokens (shape (1, 3, 32)) after the cache's 15, 18 in all, but context_length is 16"),
        (17, "x has 3 tokens (shape (1, 3, 32)) after the cache's 17, 20 in all, but context_length is 16"),
    ],
    ids=["past_the_context", "holding_more_than_the_context"],
)
def test_gpt_model_decode_past_the_context_says_what_the_layers_say(params, package, convert, held, message):
    """Caches of 20 tokens, longer than context_length 16 (taken, as by the layers): the GPT
    checked the tokens against min(20, 16), and said ``caches[0] holds 15 of 16 tokens; 3 more do
    not fit`` (the cache holds 20, and context_length went unnamed), or for a length of 17 that
    ``caches[0].length is 17, outside [0, 16]: not a cache's length``. Now it makes the layers'
    check (check_decode_room): the same text as the first block's multi_head_attention_decode."""
    weights = {name: convert(value) for name, value in params.items()}
    caches = tuple(package.init_kv_cache(1, 2, 20, 16) for _ in range(2))
    _, caches = package.gpt_model_decode(weights, convert(token_ids(1, 15)), caches, TINY)
    caches = tuple(cache._replace(length=held) for cache in caches)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        package.gpt_model_decode(weights, convert(token_ids(1, 3)), caches, TINY)
    attention = sub_params(weights, "trf_blocks.0.att.")  # the first block's attention
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        package.multi_head_attention_decode(
            attention, convert(np.zeros((1, 3, 32), np.float32)), caches[0], num_heads=2, context_length=16
        )


def test_jax_generate_takes_a_bfloat16_model_as_gpt_model_does(params):
    """generate checked the weights with numpy_attn's floats only: a bfloat16 GPTModel, which
    gpt_model and gpt_model_decode take, was refused by generate alone."""
    weights = {name: jnp.asarray(value, jnp.bfloat16) for name, value in params.items()}
    model = jax_attn.GPTModel.from_params(weights, TINY)
    prompt = jnp.asarray(token_ids(2, 4, seed=6))
    actual = jax_attn.generate(model, prompt, 4)
    caches = jax_attn.init_gpt_cache(TINY, 2, jnp.bfloat16)
    logits, _ = jax.jit(lambda *args: jax_attn.gpt_model_decode(*args, TINY))(weights, prompt, caches)
    np.testing.assert_array_equal(actual[:, 4], jnp.argmax(logits[:, -1], axis=-1))
    assert actual.shape == (2, 8)


def test_a_temperature_past_the_int64_or_the_logits_range_samples_in_both_packages(params):
    """Before: jax_attn raised JAX's OverflowError for an int temperature past int64 (2**70, a
    float64 of 1.2e21) and, with float16 logits, divided the tokens cut by ``top_k`` (-inf) by
    the temperature cast to inf: NaN, and token 0 sampled whatever it was. Now an int temperature
    is a float, and one past the logits' range divides as their largest value: ``top_k=1`` is
    greedy, whatever the temperature."""
    prompt = token_ids(2, 4, seed=6)  # the shape of the float16 programs in test_gpt_generate_half
    half = {name: value.astype(np.float16) for name, value in params.items()}
    model = jax_attn.GPTModel.from_params(half, TINY)
    greedy = jax_attn.generate(model, jnp.asarray(prompt), 3)
    for temperature in (2**70, 1e5):
        actual = jax_attn.generate(
            model, jnp.asarray(prompt), 3, temperature=temperature, top_k=1, rng=jax.random.key(0)
        )
        np.testing.assert_array_equal(actual, greedy)
    expected = numpy_attn.generate(half, prompt, TINY, 3)
    actual = numpy_attn.generate(
        half, prompt, TINY, 3, temperature=2**70, top_k=1, rng=np.random.default_rng(0)
    )
    np.testing.assert_array_equal(actual, expected)


def overflowing_float16_params(params):
    """TINY's weights in float16, all finite, whose activations overflow at the first new token's
    position (1 after a 1-token prompt: jax_attn compiles one step for both): its position
    embedding is +-65504 (float16's largest), and the first block's feed-forward adds 1000 to
    every position, which takes it to inf there; the prompt's position stays finite."""
    weights = {name: value.astype(np.float16) for name, value in params.items()}
    weights["pos_emb.weight"][1] = np.where(np.arange(TINY["emb_dim"]) % 2, 65504, -65504)
    weights["trf_blocks.0.ff.layers.2.bias"][:] = 1000
    return weights


OVERFLOW_MESSAGE = (
    "generate: the model's logits at step 2 of 4 are not finite (NaN or inf): its float16 "
    "activations overflow; compute in float32"
)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_numpy_generate_refuses_logits_that_overflow_naming_the_step(params, temperature):
    """A float16 model whose activations overflow gave NaN logits: sampling raised NumPy's
    "probabilities contain NaN", greedy picked the argmax of NaN without a word. Now a
    ValueError names the step (the prompt's logits, step 1, are finite)."""
    weights, prompt = overflowing_float16_params(params), np.array([[5]])
    with pytest.raises(ValueError, match=f"^{re.escape(OVERFLOW_MESSAGE)}$"):
        numpy_attn.generate(weights, prompt, TINY, 4, temperature=temperature, rng=np.random.default_rng(0))
    assert numpy_attn.generate(weights, prompt, TINY, 1).shape == (1, 2)


def test_jax_generate_refuses_logits_that_overflow_naming_the_step(params):
    """jax_attn's generate returned tokens picked from NaN logits: now numpy_attn's error, read
    from the flags its jitted steps return, after the last step (greedy: one compile pair)."""
    model = jax_attn.GPTModel.from_params(overflowing_float16_params(params), TINY)
    with pytest.raises(ValueError, match=f"^{re.escape(OVERFLOW_MESSAGE)}$"):
        jax_attn.generate(model, jnp.asarray([[5]]), 4)


@pytest.mark.parametrize("model_given", ["params", None, "module"])
def test_jax_generate_refuses_a_model_that_is_not_a_gpt_model(params, model_given):
    """numpy_attn.generate's params dict (the porting mistake), None or another module: a
    TypeError naming model and what it must be, not an AttributeError on ``model.config``."""
    given = {"params": params, None: None, "module": jax_attn.gpt_module.LayerNorm(4)}[model_given]
    message = (
        "model must be a jax_attn.GPTModel, Llama3Model or Qwen3Model (from_params(params, config) or "
        "jax_attn.from_hf(folder); numpy_attn.generate takes params and config instead), got "
        f"{type(given).__name__}"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.generate(given, jnp.asarray(token_ids(1, 3)), 2)
