"""What the GPT's functions of numpy_attn and jax_attn check at their door: the config, the weights
against it, the token ids, the caches and the generation options; one text for one mistake. A model
call is checked here for every model of ``decoder_spec.MODELS`` (``model_pass``, ``model_decode``,
``init_cache``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn import checks, finite
from numpy_attn.cache_checks import check_block_caches, check_cache_memory
from numpy_attn.decoder_spec import MODELS, cache_shape, decoder_param_shapes, without_buffers
from numpy_attn.gpt_spec import FIRST_WEIGHT, PART_SHAPES, block_shapes

A = Mapping[str, Any]


def check_features(fw: Any, x: Any, **operands: Any) -> tuple[int, ...]:
    """x floating ``(..., D)``, D >= 1, and the other ``operands`` of its dtype; returns x's shape."""
    fw.check_operands(x=x, **operands)
    shape = tuple(x.shape)
    if not shape or shape[-1] < 1:
        raise ValueError(f"x must have shape (..., D) with D >= 1, got shape {shape}")
    return shape


def check_part(part: str, fw: Any, a: A) -> None:
    """``layer_norm``'s or ``feed_forward``'s call (``part``): x floating ``(..., D)``, D >= 1, then
    ``params`` exactly the part's weights for D, each of x's dtype."""
    shape = check_features(fw, a["x"])
    checks.check_params(a["params"], PART_SHAPES[part](shape[-1]), layer=part, dtype=a["x"].dtype)


layer_norm = functools.partial(check_part, "LayerNorm")
feed_forward = functools.partial(check_part, "FeedForward")


def gelu(fw: Any, a: A) -> None:
    fw.check_operands(x=a["x"])  # an integer x would give 0.5 * x


def transformer_block(fw: Any, a: A) -> None:
    """``context_length`` and ``num_heads`` positive ints, ``dropout_rate`` in [0, 1); x a floating
    ``(B, T, D)``; the weights exactly a block's for D (with the attention's biases if
    ``att.W_query.bias`` is given), in x's dtype; ``num_heads`` dividing D; T within the context."""
    params, x = a["params"], a["x"]
    fw.check_operands(x=x)
    checks.check_size("context_length", a["context_length"])
    checks.check_size("num_heads", a["num_heads"])
    checks.check_dropout("dropout_rate", a["dropout_rate"])
    shape = checks.check_input(x, layout="(B, T, D)", floating=fw.floats)
    qkv_bias = isinstance(params, Mapping) and "att.W_query.bias" in params
    checks.check_params(params, block_shapes(shape[-1], qkv_bias), layer="TransformerBlock", dtype=x.dtype)
    checks.check_divisible("emb_dim", shape[-1], a["num_heads"])
    checks.check_context_length(shape, a["context_length"])
    fw.check_random(a[fw.random])
    fw.check_finite(params)
    checks.check_flag("return_steps", a["return_steps"])


def check_model_params(
    fw: Any, kind: str, params: Any, config: Mapping[str, Any], *, values: bool = True
) -> None:
    """The weights of the model ``kind`` (a key of ``MODELS``) for ``config``: one ValueError naming
    every missing, unexpected and mis-shaped weight; then one floating dtype, ``tok_emb.weight``'s
    (TypeError); then, with ``values``, finite values."""
    checks.check_mapping(params)
    shapes = decoder_param_shapes(config, kind)
    checks.check_params(params, shapes, layer=kind)
    first = f"params[{FIRST_WEIGHT!r}]"
    checks.check_floating(params[FIRST_WEIGHT], fw.floats, first)
    checks.check_param_dtypes(
        params, [name for name in shapes if name != FIRST_WEIGHT], params[FIRST_WEIGHT].dtype, first
    )
    fw.check_float64(first, params[FIRST_WEIGHT])
    if values:
        finite.check_finite(params)


