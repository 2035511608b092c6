"""Text generation in JAX: the prefill and the whole decoding loop in one XLA program.

``generate`` has numpy_attn's names and meanings (transformers' ``generate``: see
``numpy_attn.generation``) for a ``GPTModel``, ``Llama3Model`` or ``Qwen3Model``; ``rng`` is a
``jax.random`` key. ``DECODING`` holds each model's caches and decoding step (numpy_attn's table,
with jax_attn's functions). One jitted program runs the prompt's pass, then a ``lax.while_loop``
that decodes a token, picks the next one and stops at ``max_new_tokens`` or when every row has
reached an eos id: no dispatch and no host wait per token.
Its caches (float32 for a 16-bit model on a CPU: ``cache_dtype``) hold T + ``max_new_tokens``
tokens rounded up to ``CACHE_STEP`` (so that one program serves nearby lengths; each is compiled
once per prompt shape, cache size and sampling options, and the temperature, ``top_p``, ids and
lengths are its arguments; the eos ids are padded to a multiple of ``STOPS_STEP`` with -1, an id no
token has, so that one program serves up to that many). The caches are loop carries that
XLA updates in place: the program reads the weights as the model holds them (the Linear kernels
``(in, out)``, transposed inside the program, where XLA folds each transpose into its product;
16-bit ones in torch's layout, ``generation_params``, which the loop reads as they are:
``reads_16_bit``), a decoding step reads each weight once and the cache once
(``python -m parity_tests.bench.gpt`` measures its bytes, ``benchmarks/gpt/results.md``).
A ``streamer`` gets each step's tokens from the loop through ``jax.experimental.io_callback``.
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jax_attn.ops import linear
from jax_attn.sampling import next_tokens, suppress_stops
from numpy_attn import finite
from numpy_attn.decoder_spec import MODELS, model_kind
from numpy_attn.generation import decoding, fill_id, stop_ids
from numpy_attn.generation_checks import check_generate_call
from numpy_attn.gpt_checks import check_logits_finite, check_model_params

DECODING = decoding("jax_attn")  # model kind (decoder_spec.model_kind) -> its caches and decoding step

FLOAT32_MAX = float(np.finfo(np.float32).max)
CACHE_STEP = 64  # the caches' length is T + max_new_tokens rounded up to a multiple of this
STOPS_STEP = 4  # the eos ids (none too) are padded with -1 to a multiple of this, at least this many
# XLA:CPU's copy insertion keeps a loop's cache in place only with its region analysis (without it,
# every token copies every cache two or three times); the GPU backend's flag, for the same reason
IN_PLACE = {
    "xla_cpu_copy_insertion_use_region_analysis": True,
    "xla_gpu_copy_insertion_use_region_analysis": True,
}


# _generate's static arguments: one program per model, config, cache size and sampling options
STATIC = (
    "kind", "config_items", "transposed", "cache_length", "cache_dtype",
    "top_k", "sample", "use_top_p", "stream",
)  # fmt: skip

# the streamers of the calls running now, by the id their program passes to _put
_STREAMS: dict[int, dict[str, Any]] = {}
_STREAM_IDS = itertools.count()


def _put(stream_id: np.ndarray, tokens: np.ndarray) -> None:
    """The io_callback of a step: its tokens to the call's streamer (an error kept for the caller)."""
    stream = _STREAMS[int(stream_id)]
    if stream["error"] is None:
        try:
            stream["streamer"].put(np.asarray(tokens))
        except Exception as error:  # raised again by generate, after the program
            stream["error"] = error


