"""Hugging Face Llama and Qwen3 checkpoints, read and written with NumPy and safetensors alone, and
``load_hf``/``save_hf``, which take any of the project's models (GPT-2 through ``numpy_attn.hf_gpt2``).

A folder holds ``config.json`` and ``model.safetensors``. transformers' Llama and Qwen3 store their
``nn.Linear`` weights as torch does, so no tensor is transposed or split: ``HF_NAMES`` is the one
table between the two namings (``{w}``: the RMSNorms' weight, ``weight`` in ``Llama3Model``,
``scale`` in ``Qwen3Model``). The config's ``rope_parameters`` (transformers 5) or ``rope_theta``
and ``rope_scaling`` (transformers 4) give ``rope_base`` and Llama 3's ``rope_freq``;
``lm_head.weight`` is absent where it is tied to the embeddings. Folders are written and read as
``save_hf_gpt2`` writes and ``load_hf_gpt2`` reads them: one atomic version at a time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.checks import check_flag, check_params
from numpy_attn.decoder_spec import (
    MODELS,
    check_config,
    decoder_param_shapes,
    head_dim,
    model_of,
    norm_eps,
    uses_qk_norm,
)
from numpy_attn.hf_gpt2 import (
    CONFIG_FILE,
    block_names,
    check_sizes,
    load_hf_gpt2,
    loaded_params,
    read_checkpoint,
    read_config_json,
    save_hf_gpt2,
    saved_params,
    write_checkpoint,
)
from numpy_attn.weights_file import read_arrays

MODEL_TYPES = {"llama": "Llama3Model", "qwen3": "Qwen3Model"}  # config.json's model_type -> ours
ARCHITECTURES = {"Llama3Model": "LlamaForCausalLM", "Qwen3Model": "Qwen3ForCausalLM"}
# the book's cfg's sizes -> config.json's (which must hold them; num_key_value_heads may be absent)
_SIZES = {
    "vocab_size": "vocab_size",
    "context_length": "max_position_embeddings",
    "emb_dim": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_layers": "num_hidden_layers",
    "hidden_dim": "intermediate_size",
    "n_kv_groups": "num_key_value_heads",
}
# transformers' tensor -> ours; {i}: each block's index, {w}: the RMSNorms' weight
HF_NAMES = {
    "model.embed_tokens.weight": "tok_emb.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "trf_blocks.{i}.att.W_query.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "trf_blocks.{i}.att.W_key.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "trf_blocks.{i}.att.W_value.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "trf_blocks.{i}.att.out_proj.weight",
    "model.layers.{i}.self_attn.q_norm.weight": "trf_blocks.{i}.att.q_norm.{w}",  # Qwen3's QK-norm
    "model.layers.{i}.self_attn.k_norm.weight": "trf_blocks.{i}.att.k_norm.{w}",
    "model.layers.{i}.mlp.gate_proj.weight": "trf_blocks.{i}.ff.fc1.weight",
    "model.layers.{i}.mlp.up_proj.weight": "trf_blocks.{i}.ff.fc2.weight",
    "model.layers.{i}.mlp.down_proj.weight": "trf_blocks.{i}.ff.fc3.weight",
    "model.layers.{i}.input_layernorm.weight": "trf_blocks.{i}.norm1.{w}",
    "model.layers.{i}.post_attention_layernorm.weight": "trf_blocks.{i}.norm2.{w}",
    "model.norm.weight": "final_norm.{w}",
    "lm_head.weight": "out_head.weight",  # absent where tied to embed_tokens
}
_BUFFERS = ("rotary_emb.inv_freq",)  # RoPE's buffer in older checkpoints, which transformers ignores
_DEFAULT_HEAD_DIM = {"qwen3": 128}  # transformers' Qwen3Config default (Llama's: hidden_size // heads)
# config.json values these models compute as transformers does (absent keys take these defaults)
_SUPPORTED = {
    "hidden_act": ("silu",),
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "use_sliding_window": (False,),
    "partial_rotary_factor": (1.0,),
}


def _names(cfg: Mapping[str, Any], model: str, lm_head: bool) -> dict[str, str]:
    """transformers' name -> ours, for every weight of ``model(cfg)`` (``lm_head`` left out where tied)."""
    ours, weight = decoder_param_shapes(cfg, model), MODELS[model].norms[0]
    names = {hf: name.format(i=index, w=weight) for hf, name, index in block_names(HF_NAMES, cfg["n_layers"])}
    return {hf: name for hf, name in names.items() if name in ours and (lm_head or hf != "lm_head.weight")}


