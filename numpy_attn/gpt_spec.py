"""The GPT's config, weight names and shapes, and the checks of a model call: one definition.

``config`` is the book's dict (``vocab_size``, ``context_length``, ``emb_dim``, ``n_heads``,
``n_layers``, ``drop_rate``, ``qkv_bias``). The weights are torch_ref ``GPTModel``'s
``state_dict`` names (buffers such as ``trf_blocks.{i}.att.mask`` excluded), torch layout, as
``gpt_param_shapes`` lists them; numpy_attn, jax_attn and the checkpoint readers check against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.validation import (
    NUMPY_FLOATS,
    check_divisible,
    check_dropout,
    check_finite,
    check_flag,
    check_floating,
    check_mapping,
    check_params,
    check_size,
)

__all__ = [
    "CONFIG_KEYS",
    "check_config",
    "check_generate_args",
    "check_gpt_params",
    "check_token_ids",
    "gpt_param_shapes",
    "sub_params",
]

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


def gpt_param_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight of ``GPTModel(config)``: torch name -> shape, in torch's order."""
    check_config(config)
    vocab, context, emb = config["vocab_size"], config["context_length"], config["emb_dim"]
    shapes = {"tok_emb.weight": (vocab, emb), "pos_emb.weight": (context, emb)}
    for index in range(config["n_layers"]):
        block = f"trf_blocks.{index}."
        for name in ("W_query", "W_key", "W_value"):
            shapes[f"{block}att.{name}.weight"] = (emb, emb)
            if config["qkv_bias"]:
                shapes[f"{block}att.{name}.bias"] = (emb,)
        shapes |= {
            f"{block}att.out_proj.weight": (emb, emb),
            f"{block}att.out_proj.bias": (emb,),
            f"{block}ff.layers.0.weight": (4 * emb, emb),
            f"{block}ff.layers.0.bias": (4 * emb,),
            f"{block}ff.layers.2.weight": (emb, 4 * emb),
            f"{block}ff.layers.2.bias": (emb,),
            f"{block}norm1.scale": (emb,),
            f"{block}norm1.shift": (emb,),
            f"{block}norm2.scale": (emb,),
            f"{block}norm2.shift": (emb,),
        }
    return shapes | {"final_norm.scale": (emb,), "final_norm.shift": (emb,), "out_head.weight": (vocab, emb)}


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
    check_params(params, shapes, layer="GPTModel")
    first = f"params[{FIRST_WEIGHT!r}]"
    check_floating(params[FIRST_WEIGHT], floating, first)
    check_params(params, shapes, layer="GPTModel", dtype=params[FIRST_WEIGHT].dtype, dtype_of=first)
    if check_values:
        check_finite(params)


def check_token_ids(token_ids: Any, config: Mapping[str, Any], *, check_values: bool = True) -> None:
    """``token_ids``: integer ``(B, T)``, T <= context_length, every id in [0, vocab_size)."""
    shape = getattr(token_ids, "shape", None)
    dtype = getattr(token_ids, "dtype", None)
    if shape is None or not np.issubdtype(np.dtype(dtype), np.integer):
        raise TypeError(f"token_ids must be an integer array (B, T), got {type(token_ids).__name__} {dtype}")
    if len(shape) != 2 or shape[1] < 1:
        raise ValueError(f"token_ids must have shape (B, T) with T >= 1, got {tuple(shape)}")
    if shape[1] > config["context_length"]:
        raise ValueError(
            f"token_ids has T={shape[1]} tokens, more than context_length {config['context_length']}"
        )
    if check_values:
        ids = np.asarray(token_ids)
        if ids.size and (ids.min() < 0 or ids.max() >= config["vocab_size"]):
            raise ValueError(
                f"token_ids hold ids in [{ids.min()}, {ids.max()}], outside the vocabulary "
                f"[0, {config['vocab_size']})"
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
    context; ``temperature`` >= 0; ``top_k`` in [1, vocab_size]; sampling has a random source."""
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int | np.integer)
        or max_new_tokens < 0
    ):
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if shape[1] + max_new_tokens > config["context_length"]:
        raise ValueError(
            f"token_ids has T={shape[1]} tokens; with max_new_tokens={max_new_tokens} that exceeds "
            f"context_length {config['context_length']}"
        )
    if not isinstance(temperature, int | float | np.floating) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, int | np.integer) and 1 <= top_k <= config["vocab_size"]):
        raise ValueError(f"top_k must be None or an integer in [1, {config['vocab_size']}], got {top_k!r}")
    if temperature > 0 and not has_rng:
        raise ValueError("sampling (temperature > 0) needs rng")
