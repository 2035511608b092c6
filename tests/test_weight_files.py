"""Weight files: safetensors and .npz round trips, no pickle, clear errors for bad files."""

import base64
import json
import os
import re
import stat
import struct
import subprocess
import sys
import zlib

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch

import numpy_attn
from numpy_attn import load_weights, save_weights
from parity_tests.cases import FUNCTION_NAMES, Case
from torch_ref import load_params, to_params

FORMATS = [".safetensors", ".npz"]


def weights(layer="MultiHeadAttention", dtype="float32"):
    case = Case(layer, d_in=5, d_out=8, num_heads=2, bias=True, dtype=dtype)
    return case, to_params(case.build_torch())


@pytest.mark.parametrize("suffix", FORMATS)
@pytest.mark.parametrize("layer", list(FUNCTION_NAMES))
def test_round_trip_every_layer(tmp_path, suffix, layer):
    case, params = weights(layer, "float64")
    path = tmp_path / f"w{suffix}"
    save_weights(path, params)
    loaded = load_weights(path, layer=layer, num_heads=2)
    assert list(loaded) == list(params)
    for name, value in params.items():
        assert loaded[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded[name], value)
    module = load_params(case.with_(seed=9).build_torch(), loaded)
    x = torch.from_numpy(case.make_input())
    assert torch.equal(module(x), case.build_torch()(x))


@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
def test_safetensors_dtypes_round_trip(tmp_path, dtype):
    _, params = weights(dtype=dtype)
    save_weights(tmp_path / "w.safetensors", params)
    loaded = load_weights(tmp_path / "w.safetensors", dtype=params["W_query.weight"].dtype)
    for name, value in params.items():
        np.testing.assert_array_equal(loaded[name].view(np.uint16), value.view(np.uint16))


def test_files_are_interchangeable_with_the_safetensors_library(tmp_path):
    _, params = weights()
    save_weights(tmp_path / "ours.safetensors", params)
    theirs = safetensors.numpy.load_file(tmp_path / "ours.safetensors")
    assert set(theirs) == set(params) and all(np.array_equal(theirs[k], params[k]) for k in params)
    safetensors.numpy.save_file(params, tmp_path / "theirs.safetensors")
    ours = load_weights(tmp_path / "theirs.safetensors", layer="MultiHeadAttention", num_heads=2)
    assert all(np.array_equal(ours[k], params[k]) for k in params)


def test_npz_is_loaded_without_pickle(tmp_path):
    np.savez(tmp_path / "w.npz", W_query=np.array([object()], dtype=object))
    with pytest.raises(TypeError, match=r"has dtype object \(loading it would need pickle\)"):
        load_weights(tmp_path / "w.npz")


@pytest.mark.parametrize("suffix", FORMATS)
def test_truncated_files_are_refused(tmp_path, suffix):
    _, params = weights()
    path = tmp_path / f"w{suffix}"
    save_weights(path, params)
    blob = path.read_bytes()
    for length in (4, len(blob) // 2, len(blob) - 1):
        path.write_bytes(blob[:length])
        with pytest.raises(ValueError, match=r"truncated|not a readable \.npz|not safetensors"):
            load_weights(path)


def test_altered_safetensors_data_is_detected(tmp_path):
    _, params = weights()
    path = tmp_path / "w.safetensors"
    save_weights(path, params)
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 0x01  # one bit of the last weight
    path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"was altered: .* do not match the SHA-256 recorded"):
        load_weights(path)


def test_altered_npz_data_is_detected(tmp_path):
    _, params = weights()
    path = tmp_path / "w.npz"
    save_weights(path, params)
    blob = bytearray(path.read_bytes())
    position = blob.index(b"NUMPY") + 200  # inside the first member's data
    blob[position] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"not a readable \.npz weight file: .*CRC"):
        load_weights(path)


def test_bytes_appended_to_a_saved_npz_are_detected(tmp_path):
    """zipfile still finds the archive and its digest comment before them; the record says the file
    ends with that comment."""
    _, params = weights()
    path = tmp_path / "w.npz"
    save_weights(path, params)
    path.write_bytes(path.read_bytes() + b"appended")
    with pytest.raises(ValueError, match=r"was altered: .* do not match the SHA-256 recorded"):
        load_weights(path)


def last_tensor(header):
    """The name of the tensor whose data the file holds last."""
    return max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])


