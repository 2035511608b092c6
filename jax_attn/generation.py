"""Text generation with the GPT in JAX: prefill once, then one token at a time from the KV caches.

One jitted step (decode, then pick the next token) compiles once for the prompt's length and once
for single tokens, never once per token; the temperature is an argument of the step, so one
sampling program serves every temperature. ``temperature=0`` is greedy (argmax, as transformers'
``do_sample=False``); otherwise the logits are cut to the ``top_k`` largest, divided by
``temperature`` and sampled with ``rng`` (a ``jax.random`` key).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jax_attn.gpt import gpt_model_decode, init_gpt_cache
from numpy_attn import gpt_checks
from numpy_attn.gpt_checks import check_logits_finite
from numpy_attn.gpt_spec import CONFIG_KEYS

__all__ = ["generate"]


def next_tokens(
    logits: jax.Array, key: jax.Array | None, temperature: jax.Array | None, top_k: int | None
) -> jax.Array:
    """The next token of each row of ``logits`` ``(B, V)``: the argmax (``temperature`` None), or a
    sample. The logits kept, less their maximum, are divided by ``temperature`` (a 0-d array of the
    logits' dtype): each <= 0, so no temperature overflows them."""
    if temperature is None:
        return jnp.argmax(logits, axis=-1)  # (B,)
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]  # (B, 1)
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, V), <= 0
    scaled = jnp.where(shifted == 0, 0, shifted / temperature)  # 0 / 0 where temperature rounds to 0
    return jax.random.categorical(key, scaled, axis=-1)  # (B,)


def sampling_temperature(temperature: float, dtype: Any) -> jax.Array | None:
    """None for 0 (greedy), else a 0-d array of the logits' dtype, at most its largest value (cast to
    inf, it would divide the tokens cut by ``top_k`` into NaN)."""
    if temperature == 0.0:
        return None
    return jnp.asarray(min(temperature, float(jnp.finfo(dtype).max)), dtype)


@functools.partial(jax.jit, static_argnames=("config_items", "top_k"))
def _step(params, token_ids, caches, key, temperature, config_items, top_k):
    """Decode ``token_ids`` ``(B, t)``, pick the next token from the last logits; with it, whether
    those logits were all finite."""
    logits, caches = gpt_model_decode(params, token_ids, caches, dict(config_items))
    last = logits[:, -1]  # (B, V)
    return next_tokens(last, key, temperature, top_k), caches, jnp.isfinite(last).all()


def check_generate(fw: Any, a: dict[str, Any]) -> None:
    """jax_attn's ``generate(model, token_ids, max_new_tokens, ...)``: a ``GPTModel``, then as
    numpy_attn's (its weights, the ids, ``rng`` a ``jax.random`` key, the options)."""
    from jax_attn.gpt_module import GPTModel

    model = a["model"]
    if not isinstance(model, GPTModel):
        raise TypeError(
            "model must be a jax_attn.GPTModel (GPTModel.from_params(params, config); numpy_attn.generate "
            f"takes params and config instead), got {type(model).__name__}"
        )
    gpt_checks.check_gpt_params(fw, model.torch_params(), model.config)
    gpt_checks.check_token_ids(a["token_ids"], model.config)
    fw.check_random(a["rng"], "rng")
    shape, has_rng = a["token_ids"].shape, a["rng"] is not None
    gpt_checks.check_generate_args(
        shape, a["max_new_tokens"], model.config, a["temperature"], a["top_k"], has_rng
    )


def generate(
    model: Any,
    token_ids: jax.Array,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    rng: jax.Array | None = None,
) -> jax.Array:
    """``token_ids`` ``(B, T)`` extended by ``max_new_tokens`` tokens by the ``GPTModel`` ``model``:
    ``(B, T + max_new_tokens)``.

    Non-finite logits (a float16 model whose activations overflow) raise ValueError naming the
    first such step: each step returns whether its logits were finite, read once after the last
    (one read per step would wait for the device at every token).
    """
    config, params = model.config, model.torch_params()
    dtype = params["tok_emb.weight"].dtype
    temperature = sampling_temperature(float(temperature), dtype)
    token_ids = jnp.asarray(token_ids)
    caches = init_gpt_cache(config, token_ids.shape[0], dtype)
    keys = jax.random.split(rng, max_new_tokens) if rng is not None else [None] * max_new_tokens
    config_items = tuple((name, config[name]) for name in CONFIG_KEYS)  # hashable: a static argument
    new_tokens, step_input, finite = [], token_ids, []
    for key in keys:
        tokens, caches, step_finite = _step(params, step_input, caches, key, temperature, config_items, top_k)
        step_input = tokens[:, None].astype(token_ids.dtype)  # (B, 1)
        new_tokens.append(step_input)
        finite.append(step_finite)
    for step, step_finite in enumerate(jax.device_get(finite), start=1):
        check_logits_finite(step, bool(step_finite), max_new_tokens, dtype)
    return jnp.concatenate([token_ids, *new_tokens], axis=1)  # (B, T + new)