@functools.partial(
    jax.jit,
    static_argnames=STATIC,
    compiler_options=IN_PLACE,
)
def _generate(
    stored, token_ids, padding, max_new_tokens, min_new_tokens, temperature, top_p, stops, fill, key,
    stream_id, *, kind, config_items, transposed, cache_length, cache_dtype, top_k, sample, use_top_p, stream,
):  # fmt: skip
    """The sequences ``(B, cache_length)`` (the prompt, the new tokens, then ``fill``), the number of
    new tokens and the first step whose logits were not finite (0: none; 1 is the prompt's pass)."""
    config = {name: dict(value) if isinstance(value, tuple) else value for name, value in config_items}
    params = torch_layout(stored, transposed)
    batch, num_tokens = token_ids.shape
    init_cache, decode = DECODING[kind]
    caches = init_cache(config | {"context_length": cache_length}, batch, cache_dtype)
    logits, caches = decode(
        params, token_ids, caches, config, padding, last_only=True, empty=True, linear=accumulating_linear
    )  # the prompt's pass
    sequences = jnp.full((batch, cache_length), fill, token_ids.dtype).at[:, :num_tokens].set(token_ids)

    def pick(state):
        """The step's tokens from its logits: each row's next token, or ``fill`` once finished."""
        new, logits, caches, sequences, _, finished, bad_step = state
        last = logits[:, -1].astype(jnp.float32)  # (B, V)
        bad_step = jnp.where((bad_step == 0) & ~jnp.isfinite(last).all(), new + 1, bad_step)
        last = suppress_stops(last, stops, new, min_new_tokens)
        if sample:
            step_key = jax.random.fold_in(key, new)
            tokens = next_tokens(last, step_key, temperature, top_k, top_p if use_top_p else None)
        else:
            tokens = jnp.argmax(last, axis=-1)  # (B,)
        tokens = jnp.where(finished, fill, tokens).astype(token_ids.dtype)  # (B,)
        finished = finished | (tokens[:, None] == stops[None, :]).any(axis=-1)
        start = (jnp.zeros_like(new), num_tokens + new)  # indices of one integer type (int64 with x64)
        sequences = jax.lax.dynamic_update_slice(sequences, tokens[:, None], start)
        if stream:
            io_callback(_put, None, stream_id, tokens, ordered=True)
        return new + 1, logits, caches, sequences, tokens, finished, bad_step

    def go_on(state):
        new, _, _, _, _, finished, bad_step = state
        return (new < max_new_tokens) & ~finished.all() & (bad_step == 0)

    def step(state):
        new, _, caches, sequences, tokens, finished, bad_step = state
        step_stored = stored
        if reads_16_bit(params["tok_emb.weight"].dtype, batch):
            # the weights tied to the step's tokens: otherwise XLA hoists out of the loop the
            # float32 conversion of each weight that its products read as they are, and every
            # step reads that float32 copy, twice the weights' bytes
            step_stored, tokens = jax.lax.optimization_barrier((stored, tokens))
        logits, caches = decode(
            torch_layout(step_stored, transposed), tokens[:, None], caches, config,
            last_only=True, linear=accumulating_linear,
        )  # fmt: skip  # transposed after the barrier, where XLA folds each transpose into its product
        return pick((new, logits, caches, sequences, tokens, finished, bad_step))

    zero = jnp.zeros((), jnp.int32)
    state = pick((zero, logits, caches, sequences, token_ids[:, -1], jnp.zeros(batch, bool), zero))
    new, _, _, sequences, _, _, bad_step = jax.lax.while_loop(go_on, step, state)
    return sequences, new, bad_step