def check_token_ids(token_ids: Any, config: Mapping[str, Any], *, values: bool = True) -> None:
    """An integer array ``(B, T)``, 1 <= T <= context_length, of a dtype that holds every id of the
    vocabulary (TypeError), every id in [0, vocab_size) (ValueError, where values are known)."""
    shape, dtype = getattr(token_ids, "shape", None), getattr(token_ids, "dtype", None)
    if shape is not None and dtype is not None:
        checks.check_numpy_dtype("token_ids", token_ids)
    if shape is None or not np.issubdtype(np.dtype(dtype), np.integer):
        raise TypeError(f"token_ids must be an integer array (B, T), got {type(token_ids).__name__} {dtype}")
    vocab_size = config["vocab_size"]
    if np.iinfo(np.dtype(dtype)).max < vocab_size - 1:
        raise TypeError(
            f"token_ids has dtype {np.dtype(dtype).name}, which cannot hold the ids of vocab_size "
            f"{vocab_size} (up to {vocab_size - 1}): give int32 or int64 ids"
        )
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"token_ids must have shape (B, T) with B >= 1 and T >= 1, got {tuple(shape)}")
    if shape[1] > config["context_length"]:
        raise ValueError(
            f"token_ids has T={shape[1]} tokens, more than context_length {config['context_length']}"
        )
    if values:
        ids = np.asarray(token_ids)
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(
                f"token_ids hold ids in [{ids.min()}, {ids.max()}], outside the vocabulary [0, {vocab_size})"
            )


def check_model_call(fw: Any, kind: str, a: dict[str, Any]) -> None:
    """A model function's config, weights (a ``state_dict()`` as it is: its buffers left out of the
    call's ``params``) and token ids, their values where known."""
    config = a[MODELS[kind].config_name]
    a["params"] = without_buffers(kind, a["params"], config)
    check_model_params(fw, kind, a["params"], config, values=fw.concrete({"params": a["params"]}))
    check_token_ids(a["token_ids"], config, values=fw.concrete({"token_ids": a["token_ids"]}))


def model_pass(kind: str, fw: Any, a: dict[str, Any]) -> None:
    """A model's full pass (``gpt_model``, ``llama3_model``, ``qwen3_model``): ``check_model_call``,
    the random source where it takes one (the GPT's dropout), ``return_steps``."""
    check_model_call(fw, kind, a)
    if fw.random in a:
        fw.check_random(a[fw.random])
    checks.check_flag("return_steps", a["return_steps"])


def model_decode(kind: str, fw: Any, a: dict[str, Any]) -> None:
    """A model's decoding step: ``check_model_call``, its caches, its padding mask."""
    check_model_call(fw, kind, a)
    check_block_caches(fw, a, kind)
    if a["padding_mask"] is not None:
        checks.check_padding_mask(a["padding_mask"], *a["token_ids"].shape)


def init_cache(kind: str, fw: Any, a: A) -> None:
    """A model's empty caches: its config, a positive batch, a floating dtype, caches that fit in memory."""
    row = MODELS[kind]
    config = a[row.config_name]
    row.check_config(config)
    checks.check_size("batch", a["batch"])
    check_cache_memory(
        fw, cache_shape(config, kind, a["batch"]), row.cache_axes, a["dtype"], config["n_layers"]
    )


gpt_model = functools.partial(model_pass, "GPTModel")
gpt_model_decode = functools.partial(model_decode, "GPTModel")
init_gpt_cache = functools.partial(init_cache, "GPTModel")


def check_generate_args(a: Mapping[str, Any], shape: tuple[int, ...], config: Mapping[str, Any]) -> None:
    """``generate``'s options for a prompt of ``shape`` (B, T): ``max_new_tokens`` within the
    context and ``min_new_tokens`` at most it; ``temperature`` a finite number >= 0; ``top_k`` None or
    in [1, vocab_size]; ``top_p`` None or in [0, 1]; ``eos_token_id`` None, an id or ids and
    ``pad_token_id`` None or an id; ``attention_mask`` None or a left-padded 0/1 mask of the prompt's
    shape; ``streamer`` None or transformers' ``put``/``end``; sampling has a random source."""
    max_new_tokens, temperature, top_k = a["max_new_tokens"], a["temperature"], a["top_k"]
    checks.check_count("max_new_tokens", max_new_tokens)
    if shape[1] + max_new_tokens > config["context_length"]:
        raise ValueError(
            f"token_ids has T={shape[1]} tokens; with max_new_tokens={max_new_tokens} that exceeds "
            f"context_length {config['context_length']}"
        )
    checks.check_count("min_new_tokens", a["min_new_tokens"])
    if a["min_new_tokens"] > max_new_tokens:
        raise ValueError(f"min_new_tokens={a['min_new_tokens']} is more than max_new_tokens={max_new_tokens}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | np.integer | np.floating):
        raise TypeError(
            f"temperature must be a finite number >= 0, got {temperature!r} ({type(temperature).__name__})"
        )
    number = temperature if isinstance(temperature, int) else float(temperature)  # a Python int exactly
    if not 0 <= number <= sys.float_info.max:
        huge = isinstance(temperature, int) and abs(temperature) > sys.float_info.max
        shown = (
            f"an int of {temperature.bit_length()} bits, beyond float64's range"
            if huge
            else repr(temperature)
        )
        raise ValueError(f"temperature must be a finite number >= 0, got {shown}")
    vocab_size = config["vocab_size"]
    if top_k is not None:
        what = f"None or an integer in [1, {vocab_size}]"
        checks.check_number("top_k", top_k, what, lambda k: 1 <= k <= vocab_size, checks.INTS)
    if a["top_p"] is not None:  # transformers' top_p: 1 keeps every token, 0 the likeliest
        checks.check_number("top_p", a["top_p"], "None or a number in [0, 1]", lambda p: 0 <= float(p) <= 1)
    for token in eos_ids(a["eos_token_id"], "eos_token_id", vocab_size):
        check_token_id("eos_token_id", token, vocab_size)
    if a["pad_token_id"] is not None:
        check_token_id("pad_token_id", a["pad_token_id"], vocab_size)
    if a["attention_mask"] is not None:
        check_attention_mask(a["attention_mask"], shape)
    check_streamer(a["streamer"])
    if temperature > 0 and a["rng"] is None:
        raise ValueError("sampling (temperature > 0) needs rng")


def eos_ids(eos_token_id: Any, name: str, vocab_size: int) -> list[Any]:
    """``eos_token_id`` as a list: [] for None, [id] for one id, the ids of a non-empty list or tuple."""
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, list | tuple):
        if not eos_token_id:
            raise ValueError(
                f"{name} must be None, an id in [0, {vocab_size}) or a non-empty list of them, got []"
            )
        return list(eos_token_id)
    return [eos_token_id]


