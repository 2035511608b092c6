"""Hugging Face GPT-2 checkpoints: read with NumPy alone, written back, against transformers' forward."""

from __future__ import annotations

import json
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers  # its models load on first use (GPT2LMHeadModel: 2 s), so only where used
from safetensors import safe_open

import jax_attn
import numpy_attn
import torch_ref
from parity_tests.compare import compare_arrays
from tests.cpu_time import within_cpu_seconds
from tests.gpt_cases import TINY, token_ids, torch_model

# one worker imports transformers' GPT-2 (2 s), not both (tests/test_gpt_generate.py joins it)
pytestmark = pytest.mark.xdist_group("transformers")


def hf_model(seed: int = 0, **overrides) -> transformers.GPT2LMHeadModel:
    """A random small GPT-2 (no dropout), as transformers initialises it under ``seed``."""
    arguments = dict(
        vocab_size=53, n_positions=20, n_embd=24, n_layer=2, n_head=3, bos_token_id=0, eos_token_id=0
    )
    arguments |= dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**arguments | overrides)).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    model = hf_model()
    model.save_pretrained(directory)
    return model, directory


def hf_logits(model: transformers.GPT2LMHeadModel, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def test_a_saved_gpt2_loads_with_numpy_and_gives_transformers_logits(checkpoint):
    model, directory = checkpoint
    params, config = numpy_attn.load_hf_gpt2(directory)
    assert config == {
        "vocab_size": 53, "context_length": 20, "emb_dim": 24, "n_heads": 3, "n_layers": 2,
        "drop_rate": 0.0, "qkv_bias": True,
    }  # fmt: skip
    ids = token_ids(2, 20, config)
    expected = hf_logits(model, ids)
    assert compare_arrays("logits", expected, numpy_attn.gpt_model(params, ids, config)).ok
    assert compare_arrays("logits", expected, jax_attn.GPTModel.from_hf_gpt2(directory)(jnp.asarray(ids))).ok
    # lm_head is tied to wte: the file holds wte alone, the weights format both
    assert np.array_equal(params["out_head.weight"], params["tok_emb.weight"])


def test_an_untied_lm_head_is_read_from_the_file(tmp_path):
    model = hf_model(seed=1, tie_word_embeddings=False)
    model.save_pretrained(tmp_path)
    params, config = numpy_attn.load_hf_gpt2(tmp_path)
    assert not np.array_equal(params["out_head.weight"], params["tok_emb.weight"])
    ids = token_ids(1, 9, config)
    assert compare_arrays("logits", hf_logits(model, ids), numpy_attn.gpt_model(params, ids, config)).ok


@pytest.mark.parametrize("config", [TINY, TINY | {"qkv_bias": False}], ids=["qkv_bias", "no_qkv_bias"])
def test_a_written_checkpoint_loads_in_transformers_and_gives_torch_ref_logits(tmp_path, config):
    model = torch_model(config, seed=2)
    params = torch_ref.to_params(model)
    numpy_attn.save_hf_gpt2(tmp_path, params, config)
    ids = token_ids(2, 16, config)
    with torch.no_grad():
        expected = model(torch.tensor(ids)).numpy()
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    assert compare_arrays("logits", expected, hf_logits(hf, ids)).ok
    params_back, config_back = numpy_attn.load_hf_gpt2(tmp_path)
    assert config_back == config | {"qkv_bias": True}
    assert compare_arrays("logits", expected, numpy_attn.gpt_model(params_back, ids, config_back)).ok


def test_a_written_checkpoint_says_format_pt_as_transformers_4_requires(tmp_path):
    params = torch_ref.to_params(torch_model())
    numpy_attn.save_hf_gpt2(tmp_path, params, TINY)
    with safe_open(tmp_path / "model.safetensors", framework="numpy") as file:
        actual, names = file.metadata(), set(file.keys())
    assert actual["format"] == "pt"
    assert set(numpy_attn.load_weights(tmp_path / "model.safetensors")) == names  # the record still checks


def test_the_jax_model_writes_a_checkpoint_transformers_loads(checkpoint, tmp_path):
    model, directory = checkpoint
    jax_attn.GPTModel.from_hf_gpt2(directory).save_hf_gpt2(tmp_path)
    ids = token_ids(1, 20, {"vocab_size": 53})
    expected = hf_logits(model, ids)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    assert compare_arrays("logits", expected, hf_logits(hf, ids)).ok


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_a_folder_missing_a_file_is_refused(checkpoint, tmp_path, missing):
    _, directory = checkpoint
    for name in ("config.json", "model.safetensors"):
        if name != missing:
            (tmp_path / name).write_bytes((directory / name).read_bytes())
    with pytest.raises(ValueError, match=f"not a GPT-2 checkpoint folder: {missing} is missing"):
        numpy_attn.load_hf_gpt2(tmp_path)


def test_a_bert_checkpoint_is_refused(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    transformers.BertModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a 'bert' model, not 'gpt2'"):
        numpy_attn.load_hf_gpt2(tmp_path)
    with pytest.raises(ValueError, match="holds a 'bert' model"):
        jax_attn.GPTModel.from_hf_gpt2(tmp_path)


def _copy_with_config(directory, target, **changes):
    hf_config = json.loads((directory / "config.json").read_text()) | changes
    (target / "config.json").write_text(json.dumps(hf_config))
    (target / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())


def test_a_config_contradicting_the_weights_names_every_misfit(checkpoint, tmp_path):
    _, directory = checkpoint
    _copy_with_config(directory, tmp_path, n_layer=3, n_positions=32)
    with pytest.raises(
        ValueError, match=r"missing keys \['transformer\.h\.2\.attn.*mis-shaped keys: 'transformer\.wpe"
    ):
        numpy_attn.load_hf_gpt2(tmp_path)


def test_an_unsupported_setting_is_refused(checkpoint, tmp_path):
    _, directory = checkpoint
    _copy_with_config(directory, tmp_path, activation_function="relu")
    with pytest.raises(ValueError, match="activation_function='relu' is not supported"):
        numpy_attn.load_hf_gpt2(tmp_path)


def _with_config_bytes(directory, target, text):
    (target / "config.json").write_bytes(text)
    (target / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())


def _hf_config_bytes(directory, **changes):
    return json.dumps(json.loads((directory / "config.json").read_text()) | changes).encode()


CONFIG_FILES = {
    # config.json's bytes (from the saved folder's), the error, its text after the file's name
    "n_layer_1e9": (lambda d: _hf_config_bytes(d, n_layer=10**9), ValueError,
                    ": n_layer=1000000000 needs 12000000000 tensors (12 a block), more than the 10000 a "
                    "weight file holds"),
    "n_layer_float": (lambda d: _hf_config_bytes(d, n_layer=1.0), TypeError,
                      ": n_layer must be a positive int, got 1.0 (float)"),
    "n_head_zero": (lambda d: _hf_config_bytes(d, n_head=0), ValueError,
                    ": n_head must be a positive int, got 0"),
    "n_embd_string": (lambda d: _hf_config_bytes(d, n_embd="24"), TypeError,
                      ": n_embd must be a positive int, got '24' (str)"),
    "resid_pdrop_1.5": (lambda d: _hf_config_bytes(d, resid_pdrop=1.5), ValueError,
                        ": resid_pdrop must be in [0, 1), got 1.5"),
    "attn_pdrop_other": (lambda d: _hf_config_bytes(d, attn_pdrop=0.3), ValueError,
                         ": dropout rates {'resid_pdrop': 0.0, 'attn_pdrop': 0.3, 'embd_pdrop': 0.0} differ; "
                         "the book's GPT has one drop_rate for all three"),
    "n_head_5": (lambda d: _hf_config_bytes(d, n_head=5), ValueError,
                 ": n_embd=24 is not divisible by n_head=5"),
    "tie_word_embeddings_string": (lambda d: _hf_config_bytes(d, tie_word_embeddings="false"), TypeError,
                                   ": tie_word_embeddings must be a bool, got 'false' (str)"),
    "deeply_nested": (lambda d: b"[" * 100_000 + b"]" * 100_000, ValueError,
                      " is not valid JSON: nested too deeply"),
    "not_utf8": (lambda d: b'{"model_type": "gpt2", "a": "\xff"}', ValueError,
                 " is not valid JSON: 'utf-8' codec can't decode byte 0xff in position 29: invalid start "
                 "byte"),
    "over_1_mib": (lambda d: b'{"model_type": "gpt2", "notes": "' + b"x" * 2**20 + b'"}', ValueError,
                   " holds more than 1048576 bytes; a GPT-2 config.json holds about 1 kB"),
}  # fmt: skip


@pytest.mark.parametrize("text, error, message", CONFIG_FILES.values(), ids=CONFIG_FILES.keys())
@pytest.mark.parametrize(
    "load", [numpy_attn.load_hf_gpt2, lambda d: jax_attn.GPTModel.from_hf_gpt2(d)], ids=["numpy", "jax"]
)
def test_a_hostile_config_json_is_refused_quickly_naming_the_file_and_key(
    checkpoint, tmp_path, load, text, error, message
):
    """An untrusted folder's config.json: n_layer=10**9 listed 12e9 tensor names before any check
    (it never returned), a float size raised range()'s TypeError naming no key, deep nesting a
    RecursionError, bytes that are not UTF-8 a UnicodeDecodeError; the file was read whole."""
    _, directory = checkpoint
    _with_config_bytes(directory, tmp_path, text(directory))
    expected = f"^{re.escape(f'{tmp_path}/config.json{message}')}$"
    with within_cpu_seconds(1), pytest.raises(error, match=expected):
        load(tmp_path)


@pytest.mark.parametrize("name", ["n_head_5", "tie_word_embeddings_string"])
def test_a_config_json_error_comes_before_the_weights_are_read(checkpoint, tmp_path, name):
    """n_head not dividing n_embd was found only by the weights' check, after the whole
    model.safetensors was read, as "emb_dim=24 is not divisible by num_heads=5": here the file
    is not a weight file at all, and the config.json error is the one raised."""
    _, directory = checkpoint
    text, error, message = CONFIG_FILES[name]
    (tmp_path / "config.json").write_bytes(text(directory))
    (tmp_path / "model.safetensors").write_bytes(b"not a weight file")
    with pytest.raises(error, match=f"^{re.escape(f'{tmp_path}/config.json{message}')}$"):
        numpy_attn.load_hf_gpt2(tmp_path)


def test_an_untied_checkpoint_without_lm_head_is_refused(tmp_path):
    """config.json says tie_word_embeddings false and the file has no lm_head.weight: transformers
    reports the key missing (and draws the head at random); wte was loaded as the head, silently."""
    hf_model(seed=1).save_pretrained(tmp_path)  # tied: the file holds wte alone
    hf_config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf_config | {"tie_word_embeddings": False}))
    _, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == {"lm_head.weight"}
    message = f"params do not fit GPT-2 checkpoint {tmp_path}: missing keys ['lm_head.weight']"
    for load in (numpy_attn.load_hf_gpt2, jax_attn.GPTModel.from_hf_gpt2):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            load(tmp_path)