# model -> (the kernels it held, them in torch's layout): see generation_params
_HALF_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def generation_params(model: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """The weights ``_generate`` reads, and the names it transposes. float32 and float64 kernels as
    the model holds them, ``(in, out)`` (transposed in the program: XLA folds each into its GEMV).
    16-bit ones in torch's layout ``(out, in)``: XLA:CPU reads a 16-bit weight without first
    converting it to float32 (five times the bytes) only in that layout (its GEMV then runs on two
    threads). They are made once and kept while the model holds the same kernels (one copy of its
    Linear weights more)."""
    stored, transposed = model.stored_params()
    if stored["tok_emb.weight"].dtype.itemsize != 2:
        return stored, transposed
    names = sorted(transposed)
    kernels = tuple(stored[name] for name in names)
    held, view = _HALF_VIEWS.get(model, ((), {}))
    if len(held) != len(kernels) or any(a is not b for a, b in zip(held, kernels, strict=False)):
        view = {name: jnp.asarray(kernel.T) for name, kernel in zip(names, kernels, strict=True)}
        _HALF_VIEWS[model] = (kernels, view)
    return stored | view, frozenset()


def cache_dtype(weight: jax.Array) -> np.dtype:
    """The dtype of the caches ``_generate`` decodes ``weight``'s model with: the weight's, but
    float32 for a 16-bit model on a CPU, which holds its 16-bit keys and values exactly (the
    attention's results are rounded to the model's dtype as a 16-bit cache's are). XLA:CPU converts
    a 16-bit cache to float32 for each of its products and copies it to write a token: a float32
    cache takes twice the bytes and saves that work (the bfloat16 decode of
    ``benchmarks/gpt/results.md``). On a GPU the cache keeps the model's dtype."""
    dtype = np.dtype(weight.dtype)
    on_cpu = all(device.platform == "cpu" for device in weight.devices())
    return np.dtype(np.float32) if dtype.itemsize == 2 and on_cpu else dtype


def torch_layout(stored: dict[str, Any], transposed: frozenset[str]) -> dict[str, Any]:
    """``generation_params``' weights in torch's layout: the ``transposed`` kernels ``(in, out)`` as
    ``(out, in)`` (inside a program, where XLA folds each transpose into its product)."""
    return {name: value.T if name in transposed else value for name, value in stored.items()}


def reads_16_bit(dtype: Any, rows: int) -> bool:
    """Whether XLA:CPU's products of ``rows`` rows (``accumulating_linear``'s) read 16-bit weights of
    ``dtype`` as they are: a GEMV (one row) in either 16-bit dtype, a GEMM in bfloat16 only (a
    float16 weight it converts to float32 first)."""
    return jnp.dtype(dtype).itemsize == 2 and (rows == 1 or jnp.dtype(dtype) == jnp.bfloat16)


def accumulating_linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``ops.linear`` of x ``(N, D)``. A 16-bit weight's product of several rows (a prompt's pass)
    accumulated in float32 as asked and rounded to x's dtype, as the plain product rounds it
    (XLA:CPU's GEMM then reads the weight as it is; for a plain 16-bit product it first converts it
    to float32); a row's (a decoding step's GEMV, which reads it as it is) and a wider weight's as
    ``ops.linear``."""
    if x.shape[0] == 1 or weight.dtype.itemsize > 2:
        return linear(x, weight, bias)
    contract_d = (((1,), (1,)), ((), ()))  # x's D against the weight's D
    out = jax.lax.dot_general(x, weight, contract_d, preferred_element_type=jnp.float32).astype(x.dtype)
    return out if bias is None else out + bias


def config_items(kind: str, config: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The config keys the decoding of ``kind`` reads, hashable (a static argument of ``_generate``):
    a mapping (Llama 3's ``rope_freq``) as a tuple of its items."""
    keys = (*MODELS[kind].keys, *(["rms_norm_eps"] if "rms_norm_eps" in config else []))
    frozen = (
        (key, tuple(sorted(config[key].items())) if isinstance(config[key], dict) else config[key])
        for key in keys
    )
    return tuple(frozen)


def check_generate(fw: Any, a: dict[str, Any]) -> None:
    """jax_attn's ``generate(model, token_ids, max_new_tokens, ...)``: a ``GPTModel``, ``Llama3Model``
    or ``Qwen3Model``, then as numpy_attn's (its weights' names, shapes and dtype, the ids, ``rng`` a
    ``jax.random`` key, the options). The weights' values were checked as the model got them; a
    non-finite one found by non-finite logits is named then."""
    from jax_attn.gpt_module import ModelWeights

    model = a["model"]
    if not isinstance(model, ModelWeights):
        raise TypeError(
            "model must be a jax_attn.GPTModel, Llama3Model or Qwen3Model (from_params(params, config) or "
            "jax_attn.from_hf(folder); numpy_attn.generate takes params and config instead), got "
            f"{type(model).__name__}"
        )
    config = model.model_config
    stored, transposed = model.stored_params()
    shapes = {
        name: jax.ShapeDtypeStruct(value.shape[::-1] if name in transposed else value.shape, value.dtype)
        for name, value in stored.items()
    }
    check_model_params(fw, model_kind(config), shapes, config, values=False)
    check_generate_call(fw, a, config)


