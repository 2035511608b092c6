"""Hugging Face GPT-2 checkpoints, read and written with NumPy and safetensors alone.

A GPT-2 folder holds ``config.json`` and ``model.safetensors``. GPT-2 stores its ``Conv1D`` weights
as ``(in, out)`` (torch's ``Linear`` is ``(out, in)``), fuses the three projections in ``c_attn``
(columns: queries, keys, values) and ties ``lm_head`` to ``wte`` (the file holds ``wte`` alone).
``HF_NAMES`` is the one table between the two namings; layouts change here and nowhere else.

``save_hf_gpt2`` writes each checkpoint as a new hidden version folder (``.version-<token>``) and
switches the folder to it with one atomic rename of a link, ``.current``; ``config.json`` and
``model.safetensors`` are links through it, so transformers' ``from_pretrained`` reads the folder
as always. A crash, a full disk or a concurrent save leaves the old complete checkpoint or the new
one (a killed save may leave a hidden version folder, which the next save removes); ``load_hf_gpt2``
reads the version the link names when it starts, never a mix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from numpy_attn import files
from numpy_attn.checks import JAX_FLOATS, check_divisible, check_dropout, check_flag, check_params, check_size
from numpy_attn.decoder_spec import decoder_param_shapes, gpt_param_shapes, without_buffers
from numpy_attn.door import Framework
from numpy_attn.file_checks import MAX_TENSORS, parse_json
from numpy_attn.gpt_checks import check_model_params
from numpy_attn.gpt_spec import LAYER_NORM_EPS
from numpy_attn.weights_file import read_arrays, save_weights

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
HF_BUFFERS = (".attn.bias", ".attn.masked_bias")  # old causal-mask buffers, which transformers ignores
T = TypeVar("T")
_MAX_CONFIG = 1 << 20  # bytes of config.json read at most (GPT-2's has about 1 kB)
# the book's config's sizes -> config.json's (which must hold them)
_SIZES = {"vocab_size": "vocab_size", "context_length": "n_positions", "emb_dim": "n_embd",
          "n_heads": "n_head", "n_layers": "n_layer"}  # fmt: skip
# GPT-2's tensor -> GPTModel's (GPT-2's split in equal parts along the output axis) and whether GPT-2
# stores it transposed (Conv1D); ``{i}``: each block's index
HF_NAMES: dict[str, tuple[tuple[str, ...], bool]] = {
    "transformer.wte.weight": (("tok_emb.weight",), False),
    "transformer.wpe.weight": (("pos_emb.weight",), False),
    "transformer.h.{i}.attn.c_attn.weight": (
        (
            "trf_blocks.{i}.att.W_query.weight",
            "trf_blocks.{i}.att.W_key.weight",
            "trf_blocks.{i}.att.W_value.weight",
        ),
        True,
    ),
    "transformer.h.{i}.attn.c_attn.bias": (
        (
            "trf_blocks.{i}.att.W_query.bias",
            "trf_blocks.{i}.att.W_key.bias",
            "trf_blocks.{i}.att.W_value.bias",
        ),
        False,
    ),
    "transformer.h.{i}.attn.c_proj.weight": (("trf_blocks.{i}.att.out_proj.weight",), True),
    "transformer.h.{i}.attn.c_proj.bias": (("trf_blocks.{i}.att.out_proj.bias",), False),
    "transformer.h.{i}.mlp.c_fc.weight": (("trf_blocks.{i}.ff.layers.0.weight",), True),
    "transformer.h.{i}.mlp.c_fc.bias": (("trf_blocks.{i}.ff.layers.0.bias",), False),
    "transformer.h.{i}.mlp.c_proj.weight": (("trf_blocks.{i}.ff.layers.2.weight",), True),
    "transformer.h.{i}.mlp.c_proj.bias": (("trf_blocks.{i}.ff.layers.2.bias",), False),
    "transformer.h.{i}.ln_1.weight": (("trf_blocks.{i}.norm1.scale",), False),
    "transformer.h.{i}.ln_1.bias": (("trf_blocks.{i}.norm1.shift",), False),
    "transformer.h.{i}.ln_2.weight": (("trf_blocks.{i}.norm2.scale",), False),
    "transformer.h.{i}.ln_2.bias": (("trf_blocks.{i}.norm2.shift",), False),
    "transformer.ln_f.weight": (("final_norm.scale",), False),
    "transformer.ln_f.bias": (("final_norm.shift",), False),
    "lm_head.weight": (("out_head.weight",), False),  # absent where tied to wte
}
# config.json values this GPT computes exactly as GPT-2 does (absent keys take these defaults)
_SUPPORTED = {
    "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
    "layer_norm_epsilon": (LAYER_NORM_EPS,),
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    "add_cross_attention": (False,),
}


class _FileChecks(Framework):
    floats = JAX_FLOATS  # a checkpoint holds what jax_attn computes in: bfloat16 too


FILE_CHECKS = _FileChecks()  # the checks of a checkpoint's weights


def block_names(table: Mapping[str, T], n_layers: int) -> Iterator[tuple[str, T, int | None]]:
    """``(transformers' name, its row, block index)`` for each row of a name ``table`` in a model of
    ``n_layers`` blocks: a name with ``{i}`` once a block (formatted), another once (index None)."""
    for hf, row in table.items():
        for index in range(n_layers) if "{i}" in hf else [None]:
            yield hf.format(i=index), row, index


def hf_names(n_layers: int, lm_head: bool) -> dict[str, tuple[tuple[str, ...], bool]]:
    """``HF_NAMES`` for a GPT of ``n_layers`` blocks (``lm_head`` left out where it is tied)."""
    names = {
        hf: (tuple(name.format(i=index) for name in ours), transposed)
        for hf, (ours, transposed), index in block_names(HF_NAMES, n_layers)
    }
    return names if lm_head else {hf: value for hf, value in names.items() if hf != "lm_head.weight"}


def book_params(hf: Mapping[str, np.ndarray], n_layers: int, lm_head: bool) -> dict[str, np.ndarray]:
    """GPT-2's tensors ``hf`` (transformers' names, ``HF_NAMES``) under ``GPTModel``'s names and in its
    layout: ``Conv1D`` weights transposed to ``(out, in)``, ``c_attn`` split into the query, key and
    value thirds, ``out_head`` tied to ``tok_emb`` where ``lm_head`` is False. Shapes are the caller's
    to check (``load_hf_gpt2``)."""
    params = {}
    for hf_name, (names, transposed) in hf_names(n_layers, lm_head).items():
        value = hf[hf_name].T if transposed else hf[hf_name]  # (out, in)
        for name, part in zip(names, np.split(value, len(names)), strict=True):
            params[name] = np.ascontiguousarray(part)
    params.setdefault("out_head.weight", params["tok_emb.weight"])
    return params


def _hf_shapes(config: Mapping[str, Any], lm_head: bool) -> dict[str, tuple[int, ...]]:
    """The GPT-2 tensors of a checkpoint for ``config`` (the book's keys), in GPT-2's layout."""
    ours = gpt_param_shapes({**config, "qkv_bias": True})
    shapes = {}
    for hf, (names, transposed) in hf_names(config["n_layers"], lm_head).items():
        shape = (sum(ours[name][0] for name in names), *ours[names[0]][1:])  # parts along the output axis
        shapes[hf] = shape[::-1] if transposed else shape
    return shapes


def read_config_json(directory: str, path: str, what: str = "a config.json") -> dict[str, Any]:
    """The JSON object in ``config.json`` at ``path`` (named as in ``directory``): at most
    ``_MAX_CONFIG`` bytes (``what`` holds about 1 kB), UTF-8, valid JSON, an object; ValueError otherwise."""
    name = f"{directory}/{CONFIG_FILE}"
    with files.open_regular_file(path) as file:
        text = file.read(_MAX_CONFIG + 1)
    if len(text) > _MAX_CONFIG:
        raise ValueError(f"{name} holds more than {_MAX_CONFIG} bytes; {what} holds about 1 kB")
    hf_config = parse_json(text, f"{name} is not valid JSON")
    if not isinstance(hf_config, dict):
        raise ValueError(f"{name} is not a JSON object")
    return hf_config


def check_sizes(
    name: str, hf_config: Mapping[str, Any], sizes: Mapping[str, str], names: Iterable[str],
    supported: Mapping[str, tuple[Any, ...]],
) -> None:  # fmt: skip
    """config.json (``name``) holds each of ``sizes``' values (its keys for the book's), a positive int,
    no more blocks (``sizes["n_layers"]``) than a weight file holds tensors of the name table
    ``names`` (``{i}``: a block's) and only the settings ``supported`` allows (absent: the first)."""
    if missing := [key for key in sizes.values() if key not in hf_config]:
        raise ValueError(f"{name} is missing keys {missing}")
    for key in sizes.values():
        check_size(f"{name}: {key}", hf_config[key])
    layers, per_block = sizes["n_layers"], sum("{i}" in hf for hf in names)
    if (tensors := hf_config[layers] * per_block) > MAX_TENSORS:
        raise ValueError(
            f"{name}: {layers}={hf_config[layers]} needs {tensors} tensors ({per_block} a block), more "
            f"than the {MAX_TENSORS} a weight file holds"
        )
    for key, allowed in supported.items():
        if hf_config.get(key, allowed[0]) not in allowed:
            raise ValueError(f"{name}: {key}={hf_config[key]!r} is not supported, only {allowed}")


def read_checkpoint(
    directory: str, what: str, read: Callable[..., Any], names: tuple[str, ...] = (CONFIG_FILE, WEIGHTS_FILE)
) -> Any:
    """``read(*paths)`` of the files ``names`` (config.json, model.safetensors) of the one version of
    the checkpoint in ``directory`` (``files.read_folder``), each found regular first (ValueError: not
    ``what``, naming one missing)."""
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.exists(path):  # a link to nothing too; a FIFO or a folder is not missing
            raise ValueError(f"{directory} is not {what}: {name} is missing")
        files.check_regular_file(path)  # all before any is read
    return files.read_folder(directory, names, lambda paths: read(*(paths[name] for name in names)))


def loaded_params(
    model: str, params: dict[str, np.ndarray], config: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """A checkpoint's weights under our names as ``model(config)``'s: ``out_head`` tied to ``tok_emb``
    where the file has no ``lm_head``, in torch's order, checked (``check_model_params``)."""
    params.setdefault("out_head.weight", params["tok_emb.weight"])
    params = {name: params[name] for name in decoder_param_shapes(config, model)}  # torch's order
    check_model_params(FILE_CHECKS, model, params, config)
    return params


def saved_params(model: str, params: Any, config: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """``params`` to save as ``model(config)``'s (buffers left out, checked: bfloat16 too) and whether
    ``out_head`` is tied to ``tok_emb`` (equal arrays: the file then holds no ``lm_head``)."""
    params = without_buffers(model, params, config)
    check_model_params(FILE_CHECKS, model, params, config)
    return params, tied(params)


def tied(params: Mapping[str, Any]) -> bool:
    """Whether ``out_head.weight`` is ``tok_emb.weight`` or equals it: the rule by which a saved folder
    holds no ``lm_head`` and a loaded model ties its head to its token embedding."""
    head, embedding = params["out_head.weight"], params["tok_emb.weight"]
    return head is embedding or bool(np.array_equal(head, embedding))


def _read_config(directory: str, path: str) -> dict[str, Any]:
    """``config.json`` (at ``path``; named as in ``directory``), checked before anything is built from
    it: a JSON object of at most ``_MAX_CONFIG`` bytes, UTF-8, ``model_type`` gpt2, positive int sizes (an
    ``n_layer`` whose tensors could not fit in a weight file refused here), ``n_head`` dividing
    ``n_embd``, a bool ``tie_word_embeddings`` (True where absent), one dropout rate in [0, 1) (the
    three of GPT-2 equal) and the settings this GPT computes as GPT-2 does."""
    name = f"{directory}/{CONFIG_FILE}"
    hf_config = read_config_json(directory, path, "a GPT-2 config.json")
    if hf_config.get("model_type") != "gpt2":
        raise ValueError(f"{directory} holds a {hf_config.get('model_type')!r} model, not 'gpt2'")
    check_sizes(name, hf_config, _SIZES, HF_NAMES, _SUPPORTED)
    check_divisible(f"{name}: n_embd", hf_config["n_embd"], hf_config["n_head"], heads_name="n_head")
    check_flag(f"{name}: tie_word_embeddings", hf_config.setdefault("tie_word_embeddings", True))
    rates = {key: hf_config.get(key, 0.1) for key in ("resid_pdrop", "attn_pdrop", "embd_pdrop")}
    check_dropout(f"{name}: resid_pdrop", rates["resid_pdrop"])
    if len(set(rates.values())) > 1:  # the book's GPT has one drop_rate for the three dropouts
        raise ValueError(
            f"{name}: dropout rates {rates} differ; the book's GPT has one drop_rate for all three"
        )
    if hf_config.get("n_inner") not in (None, 4 * hf_config["n_embd"]):
        raise ValueError(f"{name}: n_inner={hf_config['n_inner']} is not supported, only 4 * n_embd")
    return hf_config


def load_hf_gpt2(directory: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(params, config)`` from a transformers GPT-2 folder, read as one version: the weights in the
    project's format (``GPTModel``'s names, layout and order; the file's dtype, bfloat16 included) and
    the book's config (``qkv_bias`` True, ``drop_rate`` from ``resid_pdrop``). Leftover causal-mask
    buffers (``attn.bias``, ``attn.masked_bias``) are ignored, as transformers ignores them.

    Raises ValueError (TypeError for a non-int size) naming what in the folder does not fit
    (``_read_config``'s rules; a weight under two names; every missing, unexpected and mis-shaped
    tensor, ``lm_head.weight`` required when ``tie_word_embeddings`` is false)."""
    directory = os.fspath(directory)
    hf_config, hf = read_checkpoint(
        directory,
        "a GPT-2 checkpoint folder",
        lambda config, weights: (
            _read_config(directory, config),
            _transformer_names(read_arrays(weights, skip=HF_BUFFERS), directory),
        ),
    )
    config = {ours: hf_config[theirs] for ours, theirs in _SIZES.items()}
    config |= {"drop_rate": hf_config.get("resid_pdrop", 0.1), "qkv_bias": True}
    # an untied head must be in the file (transformers would draw it at random), a tied one may be
    lm_head = not hf_config["tie_word_embeddings"] or "lm_head.weight" in hf
    check_params(hf, _hf_shapes(config, lm_head), layer=f"GPT-2 checkpoint {directory}")
    return loaded_params("GPTModel", book_params(hf, config["n_layers"], lm_head), config), config


def _transformer_names(hf: Mapping[str, np.ndarray], directory: str) -> dict[str, np.ndarray]:
    """``hf`` with every name but ``lm_head``'s under ``transformer.`` (GPT2Model's files leave it
    out). A tensor under both names raises ValueError naming both: which to load is not ours to guess."""
    sources: dict[str, str] = {}  # the name used here -> the file's
    for name in hf:
        ours = name if name.startswith("lm_head.") else f"transformer.{name.removeprefix('transformer.')}"
        if ours in sources:
            raise ValueError(
                f"GPT-2 checkpoint {directory} names one weight twice, with and without 'transformer.': "
                f"{sources[ours]!r} and {name!r}"
            )
        sources[ours] = name
    return {ours: hf[name] for ours, name in sources.items()}


def save_hf_gpt2(
    directory: str | os.PathLike, params: Mapping[str, np.ndarray], config: Mapping[str, Any]
) -> None:
    """Write ``params`` (checked against ``config``; bfloat16 too) as a GPT-2 folder that
    ``GPT2LMHeadModel.from_pretrained`` and ``load_hf_gpt2`` load, atomically (the module docstring;
    saves to one folder run one at a time). ``lm_head`` is tied to ``wte`` when ``out_head.weight``
    equals ``tok_emb.weight``; a model without ``qkv_bias`` gets zero ``c_attn`` biases (the same
    outputs).

    Raises ValueError, before anything is written, for weights that do not fit ``config``, a
    ``directory`` that is not a folder or a checkpoint file there that is not a regular file; OSError
    naming ``directory`` where it cannot be written.
    """
    params, tied = saved_params("GPTModel", params, config)
    dtype, shapes = params["tok_emb.weight"].dtype, gpt_param_shapes({**config, "qkv_bias": True})
    hf = {}
    for hf_name, (names, transposed) in hf_names(config["n_layers"], not tied).items():
        # zeros for the biases of a model without qkv_bias: the same outputs
        parts = [np.asarray(params[n]) if n in params else np.zeros(shapes[n], dtype) for n in names]
        value = np.concatenate(parts) if len(parts) > 1 else parts[0]
        hf[hf_name] = value.T if transposed else value
    write_checkpoint(directory, _hf_config(config), hf, tied)


def write_checkpoint(
    directory: str | os.PathLike, config: Mapping[str, Any], weights: dict[str, np.ndarray], tied: bool
) -> None:
    """A Hugging Face folder: ``config`` as config.json (with ``tie_word_embeddings``, no special
    tokens and the weights' ``dtype``) and ``weights`` (transformers' names) as model.safetensors,
    swapped in as a whole (``files.write_folder``); the folder is made if needed."""
    dtype = next(iter(weights.values())).dtype.name  # the weights share one
    common = {"tie_word_embeddings": bool(tied), "bos_token_id": None, "eos_token_id": None, "dtype": dtype}
    text = json.dumps({**config, **common}, indent=2).encode()
    directory = os.fspath(directory)
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory)
    except FileExistsError:
        raise ValueError(f"{directory} is not a folder: a Hugging Face checkpoint is a folder") from None
    except OSError as error:
        raise files.named_error(error, directory) from None

    def write(version: str) -> None:
        with files.atomic_write(os.path.join(version, CONFIG_FILE)) as file:
            file.write(text)
        save_weights(os.path.join(version, WEIGHTS_FILE), weights)

    files.write_folder(directory, (CONFIG_FILE, WEIGHTS_FILE), write)


def _hf_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json for ``config``: checked ints and a float, NumPy's too, as JSON's."""
    rate = float(config["drop_rate"])
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        **{theirs: int(config[ours]) for ours, theirs in _SIZES.items()},
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPS,
        **{key: rate for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop")},
    }