def _rope(hf_config: dict[str, Any], model_type: str, name: str) -> tuple[float, dict[str, Any] | None]:
    """``(rope_base, rope_freq)`` from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4): the default RoPE, or Llama 3's scaling in a Llama."""
    rope = hf_config.get("rope_scaling") or hf_config.get("rope_parameters") or {}
    if not isinstance(rope, dict) or any(isinstance(value, dict) for value in rope.values()):
        raise ValueError(f"{name}: rope_parameters={rope!r} is not supported: one RoPE for every layer")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    allowed = ("default", "llama3") if model_type == "llama" else ("default",)
    if rope_type not in allowed:
        raise ValueError(f"{name}: RoPE type {rope_type!r} is not supported, only {allowed}")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{name}: partial_rotary_factor={rope['partial_rotary_factor']!r} is not supported")
    base = rope.get("rope_theta", hf_config.get("rope_theta", 10_000.0))
    if rope_type == "default":
        return base, None
    context = rope.get("original_max_position_embeddings", hf_config["max_position_embeddings"])
    keys = ("factor", "low_freq_factor", "high_freq_factor")
    if missing := [key for key in keys if key not in rope]:
        raise ValueError(f"{name}: Llama 3's RoPE scaling is missing keys {missing}")
    return base, {**{key: rope[key] for key in keys}, "original_context_length": context}


def _read_config(directory: str, path: str) -> tuple[dict[str, Any], str, bool]:
    """``(cfg, model, tied)`` from a Llama or Qwen3 ``config.json``, checked before anything is built
    from it: the sizes and settings (``check_sizes``: the tensors too), RoPE's, the book's
    ``Llama3Model``'s ``head_dim`` (``hidden_size // num_attention_heads``), a bool
    ``tie_word_embeddings``; then ``check_config``."""
    hf_config, name = read_config_json(directory, path), f"{directory}/{CONFIG_FILE}"
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{directory} holds a {model_type!r} model, not one of {list(MODEL_TYPES)}")
    model = MODEL_TYPES[model_type]
    hf_config.setdefault("num_key_value_heads", hf_config.get("num_attention_heads"))
    check_sizes(name, hf_config, _SIZES, HF_NAMES, _SUPPORTED)
    cfg = {ours: hf_config[theirs] for ours, theirs in _SIZES.items()}
    cfg["rope_base"], rope_freq = _rope(hf_config, model_type, name)
    heads_size = hf_config["hidden_size"] // hf_config["num_attention_heads"]
    size = hf_config.get("head_dim") or _DEFAULT_HEAD_DIM.get(model_type, heads_size)
    if model == "Llama3Model":
        if size != heads_size or hf_config["hidden_size"] % hf_config["num_attention_heads"]:
            raise ValueError(
                f"{name}: head_dim={size} is not supported, only hidden_size // num_attention_heads"
            )
        cfg["rope_freq"] = rope_freq
    else:
        cfg |= {"head_dim": size, "qk_norm": True}
    cfg["rms_norm_eps"] = hf_config.get("rms_norm_eps", 1e-6)
    tied = hf_config.get("tie_word_embeddings", False)
    check_flag(f"{name}: tie_word_embeddings", tied)
    check_config(cfg, model)
    return cfg, model, tied


def load_hf_decoder(directory: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(params, cfg)`` from a transformers Llama or Qwen3 folder: the weights in the project's format
    (torch_ref ``Llama3Model``'s or ``Qwen3Model``'s names and order; the file's dtype, bfloat16
    included) and the book's cfg (with ``rms_norm_eps`` and ``dtype``, the weights' dtype name)."""
    directory = os.fspath(directory)
    cfg, model, tied, hf = read_checkpoint(
        directory,
        "a Hugging Face checkpoint folder",
        lambda config, weights: (*_read_config(directory, config), read_arrays(weights, skip=_BUFFERS)),
    )
    lm_head = not tied or "lm_head.weight" in hf  # an untied head must be in the file, a tied one may be
    names = _names(cfg, model, lm_head)
    shapes = decoder_param_shapes(cfg, model)
    check_params(
        hf, {theirs: shapes[ours] for theirs, ours in names.items()}, layer=f"checkpoint {directory}"
    )
    params = loaded_params(
        model, {ours: np.ascontiguousarray(hf[theirs]) for theirs, ours in names.items()}, cfg
    )
    return params, cfg | {"dtype": params["tok_emb.weight"].dtype.name}


def _model_type(directory: str) -> Any:
    """config.json's ``model_type`` (ValueError where the folder has no config.json)."""
    what, read = "a Hugging Face checkpoint folder", functools.partial(read_config_json, directory)
    return read_checkpoint(directory, what, read, (CONFIG_FILE,)).get("model_type")