def generate(
    model: Any,
    token_ids: jax.Array,
    max_new_tokens: int,
    *,
    attention_mask: jax.Array | None = None,
    min_new_tokens: int = 0,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    rng: jax.Array | None = None,
    streamer: Any = None,
) -> jax.Array:
    """``token_ids`` ``(B, T)`` followed by up to ``max_new_tokens`` tokens generated by ``model`` (a
    ``GPTModel``, ``Llama3Model`` or ``Qwen3Model``): ``(B, T + n)``, n = ``max_new_tokens`` unless
    every row reached an eos id first (see ``numpy_attn.generation``).

    Non-finite logits (a float16 model whose activations overflow) raise ValueError naming the
    first such step, read once, after the program (a read per step would wait for it at every token).
    """
    token_ids = jnp.asarray(token_ids)
    if streamer is not None:
        streamer.put(np.asarray(token_ids))
    if max_new_tokens == 0:
        if streamer is not None:
            streamer.end()
        return token_ids
    stream_id = next(_STREAM_IDS) if streamer is not None else -1
    arguments, static = program_arguments(
        model, token_ids, max_new_tokens, attention_mask=attention_mask, min_new_tokens=min_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id,
        pad_token_id=pad_token_id, rng=rng, stream_id=stream_id,
    )  # fmt: skip
    if streamer is not None:
        _STREAMS[stream_id] = {"streamer": streamer, "error": None}
    try:
        sequences, new, bad_step = _generate(*arguments, **static)
        new, bad_step = (int(value) for value in jax.device_get((new, bad_step)))
    finally:
        stream = _STREAMS.pop(stream_id, None)
    if bad_step:
        finite.check_finite(model.to_params())  # a non-finite weight is named first
        check_logits_finite(bad_step, False, max_new_tokens, arguments[0]["tok_emb.weight"].dtype)
    if stream is not None:
        if stream["error"] is not None:
            raise stream["error"]
        streamer.end()
    return jnp.asarray(np.asarray(sequences)[:, : token_ids.shape[1] + new])


def program_arguments(
    model: Any, token_ids: jax.Array, max_new_tokens: int, *, attention_mask: jax.Array | None = None,
    min_new_tokens: int = 0, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
    eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None,
    rng: jax.Array | None = None, stream_id: int = -1,
) -> tuple[tuple[Any, ...], dict[str, Any]]:  # fmt: skip
    """``_generate``'s arguments and static arguments for a call of ``generate`` (checked): what it
    runs, and what the tests and the benchmark lower to read the compiled program."""
    config, token_ids = model.model_config, jnp.asarray(token_ids)
    kind = model_kind(config)
    stored, transposed = generation_params(model)
    num_tokens = token_ids.shape[1]
    stops = stop_ids(eos_token_id)
    padded_stops = stops + [-1] * (max(1, math.ceil(len(stops) / STOPS_STEP)) * STOPS_STEP - len(stops))
    padding = jnp.zeros(token_ids.shape, bool)
    if attention_mask is not None:  # not ``== 0``: for a bool mask a weak bool, another program
        padding = ~jnp.asarray(attention_mask, bool)
    sample = float(temperature) > 0.0
    key = jax.random.key(0) if rng is None else rng
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)  # a raw uint32 key (jax.random.PRNGKey)
    arguments = (
        stored, token_ids, padding, jnp.int32(max_new_tokens), jnp.int32(min_new_tokens),
        jnp.float32(min(float(temperature), FLOAT32_MAX) if sample else 1.0),
        jnp.float32(1.0 if top_p is None else top_p), jnp.asarray(padded_stops, jnp.int32),
        jnp.asarray(fill_id(stops, pad_token_id), token_ids.dtype), key, jnp.int32(stream_id),
    )  # fmt: skip
    static = {
        "kind": kind,
        "config_items": config_items(kind, config),
        "transposed": transposed,
        "cache_length": min(
            config["context_length"], math.ceil((num_tokens + max_new_tokens) / CACHE_STEP) * CACHE_STEP
        ),
        "cache_dtype": cache_dtype(stored["tok_emb.weight"]),
        "top_k": None if top_k is None else int(top_k),
        "sample": sample,
        "use_top_p": sample and top_p is not None,
        "stream": stream_id >= 0,
    }
    return arguments, static
