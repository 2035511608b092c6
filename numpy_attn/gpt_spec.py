"""The GPT's config, weight names and shapes, and the checks of a model call: one definition.

``config`` is the book's dict (``vocab_size``, ``context_length``, ``emb_dim``, ``n_heads``,
``n_layers``, ``drop_rate``, ``qkv_bias``). The weights are torch_ref ``GPTModel``'s
``state_dict`` names (buffers such as ``trf_blocks.{i}.att.mask`` excluded), torch layout, as
``gpt_param_shapes`` lists them; numpy_attn, jax_attn and the checkpoint readers check against it.
The entry points also take a ``state_dict()`` as it is: ``without_gpt_buffers`` drops its buffers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from numpy_attn.spec import QKV, layer_spec
from numpy_attn.validation import (
    NUMPY_FLOATS,
    check_array_kind,
    check_context_length,
    check_count,
    check_decode_room,
    check_divisible,
    check_dropout,
    check_finite,
    check_flag,
    check_floating,
    check_input,
    check_kv_cache,
    check_mapping,
    check_numpy_dtype,
    check_param_dtypes,
    check_params,
    check_size,
)

__all__ = [
    "CONFIG_KEYS",
    "PART_SHAPES",
    "block_shapes",
    "check_block",
    "check_config",
    "check_generate_args",
    "check_gpt_caches",
    "check_gpt_params",
    "check_logits_finite",
    "check_part",
    "check_token_ids",
    "gpt_param_shapes",
    "sub_params",
    "without_gpt_buffers",
]

BLOCK_ATTENTION = "MultiHeadAttention"  # the class of each block's ``att``
FIRST_WEIGHT = "tok_emb.weight"  # the weight whose dtype the others must have
CONFIG_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")


def check_config(config: Any) -> None:
    """ValueError naming missing keys or values that cannot build a GPT (TypeError for a size that
    is not an int, as ``check_size``, or a ``qkv_bias`` that is not a bool)."""
    if not isinstance(config, Mapping):
        raise TypeError(
            f"config must be a mapping with keys {list(CONFIG_KEYS)}, got {type(config).__name__}"
        )
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"config is missing keys {missing}; a GPT config has {list(CONFIG_KEYS)}")
    for key in ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"):
        check_size(f"config[{key!r}]", config[key])
    check_divisible("emb_dim", config["emb_dim"], config["n_heads"])
    check_dropout("config['drop_rate']", config["drop_rate"])
    check_flag("config['qkv_bias']", config["qkv_bias"])


def layer_norm_shapes(emb_dim: int) -> dict[str, tuple[int, ...]]:
    """A ``LayerNorm``'s weights (``norm1.``, ``norm2.``, ``final_norm.`` in the model)."""
    return {"scale": (emb_dim,), "shift": (emb_dim,)}


def feed_forward_shapes(emb_dim: int) -> dict[str, tuple[int, ...]]:
    """A ``FeedForward``'s weights (``ff.`` in a block): D -> 4D, then 4D -> D."""
    return {
        "layers.0.weight": (4 * emb_dim, emb_dim),
        "layers.0.bias": (4 * emb_dim,),
        "layers.2.weight": (emb_dim, 4 * emb_dim),
        "layers.2.bias": (emb_dim,),
    }


def block_shapes(emb_dim: int, qkv_bias: bool) -> dict[str, tuple[int, ...]]:
    """A ``TransformerBlock``'s weights (``trf_blocks.{i}.`` in the model), in torch's order."""
    shapes = {}
    for name in QKV:
        shapes[f"att.{name}.weight"] = (emb_dim, emb_dim)
        if qkv_bias:
            shapes[f"att.{name}.bias"] = (emb_dim,)
    shapes |= {"att.out_proj.weight": (emb_dim, emb_dim), "att.out_proj.bias": (emb_dim,)}
    return (
        shapes
        | _prefixed("ff.", feed_forward_shapes(emb_dim))
        | _prefixed("norm1.", layer_norm_shapes(emb_dim))
        | _prefixed("norm2.", layer_norm_shapes(emb_dim))
    )


# the GPT's parts that ``check_part`` checks: part -> its weights for a width D
PART_SHAPES: dict[str, Callable[[int], dict[str, tuple[int, ...]]]] = {
    "LayerNorm": layer_norm_shapes,
    "FeedForward": feed_forward_shapes,
}