def load_hf(directory: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(params, cfg)`` from a transformers folder, by its config.json's ``model_type``: ``gpt2``
    (``load_hf_gpt2``: the GPT's config), ``llama`` (``Llama3Model``'s weights and cfg, with
    ``rope_freq`` from a ``llama3`` RoPE scaling) or ``qwen3`` (``Qwen3Model``'s, ``qk_norm`` True).
    ``decoder_spec.model_of(cfg)`` tells a Llama's cfg from a Qwen3's.

    Raises ValueError naming a missing file, another architecture, a setting these models do not
    compute as transformers does (``hidden_act``, biases, sliding windows, another RoPE), a
    ``config.json`` that is not JSON or whose sizes do not fit, or every missing, unexpected and
    mis-shaped tensor (``lm_head.weight`` is required when ``tie_word_embeddings`` is false)."""
    directory = os.fspath(directory)
    model_type = _model_type(directory)
    if model_type == "gpt2":
        return load_hf_gpt2(directory)
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{directory} holds a {model_type!r} model, not one of {['gpt2', *MODEL_TYPES]}")
    return load_hf_decoder(directory)


def save_hf(directory: str | os.PathLike, params: Mapping[str, np.ndarray], cfg: Mapping[str, Any]) -> None:
    """Write ``params`` (checked against ``cfg``; bfloat16 too) as a folder transformers'
    ``from_pretrained`` and ``load_hf`` load: a GPT-2 folder for the GPT's config (``save_hf_gpt2``), a
    ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` one for a decoder's (``model_of(cfg)``). ``lm_head`` is
    tied where ``out_head.weight`` equals ``tok_emb.weight``. Atomic, as ``save_hf_gpt2``.

    Raises ValueError, before anything is written, for weights that do not fit ``cfg``, a Qwen3
    without ``qk_norm`` (transformers' Qwen3 always has it), a ``directory`` that is not a folder;
    OSError naming ``directory`` where it cannot be written."""
    if isinstance(cfg, Mapping) and "qkv_bias" in cfg:
        save_hf_gpt2(directory, params, cfg)
    else:
        _save_hf_decoder(os.fspath(directory), params, cfg)


def _save_hf_decoder(directory: str, params: Mapping[str, np.ndarray], cfg: Mapping[str, Any]) -> None:
    model = model_of(cfg) if isinstance(cfg, Mapping) else "Llama3Model"
    params, tied = saved_params(model, params, cfg)
    if model == "Qwen3Model" and not uses_qk_norm(cfg, model):
        raise ValueError(
            "cfg['qk_norm'] is False, which transformers' Qwen3 cannot hold: it always has QK-norm"
        )
    hf = {theirs: np.asarray(params[ours]) for theirs, ours in _names(cfg, model, not tied).items()}
    write_checkpoint(directory, _hf_config(cfg, model), hf, tied)


def _hf_config(cfg: Mapping[str, Any], model: str) -> dict[str, Any]:
    """config.json for ``cfg``: RoPE both as transformers 5 writes it (``rope_parameters``) and as
    transformers 4 reads it (``rope_theta``, ``rope_scaling``); plain ints and floats."""
    model_type = next(theirs for theirs, ours in MODEL_TYPES.items() if ours == model)
    rope_freq = cfg.get("rope_freq") if model == "Llama3Model" else None
    base, scaling = float(cfg["rope_base"]), None
    if rope_freq is not None:
        factors = {key: float(rope_freq[key]) for key in ("factor", "low_freq_factor", "high_freq_factor")}
        context = int(rope_freq["original_context_length"])
        scaling = {"rope_type": "llama3", **factors, "original_max_position_embeddings": context}
    rope = {**scaling, "rope_theta": base} if scaling else {"rope_type": "default", "rope_theta": base}
    return {
        "architectures": [ARCHITECTURES[model]],
        "model_type": model_type,
        **{theirs: int(cfg[ours]) for ours, theirs in _SIZES.items()},
        "head_dim": int(head_dim(cfg, model)),
        "hidden_act": "silu",
        "rms_norm_eps": float(norm_eps(cfg, model)),
        "rope_theta": base,
        "rope_scaling": scaling,
        "rope_parameters": rope,
        "attention_bias": False,
        **({"mlp_bias": False} if model == "Llama3Model" else {"use_sliding_window": False}),
    }