def rewrite_header(path, change):
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + size])
    change(header)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + blob[8 + size :])


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda h: h["W_query.weight"].update(shape=[8, 6]),
            r"'W_query.weight' \(F32, shape \(8, 6\)\) has data offsets",
        ),
        (
            lambda h: h["W_key.weight"].update(data_offsets=[0]),
            r"'W_key.weight' has invalid data_offsets \[0\]",
        ),
        (lambda h: h.pop(last_tensor(h)), r"the header describes \d+ data bytes, the file holds \d+"),
    ],
    ids=["shape", "offsets", "missing_entry"],
)
def test_tampered_headers_give_clear_errors(tmp_path, change, message):
    _, params = weights()
    path = tmp_path / "w.safetensors"
    save_weights(path, params)
    rewrite_header(path, change)
    with pytest.raises(ValueError, match=message):
        load_weights(path)


def test_header_that_is_not_json(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", 4) + b"{oops")
    with pytest.raises(ValueError, match="corrupt safetensors header"):
        load_weights(path)


def test_weights_are_checked_against_the_target_class(tmp_path):
    _, params = weights()
    del params["W_value.bias"]
    params["W_key.weight"] = params["W_key.weight"][:, :4]
    save_weights(tmp_path / "w.safetensors", params)
    message = r"missing keys \['W_value.bias'\]; mis-shaped keys: 'W_key.weight' has shape \(8, 4\)"
    with pytest.raises(ValueError, match=message):
        load_weights(tmp_path / "w.safetensors", layer="MultiHeadAttention", num_heads=2)
    _, params = weights()
    save_weights(tmp_path / "w.npz", params)
    with pytest.raises(TypeError, match=r"holds dtypes \['float32'\], expected float64"):
        load_weights(tmp_path / "w.npz", dtype=np.float64)
    params["W_key.weight"] = params["W_key.weight"].astype(np.float64)
    with pytest.raises(TypeError, match=r"params mix dtypes \['float32', 'float64'\]"):
        save_weights(tmp_path / "mixed.npz", params)
    np.savez(tmp_path / "mixed.npz", **params)
    with pytest.raises(TypeError, match="mixes dtypes"):
        load_weights(tmp_path / "mixed.npz")


def test_non_finite_weights_and_wrong_suffix_are_refused(tmp_path):
    _, params = weights()
    params["Wo.weight"] = np.full((2, 2), np.nan, np.float32)
    with pytest.raises(ValueError, match=r"params\['Wo.weight'\] has non-finite values"):
        save_weights(tmp_path / "w.safetensors", params)
    safetensors.numpy.save_file(params, tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match=r"params\['Wo.weight'\] has non-finite values"):
        load_weights(tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match=r"weight files are \.safetensors or \.npz"):
        save_weights(tmp_path / "w.pt", params)
    with pytest.raises(TypeError, match="has dtype int64"):
        save_weights(tmp_path / "w.npz", {"W": np.zeros(2, np.int64)})


def test_bfloat16_needs_ml_dtypes_only_when_present(tmp_path):
    """numpy_attn does not import ml_dtypes: a bfloat16 file loads where it is loaded (by jax or
    torch_ref), and is refused with how to read it where it is not."""
    path = tmp_path / "w.safetensors"
    save_weights(path, {"W": np.ones(2, ml_dtypes.bfloat16)})
    assert load_weights(path)["W"].dtype == np.dtype(ml_dtypes.bfloat16)
    script = (
        "import sys, numpy_attn; assert 'ml_dtypes' not in sys.modules; numpy_attn.load_weights(sys.argv[1])"
    )
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"TypeError: {path} holds bfloat16 weights: import ml_dtypes (or jax) to read them"
    )


@pytest.mark.parametrize(
    "dtype, given",
    [(torch.float32, "torch.float32"), ("bogus", "'bogus'"), (int, "int64"), ("bool", "bool")],
)
def test_load_weights_checks_its_dtype_argument_as_init_kv_cache_does(tmp_path, dtype, given):
    """NumPy's raw "Cannot interpret" / "not understood" errors before, and a non-floating dtype
    blamed on the file ("holds dtypes ['float32'], expected int64"): init_kv_cache's TypeError now."""
    save_weights(tmp_path / "w.npz", {"W": np.ones((2, 2), np.float32)})
    message = f"dtype must be a floating dtype (float16, float32, float64; bfloat16 in jax_attn), got {given}"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        load_weights(tmp_path / "w.npz", dtype=dtype)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        numpy_attn.init_kv_cache(1, 1, 2, 2, dtype)
    big_endian = "dtype is >f4, big-endian; give it in the machine's byte order: np.float32"
    with pytest.raises(TypeError, match=f"^{re.escape(big_endian)}$"):
        load_weights(tmp_path / "w.npz", dtype=np.dtype(">f4"))
    assert load_weights(tmp_path / "w.npz", dtype="float32")["W"].dtype == np.float32


@pytest.mark.parametrize("suffix", FORMATS)
def test_a_save_replaces_the_target_of_a_link_and_keeps_a_files_permissions(tmp_path, suffix):
    """The link stays a link, its target gets the new content; an existing file keeps its mode."""
    _, params = weights()
    target, link = tmp_path / f"target{suffix}", tmp_path / f"link{suffix}"
    save_weights(target, {"W": np.ones(2, np.float32)})
    target.chmod(0o640)
    link.symlink_to(target.name)
    save_weights(link, params)
    assert link.is_symlink() and os.readlink(link) == target.name
    assert list(load_weights(target)) == list(params) and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([target.name, link.name])


@pytest.mark.parametrize("suffix", FORMATS)
def test_a_save_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, suffix):
    _, params = weights()
    path = tmp_path / f"w{suffix}"
    save_weights(path, params)
    before = path.read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(numpy_attn.weights_file.safetensors.numpy, "save_file", interrupted)
    monkeypatch.setattr(numpy_attn.weights_file.np.lib.format, "write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_weights(path, {name: value + 1 for name, value in params.items()})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


# written by ac36c62's save_weights (its own writer), zlib-compressed, base64:
# {"W": np.arange(6).reshape(2, 3), "b": [0.5, -1.5]} (float32)
EARLIER_FILES = {
    ".safetensors": (
        "eNp9UEFqw0AMTH/QJwSdl7LR7sohl/bUL+QQm2XlXdMSkphYFxMMeUp/0jwtcnproUIjkDQzAj0/LR5xgS1sLpBl7Ats4N0h"
        "GBg+0tzt0LjGQE6S4qnrhiKDDq1B30wG+B/dXxV643CWxXgokh7bODt0p/MhiVr0og5J5Bj7dP6U8WVfRlXCroZtDWZZA9fQ"
        "/OLoRQykrIpD4VIcl5a4zZYzBmbKlHFFjC1W6K0n31JFtO7IOo/B+pUPvMZQEUzTco6fr1xftbxpKq6KL8VCZ7fvOwQNVg8="
    ),
    ".npz": (
        "eNqtks9LwzAUx7vNedjV3a29VKVI0iZdO4TtJMhQe5EhIiXNDxRlG+0UyhzM2+5ePHrzH/DmQf8WBcGD/4OvzDE2HIjzJd/k"
        "5fEe+ZC8oFFYKmsjW9MOPrTNO/AyFUHNrVYnvd0/3AuOctqV1jOFTHhsVnVzWxHT0k3Vjrsxa4XtWMgsvsMuEgnx5JR1JJzX"
        "bUt3Niy9r//ZSiO4QQ2WOkzQAHRfD6bQb97fVofgDb/Ro39AXwx8hA7YL8/TqLuPtc9X8DKtgMKQdbutsMPis24ahnPBry/x"
        "r8B9b1HyUs84l2liVPVjo2lYuhEZJ7DCDTZ1IWpQJhThShIkIsQoQVIJEanIk46vHEEjHBGPMkixK9LFVCBMmfQ9hBn3uaOM"
        "ftDI5cuF+a03tkFOGzfibMnsl09KnsYNMFsy+/STEpX78SOCRnE5SyjAeIA9zWddGDGXI4eqimdjgW14BiQwdj2JEXGIj11h"
        "C1s5yJecEk95rMIp9ylTmCNMGPoCYZG41w=="
    ),
}


@pytest.mark.parametrize("suffix", FORMATS)
def test_files_written_before_the_formats_libraries_still_load_and_refuse_a_change(tmp_path, suffix):
    """The integrity record is computed as before: earlier files load exactly, a changed bit is refused."""
    blob = zlib.decompress(base64.b64decode(EARLIER_FILES[suffix]))
    path = tmp_path / f"w{suffix}"
    path.write_bytes(blob)
    loaded = load_weights(path)
    assert list(loaded) == ["W", "b"]
    np.testing.assert_array_equal(loaded["W"], np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(loaded["b"], np.float32([0.5, -1.5]))
    path.write_bytes(blob[:-2] + bytes([blob[-2] ^ 1]) + blob[-1:])
    with pytest.raises(ValueError, match=r"was altered|CRC"):
        load_weights(path)