def test_writing_checks_the_weights_against_the_config_first(tmp_path):
    params = torch_ref.to_params(torch_model())
    del params["final_norm.shift"]
    with pytest.raises(ValueError, match=r"missing keys \['final_norm.shift'\]"):
        numpy_attn.save_hf_gpt2(tmp_path / "out", params, TINY)
    assert not os.path.exists(tmp_path / "out")  # nothing half-written


@pytest.mark.parametrize("bare_first", [False, True], ids=["bare_last", "bare_first"])
def test_one_weight_under_both_names_is_refused_naming_both(tmp_path, bare_first):
    """``wte.weight`` beside ``transformer.wte.weight``: not whichever comes last in the file."""
    numpy_attn.save_hf_gpt2(tmp_path, torch_ref.to_params(torch_model()), TINY)
    path = tmp_path / "model.safetensors"
    hf = numpy_attn.load_weights(path)
    bare = {"wte.weight": np.full_like(hf["transformer.wte.weight"], 7.0)}
    numpy_attn.save_weights(path, bare | hf if bare_first else hf | bare)
    first, second = sorted(["wte.weight", "transformer.wte.weight"], reverse=bare_first)
    message = (
        f"GPT-2 checkpoint {tmp_path} names one weight twice, with and without 'transformer.': "
        f"{first!r} and {second!r}"
    )
    for load in (numpy_attn.load_hf_gpt2, jax_attn.GPTModel.from_hf_gpt2):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            load(tmp_path)