def _prefixed(prefix: str, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {prefix + name: shape for name, shape in shapes.items()}


def gpt_param_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight of ``GPTModel(config)``: torch name -> shape, in torch's order."""
    check_config(config)
    vocab, context, emb = config["vocab_size"], config["context_length"], config["emb_dim"]
    shapes = {"tok_emb.weight": (vocab, emb), "pos_emb.weight": (context, emb)}
    for index in range(config["n_layers"]):
        shapes |= _prefixed(f"trf_blocks.{index}.", block_shapes(emb, bool(config["qkv_bias"])))
    return shapes | _prefixed("final_norm.", layer_norm_shapes(emb)) | {"out_head.weight": (vocab, emb)}


def without_gpt_buffers(params: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The weights of a torch ``GPTModel(config).state_dict()``: the buffers of its blocks'
    attention (``trf_blocks.{i}.att.mask`` for each block i, the buffers ``layer_spec`` names for
    ``MultiHeadAttention``) left out, as the attention modules' ``from_params`` leave out theirs
    (``without_buffers``: whatever their values); every other key kept for the checks to name.
    The mapping is checked first, then the config (the errors of ``check_gpt_params``)."""
    check_mapping(params)
    check_config(config)
    buffers = {
        f"trf_blocks.{index}.att.{buffer}"
        for index in range(config["n_layers"])
        for buffer in layer_spec(BLOCK_ATTENTION).buffers
    }
    return {name: value for name, value in params.items() if name not in buffers}


def check_part(part: str, params: Any, x: Any, *, floating: tuple[str, ...] = NUMPY_FLOATS) -> None:
    """``layer_norm``'s or ``feed_forward``'s call (``part``: ``"LayerNorm"``, ``"FeedForward"``):
    ``x`` a floating array (one of ``floating``, in the machine's byte order: TypeError) of shape
    ``(..., D)`` with D >= 1 (ValueError), then ``params`` exactly the part's weights for D (one
    ValueError naming every missing, unexpected and mis-shaped key), each in x's dtype
    (TypeError: NumPy would promote, JAX would cast, without a word)."""
    shape = check_floating(x, floating)
    if not shape or shape[-1] < 1:
        raise ValueError(f"x must have shape (..., D) with D >= 1, got shape {shape}")
    check_params(params, PART_SHAPES[part](shape[-1]), layer=part, dtype=x.dtype)


def check_block(
    params: Any,
    x: Any,
    *,
    num_heads: Any,
    context_length: Any,
    dropout_rate: Any,
    floating: tuple[str, ...] = NUMPY_FLOATS,
) -> None:
    """``transformer_block``'s call, in the layers' order: ``context_length`` and ``num_heads``
    positive ints (``check_size``), ``dropout_rate`` in [0, 1); ``x`` a floating ``(B, T, D)``
    (``check_input``); ``params`` exactly a block's weights for D = emb_dim (with the attention's
    biases if ``att.W_query.bias`` is given): one ValueError naming every missing, unexpected and
    mis-shaped key; each weight in x's dtype (TypeError); ``num_heads`` dividing D; T at most
    ``context_length``."""
    check_size("context_length", context_length)
    check_size("num_heads", num_heads)
    check_dropout("dropout_rate", dropout_rate)
    shape = check_input(x, layout="(B, T, D)", floating=floating)
    qkv_bias = isinstance(params, Mapping) and "att.W_query.bias" in params
    check_params(params, block_shapes(shape[-1], qkv_bias), layer="TransformerBlock", dtype=x.dtype)
    check_divisible("emb_dim", shape[-1], num_heads)
    check_context_length(shape, context_length)


def check_gpt_params(
    params: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    check_values: bool = True,
    floating: tuple[str, ...] = NUMPY_FLOATS,
) -> None:
    """One ValueError naming every missing, unexpected and mis-shaped weight (a config that
    contradicts the weights shows up here); then one floating dtype (one of ``floating``, in the
    machine's byte order) for every weight, that of the first (``tok_emb.weight``), TypeError
    otherwise, as the layers' weights must have x's; then, where values are concrete, non-finite
    ones."""
    check_mapping(params)
    shapes = gpt_param_shapes(config)
    check_params(params, shapes, layer="GPTModel")  # the shapes; the dtypes once the first's is known
    first = f"params[{FIRST_WEIGHT!r}]"
    check_floating(params[FIRST_WEIGHT], floating, first)
    others = [name for name in shapes if name != FIRST_WEIGHT]
    check_param_dtypes(params, others, params[FIRST_WEIGHT].dtype, first)
    if check_values:
        check_finite(params)


def check_token_ids(token_ids: Any, config: Mapping[str, Any], *, check_values: bool = True) -> None:
    """``token_ids``: an integer array ``(B, T)``, B >= 1, 1 <= T <= context_length, whose dtype
    holds every id of the vocabulary (up to ``vocab_size - 1``: ``generate`` writes the new ids in
    it, a narrower one would wrap them; TypeError), every id in [0, vocab_size) (ValueError). A
    torch tensor is refused as the layers refuse one (``check_numpy_dtype``: how to convert it)."""
    shape = getattr(token_ids, "shape", None)
    dtype = getattr(token_ids, "dtype", None)
    if shape is not None and dtype is not None:
        check_array_kind("token_ids", token_ids)
        check_numpy_dtype("token_ids", token_ids)
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
    if check_values:
        ids = np.asarray(token_ids)
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(
                f"token_ids hold ids in [{ids.min()}, {ids.max()}], outside the vocabulary [0, {vocab_size})"
            )


def check_gpt_caches(
    caches: Any,
    shape: tuple[int, int],
    config: Mapping[str, Any],
    dtype: Any,
    cache_type: type,
    array_type: type | tuple[type, ...],
    cache_length: Callable[[Any], int | None],
) -> None:
    """``gpt_model_decode``'s ``caches`` for token ids of ``shape`` (B, t) and weights of
    ``dtype``: a tuple (or list) of ``cache_type`` caches (TypeError otherwise), one per block
    (ValueError naming both numbers), each checked as the decode functions check theirs
    (``check_kv_cache``, against the blocks' input ``(B, t, emb_dim)``; the errors name the block's
    cache, ``caches[i]``), all holding the same
    number of tokens (``cache_length``: None where it is not concrete, under jax.jit) with room
    for t more within the cache and then the context (``check_decode_room``, the layers' check and
    texts: the cache against its own size, the tokens against ``context_length``); ValueError
    otherwise."""
    if isinstance(caches, cache_type) or not isinstance(caches, tuple | list):
        raise TypeError(
            f"caches must be a tuple of KVCache, one per block (init_gpt_cache(config, batch)), "
            f"got {type(caches).__name__}"
        )
    if len(caches) != config["n_layers"]:
        raise ValueError(
            f"caches has {len(caches)} KVCache, but config['n_layers'] = {config['n_layers']} "
            "blocks need one each"
        )
    batch, num_tokens = shape
    x = np.broadcast_to(np.zeros((), dtype), (batch, num_tokens, config["emb_dim"]))  # the blocks' input
    num_heads = config["n_heads"]
    for index, cache in enumerate(caches):
        check_kv_cache(
            cache, cache_type, array_type, x, num_heads, config["emb_dim"] // num_heads,
            name=f"caches[{index}]", x_name="the blocks' input",
        )  # fmt: skip
    lengths = [cache_length(cache) for cache in caches]
    if len({length for length in lengths if length is not None}) > 1:
        raise ValueError(f"the caches hold {lengths} tokens: every block's cache must hold the same tokens")
    for index, (cache, length) in enumerate(zip(caches, lengths, strict=True)):
        check_decode_room(
            length, cache.keys.shape[2], x.shape, config["context_length"], name=f"caches[{index}]"
        )


def check_logits_finite(step: int, finite: bool, max_new_tokens: int, dtype: Any) -> None:
    """``generate``'s ``step`` (1 to ``max_new_tokens``; 1 is the prompt's pass): ValueError
    unless the model's logits for the next token were all ``finite``. The weights are finite
    (``check_gpt_params``), so NaN or inf come from activations that overflow their ``dtype``
    (float16's largest is 65504); sampling from them would raise NumPy's error or pick a
    meaningless token (argmax of NaN)."""
    if not finite:
        raise ValueError(
            f"generate: the model's logits at step {step} of {max_new_tokens} are not finite (NaN or "
            f"inf): its {np.dtype(dtype).name} activations overflow; compute in float32"
        )


def sub_params(params: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The weights under ``prefix`` (e.g. ``"trf_blocks.0.att."``) with the prefix removed."""
    return {name[len(prefix) :]: value for name, value in params.items() if name.startswith(prefix)}


def check_generate_args(
    shape: tuple[int, ...],
    max_new_tokens: Any,
    config: Mapping[str, Any],
    temperature: Any,
    top_k: Any,
    has_rng: bool,
) -> None:
    """``generate``'s arguments: the prompt (``shape`` (B, T)) and ``max_new_tokens`` fit the
    context; ``temperature`` a finite number >= 0 (at most float64's largest: it divides the
    logits as a float; compared exactly, an int of any size too, which ``float()`` would
    overflow); ``top_k`` None or in [1, vocab_size]; sampling has a random source. A bool, or
    another type where a number is due, is a TypeError (as for every size); a number out of
    range a ValueError."""
    check_count("max_new_tokens", max_new_tokens)
    if shape[1] + max_new_tokens > config["context_length"]:
        raise ValueError(
            f"token_ids has T={shape[1]} tokens; with max_new_tokens={max_new_tokens} that exceeds "
            f"context_length {config['context_length']}"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | np.integer | np.floating):
        raise TypeError(
            f"temperature must be a finite number >= 0, got {temperature!r} ({type(temperature).__name__})"
        )
    # a Python int exactly (float() overflows past float64's range), a NumPy number as a float (against
    # it, float64's largest would be cast to float16 or float32, overflowing); NaN fails too
    number = temperature if isinstance(temperature, int) else float(temperature)
    if not 0 <= number <= sys.float_info.max:
        huge = isinstance(temperature, int) and abs(temperature) > sys.float_info.max
        shown = (
            f"an int of {temperature.bit_length()} bits, beyond float64's range"
            if huge
            else repr(temperature)
        )
        raise ValueError(f"temperature must be a finite number >= 0, got {shown}")
    vocab_size = config["vocab_size"]
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int | np.integer)):
        raise TypeError(
            f"top_k must be None or an integer in [1, {vocab_size}], got {top_k!r} ({type(top_k).__name__})"
        )
    if top_k is not None and not 1 <= top_k <= vocab_size:
        raise ValueError(f"top_k must be None or an integer in [1, {vocab_size}], got {top_k!r}")
    if temperature > 0 and not has_rng:
        raise ValueError("sampling (temperature > 0) needs rng")
