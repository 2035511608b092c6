"""A catalogue of hostile weight files: each ends, within seconds, with a ValueError or a
TypeError that names the problem, never another exception, a hang or different arrays."""

import hashlib
import io
import json
import os
import struct
import threading
import warnings
import zipfile

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch

from numpy_attn import load_weights, save_weights

W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([0.5, -1.5], np.float32)


def safetensors_file(header, data=b"", raw=None):
    """A safetensors file with this header (a dict dumped as JSON, or the raw bytes ``raw``)."""
    encoded = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def entry(shape=(2, 3), offsets=(0, 24), dtype="F32"):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def npy(array):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def npz_file(members, compression=zipfile.ZIP_STORED):
    """A zip of ``(name, bytes)`` members, duplicates allowed."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about duplicate names
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def set_central_field(blob, offset_in_entry, fmt, value, member=0):
    """Patch a field of the ``member``-th central directory entry."""
    blob = bytearray(blob)
    start = -1
    for _ in range(member + 1):
        start = blob.index(b"PK\x01\x02", start + 1)
    struct.pack_into(fmt, blob, start + offset_in_entry, value)
    return bytes(blob)


def npy_with_header(header_text, data=b""):
    header = header_text.encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


DATA = W.tobytes() + B.tobytes()
SAFETENSORS = {
    # header JSON of any depth or shape
    "deeply_nested_json": (
        safetensors_file(None, raw=b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ValueError,
        "corrupt safetensors header: nested too deeply",
    ),
    "header_is_a_list": (safetensors_file(None, raw=b"[1, 2]"), ValueError, r"does not start with '\{'"),
    "header_in_utf16": (
        safetensors_file(None, raw='{"a": 1}'.encode("utf-16")),
        ValueError,
        "corrupt safetensors header",
    ),
    "header_size_2_to_the_64": (
        struct.pack("<Q", 2**64 - 1) + b"{}",
        ValueError,
        "its header claims 18446744073709551615 bytes",
    ),
    "integer_of_5000_digits": (
        safetensors_file(
            None, raw=b'{"W": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}'
        ),
        ValueError,
        "corrupt safetensors header",
    ),
    # metadata of any type
    "metadata_a_list": (
        safetensors_file({"__metadata__": [1, 2]}),
        ValueError,
        "__metadata__ must map str to str",
    ),
    "metadata_a_number": (
        safetensors_file({"__metadata__": 3}),
        ValueError,
        "__metadata__ must map str to str",
    ),
    "metadata_nested": (
        safetensors_file({"__metadata__": {"a": {"b": 1}}}),
        ValueError,
        "__metadata__ must map str to str",
    ),
    # entries, names, dtypes, shapes
    "entry_a_number": (safetensors_file({"W": 5}), ValueError, r"tensor 'W' must be an object with dtype"),
    "entry_with_extra_field": (
        safetensors_file({"W": {**entry(), "extra": 1}}, W.tobytes()),
        ValueError,
        "must be an object with dtype",
    ),
    "dtype_a_list": (
        safetensors_file({"W": entry(dtype=["F32"])}, W.tobytes()),
        TypeError,
        "unsupported dtype",
    ),
    "dtype_int64": (
        safetensors_file({"W": entry(dtype="I64", offsets=(0, 48))}, bytes(48)),
        TypeError,
        "'I64'",
    ),
    "dtype_bool": (
        safetensors_file({"W": entry(dtype="BOOL", offsets=(0, 6))}, bytes(6)),
        TypeError,
        "'BOOL'",
    ),
    "dtype_complex": (
        safetensors_file({"W": entry(dtype="C64", offsets=(0, 48))}, bytes(48)),
        TypeError,
        "'C64'",
    ),
    "shape_of_bools": (
        safetensors_file({"W": entry(shape=(True, 3))}, W.tobytes()),
        ValueError,
        "invalid shape",
    ),
    "shape_negative": (
        safetensors_file({"W": entry(shape=(-2, -3))}, W.tobytes()),
        ValueError,
        "invalid shape",
    ),
    "shape_float": (safetensors_file({"W": entry(shape=(2.0, 3))}, W.tobytes()), ValueError, "invalid shape"),
    "shape_a_string": (safetensors_file({"W": {**entry(), "shape": "2,3"}}), ValueError, "invalid shape"),
    "shape_of_rank_100": (
        safetensors_file({"W": entry(shape=(1,) * 100, offsets=(0, 4))}, bytes(4)),
        ValueError,
        "invalid shape",
    ),
    "shape_of_2_to_the_62": (
        safetensors_file({"W": entry(shape=(2**62, 2**62))}, W.tobytes()),
        ValueError,
        "do not fit its size",
    ),
    # offsets and lengths
    "offsets_huge": (
        safetensors_file({"W": entry(shape=(2**40,), offsets=(0, 2**42))}, W.tobytes()),
        ValueError,
        "is truncated",
    ),
    "offsets_negative": (
        safetensors_file({"W": entry(offsets=(-24, 0))}, W.tobytes()),
        ValueError,
        "data_offsets",
    ),
    "offsets_overlap": (
        safetensors_file({"W": entry(), "V": entry()}, W.tobytes()),
        ValueError,
        "follow the previous tensor",
    ),
    "offsets_with_a_gap": (
        safetensors_file({"W": entry(offsets=(8, 32))}, bytes(8) + W.tobytes()),
        ValueError,
        "follow the previous",
    ),
    "offsets_of_three": (
        safetensors_file({"W": entry(offsets=(0, 12, 24))}),
        ValueError,
        "invalid data_offsets",
    ),
    "trailing_bytes": (
        safetensors_file({"W": entry()}, W.tobytes() + b"x"),
        ValueError,
        "has trailing bytes",
    ),
    # duplicate names
    "duplicate_names": (
        safetensors_file(
            None,
            raw=b'{"W": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
            b'"W": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
            data=bytes(8),
        ),
        ValueError,
        r"duplicate names in the header: \['W'\]",
    ),
}

NPZ = {
    "duplicate_members": (
        npz_file([("W.npy", npy(W)), ("W.npy", npy(2 * W))]),
        ValueError,
        r"duplicate members \['W.npy'\]",
    ),
    "member_not_npy": (
        npz_file([("W.npy", npy(W)), ("notes.txt", b"hi")]),
        ValueError,
        "is not a .npy array",
    ),
    "member_encrypted": (
        set_central_field(npz_file([("W.npy", npy(W))]), 8, "<H", 0x1),
        ValueError,
        "is encrypted",
    ),
    "member_bzip2": (npz_file([("W.npy", npy(W))], zipfile.ZIP_BZIP2), ValueError, "not stored/deflated"),
    "member_claims_a_terabyte": (
        set_central_field(npz_file([("W.npy", npy(W))], zipfile.ZIP_DEFLATED), 24, "<I", 2**32 - 1),
        ValueError,
        "claims 4294967295 bytes",
    ),
    "npy_shape_of_2_to_the_40": (
        npz_file(
            [("W.npy", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2**40,), }"))]
        ),
        ValueError,
        "corrupt .npy header",
    ),
    "npy_huge_shape": (
        npz_file(
            [
                (
                    "W.npy",
                    npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }"),
                )
            ]
        ),
        ValueError,
        r"shape \(1099511627776,\)\) holds 0 bytes",
    ),
    "npy_too_few_bytes": (npz_file([("W.npy", npy(W)[:-4])]), ValueError, r"holds 20 bytes of data"),
    "npy_deep_header": (
        npz_file([("W.npy", npy_with_header("{'descr': " + "[" * 3000 + "]" * 3000 + "}"))]),
        ValueError,
        "corrupt .npy header",
    ),
    "npy_version_9": (
        npz_file([("W.npy", b"\x93NUMPY\x09\x00" + bytes(8))]),
        ValueError,
        "corrupt .npy header",
    ),
    "npy_object": (npz_file([("W.npy", npy(np.array([{}], dtype=object)))]), TypeError, "would need pickle"),
    "npy_int64": (npz_file([("W.npy", npy(np.arange(3)))]), TypeError, "has dtype int64"),
    "npy_bool": (npz_file([("W.npy", npy(np.ones(3, bool)))]), TypeError, "has dtype bool"),
    "npy_complex": (npz_file([("W.npy", npy(np.ones(3, complex)))]), TypeError, "has dtype complex128"),
    "npy_structured": (npz_file([("W.npy", npy(np.zeros(3, "f4,f4")))]), TypeError, "has dtype"),
    "not_a_zip": (b"PK\x03\x04" + bytes(40), ValueError, "not a readable .npz weight file"),
}


def check_refused(path, error, message):
    with pytest.raises(error, match=message):
        load_weights(path)


@pytest.mark.parametrize("blob, error, message", SAFETENSORS.values(), ids=SAFETENSORS.keys())
def test_hostile_safetensors(tmp_path, blob, error, message):
    path = tmp_path / "w.safetensors"
    path.write_bytes(blob)
    check_refused(path, error, message)


@pytest.mark.parametrize("blob, error, message", NPZ.values(), ids=NPZ.keys())
def test_hostile_npz(tmp_path, blob, error, message):
    path = tmp_path / "w.npz"
    path.write_bytes(blob)
    check_refused(path, error, message)


def test_big_endian_and_fortran_npz_load_as_native_arrays_with_the_same_values(tmp_path):
    """Decision: big-endian floats are accepted (the values are exact), returned native."""
    path = tmp_path / "w.npz"
    path.write_bytes(npz_file([("W.npy", npy(W.astype(">f4"))), ("V.npy", npy(np.asfortranarray(W)))]))
    loaded = load_weights(path)
    assert loaded["W"].dtype == np.float32 and loaded["W"].dtype.isnative
    np.testing.assert_array_equal(loaded["W"], W)
    np.testing.assert_array_equal(loaded["V"], W)
    np.savez_compressed(path, W=W)  # deflated members load too
    np.testing.assert_array_equal(load_weights(path)["W"], W)


def rewrite_safetensors_header(path, change):
    """Apply ``change`` to the parsed header and write it back, sizes kept consistent."""
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = change(json.loads(blob[8 : 8 + size]))
    path.write_bytes(safetensors_file(header, blob[8 + size :]))


@pytest.mark.parametrize("change", ["names", "offsets"])
def test_safetensors_header_mapping_the_right_bytes_to_the_wrong_names_is_detected(tmp_path, change):
    """Swap two same-shaped entries' names or offsets in a saved file: the JSON and the data
    are consistent, only the record (which covers names and offsets) shows the change."""
    path = tmp_path / "w.safetensors"
    save_weights(path, {"a": W, "b": 2 * W})
    if change == "names":
        rewrite_safetensors_header(
            path, lambda h: {"b": h["a"], "a": h["b"], "__metadata__": h["__metadata__"]}
        )
    else:
        rewrite_safetensors_header(path, lambda h: {**h, "a": h["b"], "b": h["a"]})
    with pytest.raises(ValueError, match="was altered"):
        load_weights(path)


def test_npz_members_renamed_are_detected(tmp_path):
    """Swap two members' names and recompute the zip's own checks and the comment's digest:
    the reserved member's record (key list and digest of names and data) still tells."""
    path = tmp_path / "w.npz"
    save_weights(path, {"a": W, "b": 2 * W})
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    members["a.npy"], members["b.npy"] = members["b.npy"], members["a.npy"]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.comment = b"0" * 64
    blob = buffer.getvalue()[:-64]
    blob += hashlib.sha256(blob).hexdigest().encode()
    path.write_bytes(blob)
    with pytest.raises(ValueError, match="was altered"):
        load_weights(path)