def test_numpy_sizes_in_the_config_are_written_as_json_numbers(tmp_path):
    """The config check takes NumPy ints and floats: config.json gets plain ones (not a
    TypeError from json after the weights were written, leaving a truncated config.json)."""
    params = torch_ref.to_params(torch_model())
    config = TINY | {"vocab_size": np.int64(61), "n_layers": np.int32(2), "drop_rate": np.float64(0.0)}
    numpy_attn.save_hf_gpt2(tmp_path, params, config)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert (hf_config["vocab_size"], hf_config["n_layer"], hf_config["resid_pdrop"]) == (61, 2, 0.0)
    assert numpy_attn.load_hf_gpt2(tmp_path)[1] == TINY


def folder_state(directory) -> dict[str, bytes | str]:
    """Every entry under ``directory`` (hidden ones too): a file's bytes, a link's target."""
    return {
        str(path.relative_to(directory)): os.readlink(path) if path.is_symlink() else path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_symlink() or path.is_file()
    }


def loaded(directory):
    """What ``load_hf_gpt2`` reads from ``directory``, or the ValueError's text."""
    try:
        params, config = numpy_attn.load_hf_gpt2(directory)
    except ValueError as error:
        return str(error).replace(str(directory), "<folder>")
    return config, {name: value.tobytes() for name, value in params.items()}


