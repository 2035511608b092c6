"""Hugging Face GPT-2 checkpoints, read and written with NumPy alone.

A folder written by transformers' ``GPT2LMHeadModel.save_pretrained`` holds ``config.json`` and
``model.safetensors``. GPT-2 stores its ``Conv1D`` weights as ``(in, out)`` (torch's ``Linear``
is ``(out, in)``), fuses the three projections in ``c_attn`` (columns: queries, keys, values)
and ties ``lm_head`` to ``wte`` (the file holds ``wte`` alone). ``HF_NAMES`` is the one table
between the two namings; layouts change here and nowhere else.

    GPTModel (torch_ref)                  GPT-2 (transformers)
    tok_emb.weight / pos_emb.weight       transformer.wte.weight / transformer.wpe.weight
    trf_blocks.{i}.att.W_{query,key,value} transformer.h.{i}.attn.c_attn (thirds of its columns)
    trf_blocks.{i}.att.out_proj           transformer.h.{i}.attn.c_proj
    trf_blocks.{i}.ff.layers.0 / .2       transformer.h.{i}.mlp.c_fc / mlp.c_proj
    trf_blocks.{i}.norm1 / norm2          transformer.h.{i}.ln_1 / ln_2 (scale = weight, shift = bias)
    final_norm                            transformer.ln_f
    out_head.weight                       lm_head.weight, or wte when tied
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.checks import check_divisible, check_dropout, check_flag, check_params, check_size
from numpy_attn.gpt_checks import check_gpt_params as _check_gpt_params
from numpy_attn.gpt_spec import LAYER_NORM_EPS, without_gpt_buffers
from numpy_attn.weights_file import (
    MAX_TENSORS,
    check_regular_file,
    create_regular_file,
    load_weights,
    open_regular_file,
    save_weights,
)

__all__ = ["HF_NAMES", "load_hf_gpt2", "save_hf_gpt2"]

from numpy_attn.door import Framework as _Framework

_NUMPY = _Framework()

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
_MAX_CONFIG = 1 << 20  # bytes of config.json read at most (GPT-2's has about 1 kB)
_SIZES = ("vocab_size", "n_positions", "n_embd", "n_head", "n_layer")  # config.json's required sizes
QKV = ("W_query", "W_key", "W_value")
# GPTModel block name -> GPT-2 block name (Conv1D weights transposed, LayerNorm renamed)
HF_NAMES = {
    "att.out_proj": "attn.c_proj",
    "ff.layers.0": "mlp.c_fc",
    "ff.layers.2": "mlp.c_proj",
    "norm1": "ln_1",
    "norm2": "ln_2",
}
_NORM_NAMES = {"scale": "weight", "shift": "bias"}
# config.json values this GPT computes exactly as GPT-2 does (absent keys take these defaults)
_SUPPORTED = {
    "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
    "layer_norm_epsilon": (LAYER_NORM_EPS,),
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    "add_cross_attention": (False,),
}


def _read_config(directory: str) -> dict[str, Any]:
    """``config.json`` of a GPT-2 folder, checked before anything is built from it (both files
    must exist, as regular files): JSON of at most ``_MAX_CONFIG`` bytes, UTF-8, ``model_type``
    gpt2, positive int sizes (a ``n_layer`` whose blocks could not fit in a weight file is
    refused here, before its tensors are listed), ``n_head`` dividing ``n_embd``, a bool
    ``tie_word_embeddings`` (set to its default, True, where absent), a dropout rate in [0, 1)
    and the settings this GPT computes as GPT-2 does."""
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        path = os.path.join(directory, file)
        if not os.path.exists(path):  # a link to nothing too; a FIFO or a folder is not missing
            raise ValueError(f"{directory} is not a GPT-2 checkpoint folder: {file} is missing")
        check_regular_file(path)  # both before either is read
    name = f"{directory}/{CONFIG_FILE}"
    with open_regular_file(os.path.join(directory, CONFIG_FILE)) as file:
        text = file.read(_MAX_CONFIG + 1)
    if len(text) > _MAX_CONFIG:
        raise ValueError(f"{name} holds more than {_MAX_CONFIG} bytes; a GPT-2 config.json holds about 1 kB")
    try:
        hf_config = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # not UTF-8, bad JSON, too many digits, too deep
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ValueError(f"{name} is not valid JSON: {reason}") from None
    if not isinstance(hf_config, dict) or hf_config.get("model_type") != "gpt2":
        model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
        raise ValueError(f"{directory} holds a {model_type!r} model, not 'gpt2'")
    missing = [key for key in _SIZES if key not in hf_config]
    if missing:
        raise ValueError(f"{name} is missing keys {missing}")
    for key in _SIZES:
        check_size(f"{name}: {key}", hf_config[key])
    check_divisible(f"{name}: n_embd", hf_config["n_embd"], hf_config["n_head"], heads_name="n_head")
    check_flag(f"{name}: tie_word_embeddings", hf_config.setdefault("tie_word_embeddings", True))
    check_dropout(f"{name}: resid_pdrop", hf_config.get("resid_pdrop", 0.1))
    n_layer, per_block = hf_config["n_layer"], len(_hf_block_shapes("", 1))
    if n_layer * per_block > MAX_TENSORS:
        raise ValueError(
            f"{name}: n_layer={n_layer} needs {n_layer * per_block} tensors ({per_block} a block), more "
            f"than the {MAX_TENSORS} a weight file holds"
        )
    for key, allowed in _SUPPORTED.items():
        if hf_config.get(key, allowed[0]) not in allowed:
            raise ValueError(f"{name}: {key}={hf_config[key]!r} is not supported, only {allowed}")
    n_inner = hf_config.get("n_inner")
    if n_inner not in (None, 4 * hf_config["n_embd"]):
        raise ValueError(f"{name}: n_inner={n_inner} is not supported, only 4 * n_embd")
    return hf_config


def _hf_block_shapes(block: str, emb: int) -> dict[str, tuple[int, ...]]:
    """The tensors of one GPT-2 block, named with the prefix ``block`` (``transformer.h.{i}.``)."""
    shapes = {
        f"{block}attn.c_attn.weight": (emb, 3 * emb),
        f"{block}attn.c_attn.bias": (3 * emb,),
        f"{block}attn.c_proj.weight": (emb, emb),
        f"{block}attn.c_proj.bias": (emb,),
        f"{block}mlp.c_fc.weight": (emb, 4 * emb),
        f"{block}mlp.c_fc.bias": (4 * emb,),
        f"{block}mlp.c_proj.weight": (4 * emb, emb),
        f"{block}mlp.c_proj.bias": (emb,),
    }
    return shapes | {f"{block}{ln}.{p}": (emb,) for ln in ("ln_1", "ln_2") for p in ("weight", "bias")}


def _hf_shapes(config: Mapping[str, Any], lm_head: bool) -> dict[str, tuple[int, ...]]:
    """The GPT-2 tensors of a checkpoint for ``config`` (the book's keys), GPT-2's layout."""
    vocab, context, emb = config["vocab_size"], config["context_length"], config["emb_dim"]
    shapes = {"transformer.wte.weight": (vocab, emb), "transformer.wpe.weight": (context, emb)}
    for index in range(config["n_layers"]):
        shapes |= _hf_block_shapes(f"transformer.h.{index}.", emb)
    shapes |= {"transformer.ln_f.weight": (emb,), "transformer.ln_f.bias": (emb,)}
    return shapes | ({"lm_head.weight": (vocab, emb)} if lm_head else {})


def load_hf_gpt2(directory: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(params, config)`` from a transformers GPT-2 folder: the weights in the project's format
    (torch_ref ``GPTModel``'s names and layout) and the book's config dict (``qkv_bias`` True,
    ``drop_rate`` from ``resid_pdrop``). ValueError names a missing file or one that is not a
    regular file, another architecture, an unsupported setting, a ``config.json`` that is not
    JSON (UTF-8, at most 1 MiB) or whose sizes are not positive ints (TypeError for a non-int,
    naming the key) or do not cut ``n_embd`` into ``n_head`` heads, or every missing, unexpected
    and mis-shaped tensor (``lm_head.weight`` is required when ``tie_word_embeddings`` is false:
    ``wte`` is the head only of a tied checkpoint)."""
    directory = os.fspath(directory)
    hf_config = _read_config(directory)
    config = {
        "vocab_size": hf_config["vocab_size"],
        "context_length": hf_config["n_positions"],
        "emb_dim": hf_config["n_embd"],
        "n_heads": hf_config["n_head"],
        "n_layers": hf_config["n_layer"],
        "drop_rate": hf_config.get("resid_pdrop", 0.1),
        "qkv_bias": True,
    }
    hf = _transformer_names(load_weights(os.path.join(directory, WEIGHTS_FILE)), directory)
    # an untied head must be in the file (transformers would draw it at random), a tied one may be
    lm_head = not hf_config["tie_word_embeddings"] or "lm_head.weight" in hf
    check_params(hf, _hf_shapes(config, lm_head), layer=f"GPT-2 checkpoint {directory}")
    params = {"tok_emb.weight": hf["transformer.wte.weight"], "pos_emb.weight": hf["transformer.wpe.weight"]}
    for index in range(config["n_layers"]):
        block, hf_block = f"trf_blocks.{index}.", f"transformer.h.{index}."
        weights = np.split(hf[f"{hf_block}attn.c_attn.weight"], 3, axis=1)  # 3 x (D, D), (in, out)
        biases = np.split(hf[f"{hf_block}attn.c_attn.bias"], 3)  # 3 x (D,)
        for name, weight, bias in zip(QKV, weights, biases, strict=True):
            params[f"{block}att.{name}.weight"] = _layout(weight, True)  # (out, in)
            params[f"{block}att.{name}.bias"] = bias
        for name, hf_name, transposed in _block_pairs(block, hf_block):
            params[name] = _layout(hf[hf_name], transposed)
    params["final_norm.scale"] = hf["transformer.ln_f.weight"]
    params["final_norm.shift"] = hf["transformer.ln_f.bias"]
    params["out_head.weight"] = hf.get("lm_head.weight", hf["transformer.wte.weight"])
    _check_gpt_params(_NUMPY, params, config)  # TODO(redesign)
    return params, config


def _transformer_names(hf: Mapping[str, np.ndarray], directory: str) -> dict[str, np.ndarray]:
    """``hf`` with every name but ``lm_head``'s under ``transformer.`` (GPT2Model's files leave
    it out), less the old causal-mask buffers. A tensor under both names (``wte.weight`` and
    ``transformer.wte.weight``) raises ValueError naming both: which one to load is not ours
    to guess."""
    sources: dict[str, str] = {}  # the name used here -> the file's
    for name in hf:
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        ours = name if name.startswith("lm_head.") else f"transformer.{name.removeprefix('transformer.')}"
        if ours in sources:
            raise ValueError(
                f"GPT-2 checkpoint {directory} names one weight twice, with and without 'transformer.': "
                f"{sources[ours]!r} and {name!r}"
            )
        sources[ours] = name
    return {ours: hf[name] for ours, name in sources.items()}


def _block_pairs(block: str, hf_block: str) -> list[tuple[str, str, bool]]:
    """``(our name, GPT-2 name, transposed)`` for a block's tensors other than ``c_attn``."""
    pairs = []
    for name, hf_name in HF_NAMES.items():
        if name.startswith("norm"):
            pairs += [(f"{block}{name}.{ours}", f"{hf_block}{hf_name}.{theirs}", False)
                      for ours, theirs in _NORM_NAMES.items()]  # fmt: skip
        else:
            pairs += [(f"{block}{name}.weight", f"{hf_block}{hf_name}.weight", True),
                      (f"{block}{name}.bias", f"{hf_block}{hf_name}.bias", False)]  # fmt: skip
    return pairs


def _layout(value: np.ndarray, transposed: bool) -> np.ndarray:
    """Conv1D ``(in, out)`` <-> Linear ``(out, in)``: a transpose either way."""
    return np.ascontiguousarray(value.T) if transposed else value


def save_hf_gpt2(
    directory: str | os.PathLike, params: Mapping[str, np.ndarray], config: Mapping[str, Any]
) -> None:
    """Write ``params`` (checked against ``config``) as a folder ``GPT2LMHeadModel.from_pretrained``
    loads. ``lm_head`` is tied to ``wte`` when ``out_head.weight`` equals ``tok_emb.weight``;
    a model without ``qkv_bias`` gets zero ``c_attn`` biases (the same outputs). ``config.json``
    holds plain ints and floats (NumPy ones in ``config`` are converted). Nothing is written
    unless the weights, the config and both destinations pass (ValueError for one that exists
    and is not a regular file: a FIFO would block). All or nothing: both files are written to
    temporary names in the folder, then renamed into place (config.json first); on any error
    (a full disk) the folder keeps the files it held, and no temporary. A destination that is a
    link is replaced, not written through."""
    params = without_gpt_buffers(params, config)
    _check_gpt_params(_NUMPY, params, config)  # TODO(redesign)
    params = {name: np.asarray(value) for name, value in params.items()}
    tied = np.array_equal(params["out_head.weight"], params["tok_emb.weight"])
    hf = {
        "transformer.wte.weight": params["tok_emb.weight"],
        "transformer.wpe.weight": params["pos_emb.weight"],
    }
    for index in range(config["n_layers"]):
        block, hf_block = f"trf_blocks.{index}.", f"transformer.h.{index}."
        weight = np.concatenate([params[f"{block}att.{n}.weight"] for n in QKV])  # (3D, D), (out, in)
        hf[f"{hf_block}attn.c_attn.weight"] = _layout(weight, True)  # (D, 3D), (in, out)
        hf[f"{hf_block}attn.c_attn.bias"] = np.concatenate(
            [params.get(f"{block}att.{n}.bias", np.zeros(weight.shape[1], weight.dtype)) for n in QKV]
        )  # (3D,)
        for name, hf_name, transposed in _block_pairs(block, hf_block):
            hf[hf_name] = _layout(params[name], transposed)
    hf["transformer.ln_f.weight"] = params["final_norm.scale"]
    hf["transformer.ln_f.bias"] = params["final_norm.shift"]
    if not tied:
        hf["lm_head.weight"] = params["out_head.weight"]
    hf_config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": int(config["vocab_size"]),  # checked ints and a float, NumPy's too: JSON's
        "n_positions": int(config["context_length"]),
        "n_embd": int(config["emb_dim"]),
        "n_head": int(config["n_heads"]),
        "n_layer": int(config["n_layers"]),
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": float(config["drop_rate"]),
        "embd_pdrop": float(config["drop_rate"]),
        "attn_pdrop": float(config["drop_rate"]),
        "tie_word_embeddings": bool(tied),
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": params["tok_emb.weight"].dtype.name,
    }
    text = json.dumps(hf_config, indent=2).encode()  # before anything is written
    os.makedirs(directory, exist_ok=True)
    # config.json first: a reader between the two renames (they are not one atomic step) sees the
    # new config.json beside the old weights, which the loader checks against it, never new weights
    # beside an old config.json, which could load as a model that was never saved
    names = (CONFIG_FILE, WEIGHTS_FILE)
    paths = [os.path.join(directory, name) for name in names]
    for path in paths:
        check_regular_file(path, missing_ok=True)  # before anything is written: a refusal writes nothing
    token = secrets.token_hex(8)  # the temporaries' names (the suffix kept: save_weights reads it)
    new, old = ([os.path.join(directory, f".{token}.{kind}.{n}") for n in names] for kind in ("new", "old"))
    moved = []  # the destinations renamed aside to old or replaced so far
    try:
        with create_regular_file(new[0]) as file:
            file.write(text)
        save_weights(new[1], hf)
        for index, path in enumerate(paths):
            if os.path.lexists(path):
                os.replace(path, old[index])  # kept aside until both are in place, to undo
            moved.append(index)
            os.replace(new[index], path)
    except BaseException:
        _undo(paths, new, old, moved)
        raise
    for path in old:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _undo(paths: list[str], new: list[str], old: list[str], moved: list[int]) -> None:
    """A failed ``save_hf_gpt2``: each destination it changed as it was (its file renamed back from
    aside, or removed if there was none), the temporaries removed."""
    for index in reversed(moved):
        with contextlib.suppress(OSError):  # the first error is the one raised
            if os.path.lexists(old[index]):
                os.replace(old[index], paths[index])
            elif not os.path.lexists(new[index]):  # the new file was renamed into place
                os.remove(paths[index])
    for path in new:
        with contextlib.suppress(OSError):
            os.remove(path)