def check_token_id(name: str, token: Any, vocab_size: int) -> None:
    """An id of the vocabulary: an integer (TypeError otherwise) in [0, vocab_size) (ValueError)."""
    if isinstance(token, bool) or not isinstance(token, int | np.integer):
        raise TypeError(
            f"{name} must be an id in [0, {vocab_size}) (or, for eos_token_id, a list of them), got "
            f"{token!r} ({type(token).__name__})"
        )
    if not 0 <= token < vocab_size:
        raise ValueError(f"{name} must be an id in [0, {vocab_size}), got {token!r}")


def check_attention_mask(mask: Any, shape: tuple[int, ...]) -> None:
    """transformers' ``attention_mask``: bool or integer ``(B, T)`` of 0 (padding) and 1 (a token),
    each row left-padded (its padding, if any, before its first token) and holding a token."""
    mask_shape = checks.check_numpy_dtype("attention_mask", mask)
    dtype = np.dtype(mask.dtype)
    if not (dtype == np.bool_ or np.issubdtype(dtype, np.integer)) or tuple(mask_shape) != tuple(shape):
        raise ValueError(
            f"attention_mask must be a bool or integer array of token_ids' shape {tuple(shape)} (1 = a "
            f"token, 0 = padding), got {dtype.name} array of shape {tuple(mask_shape)}"
        )
    values = np.asarray(mask)
    if not np.isin(values, (0, 1)).all():
        raise ValueError("attention_mask must hold 0 (padding) and 1 (a token) only")
    tokens = values.astype(bool)
    # a row ending in padding, or with padding after a token
    rows = np.flatnonzero(~tokens[:, -1] | (np.diff(tokens.astype(np.int8), axis=1) < 0).any(axis=1)).tolist()
    if rows:
        raise ValueError(
            f"attention_mask rows {rows} are not left-padded: generate takes the padding before each "
            "row's tokens (transformers' padding_side='left'), and every row ends with a token"
        )


def check_streamer(streamer: Any) -> None:
    """None, or an object with transformers' streamer methods ``put(ids)`` and ``end()``."""
    if streamer is not None and not (
        callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))
    ):
        raise TypeError(
            "streamer must be None or an object with methods put(ids) and end() (transformers' "
            f"streamers: TextStreamer, TextIteratorStreamer), got {type(streamer).__name__}"
        )


def check_logits_finite(step: int, finite: bool, max_new_tokens: int, dtype: Any) -> None:
    """``generate``'s step (1 is the prompt's pass): ValueError unless its logits were all finite
    (the weights are, so an overflow of the activations' dtype made them NaN or inf)."""
    if not finite:
        raise ValueError(
            f"generate: the model's logits at step {step} of {max_new_tokens} are not finite (NaN or "
            f"inf): its {np.dtype(dtype).name} activations overflow; compute in float32"
        )