FAILING = ("replace", "symlink", "mkdir", "link", "fsync")  # os's calls that change the disk


def failing_at(monkeypatch, index: int | None) -> list[str]:
    """``os``'s calls of ``FAILING`` and the weights' writes counted (their names listed, in order);
    the ``index``-th (from 0) raises ENOSPC, as a full disk would."""
    calls: list[str] = []

    def counted(name, function):
        def call(*args, **kwargs):
            calls.append(name)
            if len(calls) - 1 == index:
                raise OSError(28, "No space left on device")
            return function(*args, **kwargs)

        return call

    for name in FAILING:
        monkeypatch.setattr(os, name, counted(name, getattr(os, name)))
    save_file = numpy_attn.weights_file.safetensors.numpy.save_file
    monkeypatch.setattr(
        numpy_attn.weights_file.safetensors.numpy, "save_file", counted("save_file", save_file)
    )
    return calls


@pytest.mark.parametrize("earlier", ["saved", "plain_files", "empty"])
def test_a_save_failing_at_any_step_leaves_the_folder_loading_as_before_and_no_temporary(
    tmp_path, monkeypatch, earlier
):
    """A full disk at each step that changes the disk (each rename, link, folder, flush and the
    weights' write) of a save over an earlier save, over a folder of plain files (as transformers
    writes them) and into an empty folder: the folder loads what it loaded, holds no temporary, no
    version but the one it names, and the next save works."""
    params = torch_ref.to_params(torch_model())
    new = {k: v + 1 for k, v in params.items()}

    def prepare(folder):
        if earlier == "saved":
            numpy_attn.save_hf_gpt2(folder, params, TINY)
        elif earlier == "plain_files":
            numpy_attn.save_hf_gpt2(tmp_path / "source", params, TINY)
            folder.mkdir()
            for name in ("config.json", "model.safetensors"):
                (folder / name).write_bytes((tmp_path / "source" / name).read_bytes())
        else:
            folder.mkdir()

    counted = tmp_path / "counted"
    prepare(counted)
    before = loaded(counted)
    with monkeypatch.context() as patch:
        calls = failing_at(patch, None)
        numpy_attn.save_hf_gpt2(counted, new, TINY)  # the steps of the save
    after = loaded(counted)
    assert {"replace", "symlink", "mkdir", "fsync", "save_file"} <= set(calls), calls
    assert ("link" in calls) == (earlier == "plain_files"), calls  # the folder's files kept as they are
    switch = len(calls) - 1 - calls[::-1].index("replace")  # the last rename: the pointer's
    for index, step in enumerate(calls):
        folder = tmp_path / f"gpt2-{index}"
        prepare(folder)
        full = rf"^\[Errno 28\] No space left on device: '{re.escape(str(folder))}'$"
        with monkeypatch.context() as patch:
            failing_at(patch, index)
            if step == "link":  # as on a file system without hard links: the folder's file is copied
                numpy_attn.save_hf_gpt2(folder, new, TINY)
            else:
                with pytest.raises(OSError, match=full):
                    numpy_attn.save_hf_gpt2(folder, new, TINY)
        # until the switch fails the old checkpoint, once it is done (the folder's flush) the new one
        expected = before if index <= switch and step != "link" else after
        assert loaded(folder) == expected, (index, step)
        state = folder_state(folder)
        assert not [name for name in state if name.endswith(".tmp")], (index, step, sorted(state))
        versions = {name.split("/")[0] for name in state if name.startswith(".version-")}
        assert versions <= {state.get(".current")}, (index, step, sorted(state))
        numpy_attn.save_hf_gpt2(folder, new, TINY)  # and the next save works
        assert loaded(folder) == after


