"""Text generation with the GPT: prefill once, then one token at a time from per-layer KV caches.

``gpt_model_decode`` runs the model on new tokens given a ``KVCache`` per block (jax_attn's
functional cache: fixed ``(B, N, L, H)`` arrays, L = ``context_length``); its logits equal the
full pass's at those positions. ``generate`` jits one step (decode, then pick the next token):
it compiles once for the prompt's length and once for single tokens, never once per token, and
the temperature is an argument of the step: one sampling program serves every temperature.
``temperature=0`` is greedy (argmax, as transformers' ``do_sample=False``); otherwise the
logits are divided by ``temperature``, cut to the ``top_k`` largest, and sampled with ``rng``
(a ``jax.random`` key). numpy_attn.gpt_generate mirrors this module.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jax_attn.checks import check_key, is_concrete
from jax_attn.gpt import GPTModel, block_parts, check_jax_gpt_params, head_parts, static_config
from jax_attn.kv_cache import KVCache, cache_length, init_kv_cache, unchecked_multi_head_attention_decode
from numpy_attn.gpt import apply_block, apply_model
from numpy_attn.gpt_spec import (
    FIRST_WEIGHT,
    check_config,
    check_generate_args,
    check_gpt_caches,
    check_logits_finite,
    check_token_ids,
    sub_params,
    without_gpt_buffers,
)

__all__ = ["generate", "gpt_model_decode", "init_gpt_cache", "unchecked_gpt_model_decode"]


def init_gpt_cache(config: Mapping[str, Any], batch: int, dtype: Any = jnp.float32) -> tuple[KVCache, ...]:
    """Empty caches, one per block, for ``context_length`` tokens."""
    check_config(config)
    head_dim = config["emb_dim"] // config["n_heads"]
    return tuple(
        init_kv_cache(batch, config["n_heads"], config["context_length"], head_dim, dtype)
        for _ in range(config["n_layers"])
    )


def gpt_model_decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """The GPT on new ``token_ids`` (B, t) after the ``caches``' tokens: ``(logits (B, t, V),
    caches)``, the logits the full pass gives at those positions (evaluation mode).

    Checks first, as ``gpt_model`` and ``generate`` do: the config, the weights, the ids, and
    the caches (``check_gpt_caches``: one per block, each as the decode functions check theirs,
    all holding the same tokens with room for t more); values and lengths only where concrete."""
    check_config(config)
    params = without_gpt_buffers(params, config)
    concrete = is_concrete(params) and not isinstance(token_ids, jax.core.Tracer)
    check_jax_gpt_params(params, config, check_values=concrete)
    check_token_ids(token_ids, config, check_values=concrete)
    check_gpt_caches(
        caches, token_ids.shape, config, params[FIRST_WEIGHT].dtype, KVCache, jax.Array, cache_length
    )
    return unchecked_gpt_model_decode(params, token_ids, caches, config)


def unchecked_gpt_model_decode(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    caches: tuple[KVCache, ...],
    config: Mapping[str, Any],
) -> tuple[jax.Array, tuple[KVCache, ...]]:
    """``gpt_model_decode`` without its checks: ``generate``'s step, checked once per call."""
    start, num_tokens = caches[0].length, token_ids.shape[1]
    # jnp: a NumPy table (load_weights') cannot be indexed by ids that jax.jit or jax.vmap traces
    tok_embeds = jnp.asarray(params["tok_emb.weight"])[token_ids]  # (B, t, D)
    pos_embeds = jax.lax.dynamic_slice_in_dim(params["pos_emb.weight"], start, num_tokens)  # (t, D)
    x = tok_embeds + pos_embeds  # (B, t, D)
    blocks, new_caches = [], []
    for index, cache in enumerate(caches):
        block = sub_params(params, f"trf_blocks.{index}.")

        def att(h: jax.Array, block=block, cache=cache) -> jax.Array:
            out, cache = unchecked_multi_head_attention_decode(
                sub_params(block, "att."), h, cache, num_heads=config["n_heads"]
            )
            new_caches.append(cache)
            return out

        blocks.append(
            functools.partial(apply_block, **block_parts(block), att=att, drop_shortcut=lambda h: h)
        )
    logits, _ = apply_model(x, blocks=blocks, **head_parts(params))  # (B, t, V)
    return logits, tuple(new_caches)