# ------------------------------------------------------------------ the file's kind


def load_in_thread(path):
    """Load ``path`` in a thread; return the exception it raised (fails if it blocks for 10 s)."""
    outcome = []

    def run():
        try:
            load_weights(path)
        except BaseException as error:  # the test inspects it
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive() and os.path.exists(path):  # unblock a reader stuck on a FIFO
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert not thread.is_alive() and outcome, "loading hung or returned"
    return outcome[0]


@pytest.mark.parametrize("kind", ["fifo", "link_to_fifo", "link_to_dev_zero", "directory"])
def test_files_that_are_not_regular_are_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "w.safetensors"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_fifo":
        os.mkfifo(tmp_path / "pipe")
        path.symlink_to(tmp_path / "pipe")
    elif kind == "link_to_dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    error = load_in_thread(path)
    assert isinstance(error, ValueError) and "is not a regular file" in str(error)


# ------------------------------------------------------------------ saving refuses


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"__metadata__": W}, ValueError, "reserved"),
        ({"__attn_parity__": W}, ValueError, "reserved"),
        ({"a\0b": W}, ValueError, "NUL"),
        ({"W": np.float32(1.0)}, ValueError, r"params\['W'\] is 0-d"),
        ({1: W}, TypeError, "params keys must be str, got 1"),
        ({}, ValueError, "params is empty"),
        ({"W": np.arange(3)}, TypeError, "has dtype int64"),
        ({"W": np.ones(3, bool)}, TypeError, "has dtype bool"),
        ({"W": np.ones(3, complex)}, TypeError, "has dtype complex128"),
        ({"W": np.array([1.0, None])}, TypeError, "has dtype object"),
        ({"W": W, "B": B.astype(np.float64)}, TypeError, "mix dtypes"),
        ({"W": [1.0, 2.0]}, TypeError, r"params\['W'\] must be an array, got list"),
        ({"W": torch.ones(2, requires_grad=True)}, TypeError, r"is a torch.Tensor with dtype torch.float32"),
        ([("W", W)], TypeError, "params must be a mapping"),
    ],
    ids=["metadata", "attn_parity", "nul", "0d", "int_key", "empty", "int64", "bool", "complex", "object",
         "mixed", "list", "torch", "not_a_mapping"],
)  # fmt: skip
def test_saving_refuses_what_cannot_round_trip(tmp_path, suffix, params, error, message):
    path = tmp_path / f"w{suffix}"
    with pytest.raises(error, match=message):
        save_weights(path, params)
    assert not path.exists()


def test_bfloat16_is_safetensors_only(tmp_path):
    params = {"W": W.astype(ml_dtypes.bfloat16)}
    with pytest.raises(ValueError, match=r"bfloat16, which \.npz cannot hold"):
        save_weights(tmp_path / "w.npz", params)
    save_weights(tmp_path / "w.safetensors", params)
    actual = load_weights(tmp_path / "w.safetensors")["W"]
    np.testing.assert_array_equal(actual.view(np.uint16), params["W"].view(np.uint16))


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_big_endian_weights_are_saved_little_endian_and_load_native(tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    save_weights(path, {"W": W.astype(">f8")})
    actual = load_weights(path)["W"]
    assert actual.dtype == np.float64 and actual.dtype.isnative
    np.testing.assert_array_equal(actual, W)


def test_files_written_by_the_safetensors_library_still_load(tmp_path):
    """Foreign files carry no record: checked structurally, loaded as they are."""
    expected = {"W": W, "B": B}
    safetensors.numpy.save_file(expected, tmp_path / "w.safetensors", metadata={"format": "pt"})
    actual = load_weights(tmp_path / "w.safetensors")
    assert set(actual) == set(expected) and all(np.array_equal(actual[k], expected[k]) for k in expected)