def test_a_bfloat16_checkpoint_loads_as_bfloat16_weights(tmp_path):
    """transformers saves a bfloat16 model as BF16 tensors: load_hf_gpt2 returns them as they are
    (ml_dtypes' bfloat16, what jax_attn computes in), save_hf_gpt2 writes them back, and
    transformers loads that folder as the same model."""
    import ml_dtypes

    model = hf_model(seed=3).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "hf")
    params, config = numpy_attn.load_hf_gpt2(tmp_path / "hf")
    assert {value.dtype for value in params.values()} == {np.dtype(ml_dtypes.bfloat16)}
    expected = model.transformer.wte.weight.detach().float().numpy()
    np.testing.assert_array_equal(params["tok_emb.weight"].astype(np.float32), expected)
    numpy_attn.save_hf_gpt2(tmp_path / "ours", params, config)
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours")
    assert back.transformer.wte.weight.dtype == torch.bfloat16
    ids = token_ids(1, 9, config)
    np.testing.assert_array_equal(hf_logits(back.float(), ids), hf_logits(model.float(), ids))


def test_a_bfloat16_checkpoint_loads_in_the_jax_model(tmp_path):
    """docs/hardening.md promises bfloat16 in jax_attn: GPTModel.from_hf_gpt2 refused such a folder."""
    model = hf_model(seed=3).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    ids = token_ids(1, 9, {"vocab_size": 53})
    actual = np.asarray(jax_attn.GPTModel.from_hf_gpt2(tmp_path)(jnp.asarray(ids)), np.float32)
    np.testing.assert_allclose(actual, hf_logits(model.float(), ids), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", [np.float32, np.bool_, np.uint8])
def test_leftover_attention_buffers_of_another_dtype_are_ignored_as_transformers_ignores_them(
    tmp_path, dtype
):
    """Older transformers saved each block's causal mask ``attn.bias`` (float32, later bool) and
    ``attn.masked_bias``; a float16 folder with them was refused for mixing dtypes."""
    model = hf_model(seed=4).half()
    model.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors.numpy.load_file(path)
    for index in range(2):
        tensors[f"transformer.h.{index}.attn.bias"] = np.tril(np.ones((20, 20), dtype))[None, None]
        tensors[f"transformer.h.{index}.attn.masked_bias"] = np.array(-1e4, np.float32)
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
    params, config = numpy_attn.load_hf_gpt2(tmp_path)
    assert {value.dtype for value in params.values()} == {np.dtype(np.float16)}
    assert not [
        name
        for name in params
        if "bias" in name and "att." in name and "W_" not in name and "out" not in name
    ]
    _, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]


def test_a_save_over_a_transformers_folder_loads_in_transformers_and_keeps_links(tmp_path):
    """The first save into a folder transformers wrote turns its two files into links through the
    folder's pointer (its content unchanged at each step), then switches to the new version."""
    hf_model(seed=5).save_pretrained(tmp_path)
    config = TINY
    model = torch_model(config, seed=6)
    numpy_attn.save_hf_gpt2(tmp_path, torch_ref.to_params(model), config)
    assert os.readlink(tmp_path / "config.json") == os.path.join(".current", "config.json")
    assert os.readlink(tmp_path / "model.safetensors") == os.path.join(".current", "model.safetensors")
    ids = token_ids(1, 9, config)
    with torch.no_grad():
        expected = model(torch.tensor(ids)).numpy()
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    assert compare_arrays("logits", expected, hf_logits(hf, ids)).ok
    assert len([entry for entry in os.listdir(tmp_path) if entry.startswith(".version-")]) == 1


def test_writing_where_no_folder_can_be_is_one_clear_error(tmp_path):
    """Onto a regular file, save_hf_gpt2 raised makedirs' FileExistsError; into /proc, a raw
    FileNotFoundError naming a temporary."""
    params = torch_ref.to_params(torch_model())
    (tmp_path / "file").write_bytes(b"mine")
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'file'))} is not a folder"):
        numpy_attn.save_hf_gpt2(tmp_path / "file", params, TINY)
    assert (tmp_path / "file").read_bytes() == b"mine"
    with pytest.raises(OSError, match=r"^\[Errno \d+\] .*: '/proc'$"):
        numpy_attn.save_hf_gpt2("/proc", params, TINY)
    with pytest.raises(
        OSError, match=f"^\\[Errno 2\\] No such file or directory: '{re.escape(str(tmp_path))}/no/w.npz'$"
    ):
        numpy_attn.save_weights(tmp_path / "no" / "w.npz", params)