def _next_tokens(
    logits: jax.Array, key: jax.Array | None, temperature: jax.Array | None, top_k: int | None
) -> jax.Array:
    """The next token per row of ``logits`` (B, V): argmax (``temperature`` None), or a sample.
    The logits kept (the ``top_k`` largest), less their maximum, are divided by ``temperature``
    (a 0-d array of the logits' dtype, within its range: ``sampling_temperature``): each is <= 0
    and the largest 0, so no temperature overflows them; where a tiny one takes the others to
    -inf, the sample is the argmax (greedy; ties shared)."""
    if temperature is None:
        return jnp.argmax(logits, axis=-1)  # (B,)
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]  # (B, 1)
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, V), <= 0
    scaled = jnp.where(shifted == 0, 0, shifted / temperature)  # 0 / 0 where temperature rounds to 0
    return jax.random.categorical(key, scaled, axis=-1)  # (B,)


def sampling_temperature(temperature: float, dtype: Any) -> jax.Array | None:
    """``generate``'s ``temperature`` as ``_next_tokens`` divides by it: None for 0 (greedy),
    else a 0-d array of the logits' ``dtype`` (the value a Python float would take there), an
    argument of the jitted step rather than a constant of it, so that one program serves every
    temperature. One past the dtype's range (float16's 65504) is its largest value: cast to inf,
    it would divide the tokens cut by ``top_k`` (-inf) into NaN."""
    if temperature == 0.0:
        return None
    return jnp.asarray(min(temperature, float(jnp.finfo(dtype).max)), dtype)


@functools.partial(jax.jit, static_argnames=("config_items", "top_k"))
def _step(params, token_ids, caches, key, temperature, config_items, top_k):
    """One jitted step: decode ``token_ids`` (B, t), pick the next token from the last logits;
    with it, whether those logits were all finite (a () bool)."""
    logits, caches = unchecked_gpt_model_decode(params, token_ids, caches, dict(config_items))
    last = logits[:, -1]  # (B, V)
    return _next_tokens(last, key, temperature, top_k), caches, jnp.isfinite(last).all()


def generate(
    model: GPTModel,
    token_ids: jax.Array,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    rng: jax.Array | None = None,
) -> jax.Array:
    """Extend ``token_ids`` (B, T) by ``max_new_tokens`` tokens: returns ``(B, T + max_new_tokens)``.

    ``T + max_new_tokens`` may not exceed ``context_length`` (the cache holds that many).
    ``temperature > 0`` samples and needs ``rng``; ``top_k`` keeps the k likeliest tokens.
    Logits that are not finite (a float16 model whose activations overflow) raise
    numpy_attn's ValueError naming the first such step (``check_logits_finite``): each jitted
    step returns whether its logits were finite, and the flags are read once, after the last
    step (reading one per step would wait for the device at every token), so the tokens
    drawn from them are never returned. A ``model`` that is not a ``GPTModel`` (a params dict,
    as ``numpy_attn.generate`` takes) raises TypeError.
    """
    if not isinstance(model, GPTModel):
        raise TypeError(
            "model must be a jax_attn.GPTModel (GPTModel.from_params(params, config); numpy_attn.generate "
            f"takes params and config instead), got {type(model).__name__}"
        )
    config = model.config
    params = model.torch_params()  # the weights format, converted once per call
    check_jax_gpt_params(params, config)
    check_token_ids(token_ids, config)
    check_key(rng, "rng")  # a jax.random key, under numpy_attn's argument name
    check_generate_args(token_ids.shape, max_new_tokens, config, temperature, top_k, rng is not None)
    # checked within float64's range: an int past int64's divides too
    temperature = sampling_temperature(float(temperature), params[FIRST_WEIGHT].dtype)
    token_ids = jnp.asarray(token_ids)
    caches = init_gpt_cache(config, token_ids.shape[0], params["tok_emb.weight"].dtype)
    keys = jax.random.split(rng, max_new_tokens) if rng is not None else [None] * max_new_tokens
    config_items, new_tokens, step_input, finite = static_config(config), [], token_ids, []
    for key in keys:
        next_tokens, caches, step_finite = _step(
            params, step_input, caches, key, temperature, config_items, top_k
        )
        step_input = next_tokens[:, None].astype(token_ids.dtype)  # (B, 1)
        new_tokens.append(step_input)
        finite.append(step_finite)
    for step, step_finite in enumerate(jax.device_get(finite), start=1):
        check_logits_finite(step, bool(step_finite), max_new_tokens, params[FIRST_WEIGHT].dtype)
    return jnp.concatenate([token_ids, *new_tokens], axis=1)  # (B, T + new)
