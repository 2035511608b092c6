"""A catalogue of hostile weight files: each ends, within seconds, with a ValueError or a
TypeError that names the problem, never another exception, a hang or different arrays."""

import hashlib
import io
import json
import os
import re
import struct
import threading
import tracemalloc
import warnings
import zipfile

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch

from numpy_attn import file_checks, gpt_param_shapes, load_hf_gpt2, load_weights, save_hf_gpt2, save_weights
from tests.cpu_time import within_cpu_seconds

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
    "shape_zero_by_2_to_the_80": (
        safetensors_file({"W": entry(shape=(0, 2**40, 2**40), offsets=(0, 0))}),
        ValueError,
        r"tensor 'W' has an invalid shape \[0, 1099511627776, 1099511627776\]",
    ),
    "shape_of_2_to_the_62": (
        safetensors_file({"W": entry(shape=(2**62, 2**62))}, W.tobytes()),
        ValueError,
        "invalid shape",
    ),
    "shape_of_2_to_the_50": (
        safetensors_file({"W": entry(shape=(2**30, 2**20))}, W.tobytes()),
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
    "npy_zero_by_2_to_the_80": (
        npz_file(
            [
                (
                    "W.npy",
                    npy_with_header(
                        f"{{'descr': '<f4', 'fortran_order': False, 'shape': (0, {2**40}, {2**40}), }}"
                    ),
                )
            ]
        ),
        ValueError,
        r"corrupt .npy header: invalid shape \(0, 1099511627776, 1099511627776\)",
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
    "npy_negative_shape": (
        npz_file(
            [("W.npy", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, -3), }"))]
        ),
        ValueError,
        r"corrupt .npy header: invalid shape \(-2, -3\)",
    ),
    "member_name_not_utf8": (
        set_central_field(  # the name's bytes are not UTF-8, and its flag says they are
            npz_file([("W-.npy", npy(W))]).replace(b"W-.npy", b"W\xff.npy"), 8, "<H", 0x800
        ),
        ValueError,
        "not a readable .npz weight file: 'utf-8' codec can't decode",
    ),
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


def raised_in_thread(call, path, *, reading):
    """Run ``call()`` in a thread; return the exception it raised (fails if it blocks for 10 s or
    returns). A call stuck on the FIFO at ``path`` is let go by opening the FIFO's other end: for
    writing where the call reads (``reading``), for reading where it writes."""
    outcome = []

    def run():
        try:
            call()
        except BaseException as error:  # the test inspects it
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive() and os.path.exists(path):  # unblock a call stuck on a FIFO
        if reading:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        else:
            with open(path, "rb") as reader:
                reader.read()
    assert not thread.is_alive() and outcome, "the call hung or returned"
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
    error = raised_in_thread(lambda: load_weights(path), path, reading=True)
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
        ({1: W}, TypeError, r"params must be a mapping of str to arrays, got key 1 \(int\)"),
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


# ------------------------------------------------------------------ 0-d arrays from elsewhere


def test_0d_arrays_from_elsewhere_load_as_they_are(tmp_path):
    """Decision: save_weights refuses 0-d arrays (weights have an axis), but a file from
    elsewhere may hold one (np.savez of a NumPy scalar, the library's shape [], the 0-d
    ``attn.masked_bias`` of old GPT-2 checkpoints): it loads exactly, as shape ()."""
    np.savez(tmp_path / "w.npz", W=np.float32(3), V=np.float32([1, 2]))
    safetensors.numpy.save_file({"W": np.array(3, np.float32)}, tmp_path / "w.safetensors")
    for path in (tmp_path / "w.npz", tmp_path / "w.safetensors"):
        loaded = load_weights(path)["W"]
        assert loaded.shape == () and loaded.dtype == np.float32 and loaded == 3
    assert safetensors.numpy.load_file(tmp_path / "w.safetensors")["W"].shape == ()  # as the library reads it
    assert load_weights(tmp_path / "w.npz")["V"].shape == (2,)


# ------------------------------------------------------------------ sizes: checked before the data


def refused_quickly(path, message):
    """Load ``path``: it must be refused with ``message``, in well under a second, and without
    reading the data it claims (the memory the loader allocates stays under 1 MiB)."""
    tracemalloc.start()
    try:
        with within_cpu_seconds(1), pytest.raises(ValueError, match=message):
            load_weights(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak


def sparse_file(path, size, head=b"", tail=b""):
    """A file of ``size`` bytes, ``head`` and ``tail`` around a hole (which costs no disk)."""
    with open(path, "wb") as file:
        file.write(head)
        file.truncate(size - len(tail))
        file.seek(0, os.SEEK_END)
        file.write(tail)
    assert os.path.getsize(path) == size


GiB = 2**30


def eocd(entries, directory_size, directory_offset):
    """A zip's end of central directory record."""
    return struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, entries, entries, directory_size, directory_offset, 0)


@pytest.mark.parametrize(
    "name, head, tail, message",
    [
        ("w.safetensors", b"", b"", r"does not start with '\{'"),
        ("w.safetensors", safetensors_file({"W": entry()}), b"",
         r"has trailing bytes: the header describes 24 data bytes, the file holds 4294967223 "
         r"\(4294967296 bytes in all, 97 expected\)"),
        ("w.npz", b"", b"", "not a readable .npz weight file"),
        ("w.npz", b"", eocd(1, 4 * GiB - 23, 0), "a zip directory of 4294967273 bytes, more than"),
    ],
    ids=["zeros", "header_of_one_tensor", "npz_zeros", "npz_directory_of_4_gib"],
)  # fmt: skip
def test_a_4_gib_sparse_file_is_refused_before_its_data_is_read(tmp_path, name, head, tail, message):
    """Only the size field, the header or the zip directory are read before the sizes they
    declare are checked against the file's size (the whole file was read first: 20 s here)."""
    sparse_file(tmp_path / name, 4 * GiB, head, tail)
    refused_quickly(tmp_path / name, message)


@pytest.mark.parametrize(
    "data, message",
    [
        (W.tobytes() + b"x", r"has trailing bytes: the header describes 24 data bytes, the file holds 25 "
                             r"\(98 bytes in all, 97 expected\)"),
        (W.tobytes()[:-1], r"is truncated: the header describes 24 data bytes, the file holds 23 "
                           r"\(96 bytes in all, 97 expected\)"),
    ],
    ids=["longer", "shorter"],
)  # fmt: skip
def test_a_file_longer_or_shorter_than_its_header_declares_is_refused_naming_the_sizes(
    tmp_path, data, message
):
    path = tmp_path / "w.safetensors"
    path.write_bytes(safetensors_file({"W": entry()}, data))
    check_refused(path, ValueError, message)


def test_an_npz_member_claiming_more_than_its_npy_header_is_refused_without_inflating_it(tmp_path):
    """A zip bomb: 16 MiB of zeros after a (2, 3) array, deflated to a few dozen kB; the npy
    header says 24 bytes of data, so the member is refused before it is inflated."""
    path = tmp_path / "w.npz"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        archive.writestr("W.npy", npy(W) + bytes(16 * 2**20))
    path.write_bytes(buffer.getvalue())
    refused_quickly(path, r"member 'W.npy' \(float32, shape \(2, 3\)\) holds 16777240 bytes of data")


def test_npz_members_that_overlap_are_refused(tmp_path):
    """A member whose compressed bytes are claimed to run over the next member's (the
    overlapping-members zip bomb): together they claim more bytes than the file has."""
    blob = npz_file([("W.npy", npy(W)), ("V.npy", npy(W))], zipfile.ZIP_DEFLATED)
    path = tmp_path / "w.npz"
    path.write_bytes(set_central_field(blob, 20, "<I", len(blob) - 20))  # W's compressed size
    check_refused(path, ValueError, rf"its members claim more bytes than the file's {len(blob)}")


def deflated_npz(arrays):
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def test_an_npz_inflating_to_more_than_the_bound_is_refused_before_inflating(tmp_path, monkeypatch):
    """A zip bomb whose sizes are all true: one deflated member of zeros, as its npy header says
    (a 1 MB file of 1 GiB of zeros loaded in 5 s). The members may declare at most 10 times the
    file's size (the floor, 64 MiB, lowered here to keep the file small)."""
    monkeypatch.setattr(file_checks, "NPZ_EXPANSION_FLOOR", 2**20)
    blob = deflated_npz({"W": np.zeros(2**20, np.float32)})  # 4 MiB of zeros in about 4 kB
    path = tmp_path / "w.npz"
    path.write_bytes(blob)
    inflated = sum(info.file_size for info in zipfile.ZipFile(io.BytesIO(blob)).infolist())
    refused_quickly(
        path,
        f"^{re.escape(str(path))}: its members inflate to {inflated} bytes, more than 10 times the file's "
        rf"{len(blob)} \(and than 1048576\); weights do not compress so far$",
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_np_savez_compressed_weights_load_within_the_inflation_bound(tmp_path, monkeypatch, dtype):
    """Real weights deflate to about 1:1.1, far inside the bound, even with the floor lowered below
    their size; so do a model's small zero or one vectors beside them."""
    monkeypatch.setattr(file_checks, "NPZ_EXPANSION_FLOOR", 2**18)
    rng = np.random.default_rng(0)
    params = {
        "W_query.weight": (0.02 * rng.standard_normal((512, 512))).astype(dtype),
        "W_query.bias": np.zeros(512, dtype),
        "norm.scale": np.ones(512, dtype),
    }
    path = tmp_path / "w.npz"
    path.write_bytes(deflated_npz(params))
    assert sum(array.nbytes for array in params.values()) > file_checks.NPZ_EXPANSION_FLOOR
    loaded = load_weights(path)
    assert list(loaded) == list(params)
    for name, array in params.items():
        np.testing.assert_array_equal(loaded[name], array)


# ------------------------------------------------------------------ bounds on headers and directories


def zero_size_entries(count):
    return {f"t{i}": entry(shape=(0,), offsets=(0, 0)) for i in range(count)}


@pytest.mark.parametrize(
    "header, message",
    [
        (zero_size_entries(10_001), "holds more than 10000 tensors, the most a weight file holds"),
        ({"__metadata__": [{}] * 20_000}, "holds more than 10000 tensors"),
        ({"__metadata__": {"notes": "x" * (8 * 2**20)}}, r"a header of 8388639 bytes, more than the 8388608"),
    ],
    ids=["10_001_tensors", "20_000_objects", "header_over_8_mib"],
)
def test_headers_over_the_bounds_are_refused(tmp_path, header, message):
    """The bounds (docs/hardening.md) keep a refusal within a second: a 17.6 MB header of 300k
    zero-size entries took 4.6 s, and the format itself allows 100 MB."""
    path = tmp_path / "w.safetensors"
    path.write_bytes(safetensors_file(header))
    with within_cpu_seconds(1):
        check_refused(path, ValueError, message)


def test_the_bounds_hold_as_many_tensors_as_a_file_may_have(tmp_path):
    params = {f"t{i}": B for i in range(10_000)}
    for suffix in (".safetensors", ".npz"):
        save_weights(tmp_path / f"w{suffix}", params)
        assert len(load_weights(tmp_path / f"w{suffix}")) == 10_000
    with pytest.raises(ValueError, match="params holds more than 10000 tensors"):
        save_weights(tmp_path / "w.npz", {**params, "one more": B})
    np.savez(tmp_path / "w.npz", **params, one_more=B, and_another=B)
    check_refused(tmp_path / "w.npz", ValueError, "holds more than 10000 tensors")


def npz_claiming_one_member(count, zip64, monkeypatch):
    """An .npz of ``count`` members (each ``B``) whose end record says it holds one: the plain end
    record, or the zip64 one (zipfile writes it past 65,535 members; its limit is lowered here)."""
    buffer = io.BytesIO()
    with monkeypatch.context() as patch:
        if zip64:
            patch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)
        with zipfile.ZipFile(buffer, "w") as archive:
            for index in range(count):
                archive.writestr(f"{index:x}.npy", npy(B))
    blob = bytearray(buffer.getvalue())
    if zip64:
        struct.pack_into("<QQ", blob, blob.rfind(b"PK\x06\x06") + 24, 1, 1)
    else:
        struct.pack_into("<HH", blob, blob.rfind(b"PK\x05\x06") + 8, 1, 1)
    return bytes(blob)


@pytest.mark.parametrize("zip64", [False, True], ids=["end_record", "zip64_end_record"])
def test_an_npz_end_record_understating_its_members_is_refused_by_their_count(tmp_path, monkeypatch, zip64):
    """The end record's count was the only one checked: zipfile reads every entry in the
    directory whatever it says (150,000 tensors in an 8 MiB directory loaded in 9 s). The
    entries are counted as zipfile steps through them, stopping past the bound: milliseconds."""
    path = tmp_path / "w.npz"
    path.write_bytes(npz_claiming_one_member(10_002, zip64, monkeypatch))
    with within_cpu_seconds(1):
        check_refused(
            path,
            ValueError,
            f"^{re.escape(str(path))} holds more than 10000 tensors, the most a weight file holds$",
        )


def test_the_members_zipfile_read_are_counted_too(tmp_path, monkeypatch):
    """Should the early count ever step through a directory otherwise than zipfile, the members
    zipfile read are held to the same bound."""
    path = tmp_path / "w.npz"
    path.write_bytes(npz_claiming_one_member(10_002, False, monkeypatch))
    monkeypatch.setattr(file_checks, "_directory_entries", lambda directory: 1)
    check_refused(path, ValueError, f"^{re.escape(str(path))} holds more than 10000 tensors")


def test_saving_refuses_names_longer_than_the_bounds(tmp_path):
    with pytest.raises(ValueError, match=r"a name in \.npz holds at most 65531 bytes"):
        save_weights(tmp_path / "w.npz", {"é" * 32_766: W})
    long_names = {f"{i:04d}" + "x" * 1000: B for i in range(5_000)}
    with pytest.raises(ValueError, match=r"params: a header of \d+ bytes, more than the 8388608"):
        save_weights(tmp_path / "w.safetensors", long_names)
    with pytest.raises(ValueError, match=r"params: a zip directory of \d+ bytes, more than the 8388608"):
        save_weights(tmp_path / "w.npz", {f"{i:04d}" + "x" * 2000: B for i in range(5_000)})
    assert list(tmp_path.iterdir()) == []


def test_the_bounds_are_the_documented_ones():
    assert (file_checks.MAX_TENSORS, file_checks.MAX_HEADER) == (10_000, 8 * 2**20)
    assert (file_checks.MAX_NPZ_EXPANSION, file_checks.NPZ_EXPANSION_FLOOR) == (10, 64 * 2**20)


# ------------------------------------------------------------------ names UTF-8 cannot encode


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_saving_refuses_a_name_with_a_lone_surrogate(tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    with pytest.raises(ValueError, match=r"params\['a\\ud800'\]: names must be text that UTF-8 can encode"):
        save_weights(path, {"a\ud800": W})
    assert not path.exists()
    save_weights(path, {"é😀": W})  # any text UTF-8 encodes round-trips
    assert list(load_weights(path)) == ["é😀"]


def test_a_safetensors_name_with_a_lone_surrogate_is_refused_as_the_library_does(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(safetensors_file({"a\ud800": entry()}, W.tobytes()))  # JSON escapes it: "a\\ud800"
    check_refused(path, ValueError, r"tensor 'a\\ud800': names must be text that UTF-8 can encode")
    with pytest.raises(Exception, match="invalid JSON in header"):
        safetensors.numpy.load_file(path)


# ------------------------------------------------------------------ saving to what is not a regular file


@pytest.mark.parametrize("kind", ["fifo", "link_to_fifo", "dev_null", "directory"])
def test_saving_to_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    path = tmp_path / "w.npz"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_fifo":
        os.mkfifo(tmp_path / "pipe")
        path.symlink_to(tmp_path / "pipe")
    elif kind == "dev_null":
        path.symlink_to("/dev/null")
    else:
        path.mkdir()
    error = raised_in_thread(lambda: save_weights(path, {"W": W}), path, reading=False)
    assert isinstance(error, ValueError) and "is not a regular file" in str(error)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_gpt2_checkpoint_whose_file_is_not_a_regular_file_is_refused_writing_nothing(tmp_path, kind, name):
    """Both destinations are checked before anything is written: a refusal leaves the folder's
    other file as it was (the weights were renamed into place over a FIFO, not written into it)."""
    config = {"vocab_size": 11, "context_length": 8, "emb_dim": 4, "n_heads": 2, "n_layers": 1}
    config |= {"drop_rate": 0.0, "qkv_bias": True}
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in gpt_param_shapes(config).items()}
    save_hf_gpt2(tmp_path, params, config)
    other = tmp_path / ({"config.json", "model.safetensors"} - {name}).pop()
    before = other.read_bytes()
    path = tmp_path / name
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    listing = sorted(tmp_path.iterdir())
    error = raised_in_thread(
        lambda: save_hf_gpt2(tmp_path, {k: v + 1 for k, v in params.items()}, config), path, reading=False
    )
    message = f"{path} is not a regular file (a FIFO, device, directory or a link to one)"
    assert type(error) is ValueError and str(error) == message
    assert other.read_bytes() == before and sorted(tmp_path.iterdir()) == listing  # nothing written


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "link_to_dev_zero", "link_to_nothing"])
def test_a_gpt2_checkpoint_file_that_is_not_a_regular_file_is_not_called_missing(tmp_path, kind, name):
    """A FIFO, a folder or a link to a device in place of a checkpoint's file was reported as
    "config.json is missing": "missing" is for what does not exist (a link to nothing too)."""
    config = {"vocab_size": 11, "context_length": 8, "emb_dim": 4, "n_heads": 2, "n_layers": 1}
    config |= {"drop_rate": 0.0, "qkv_bias": True}
    params = {k: np.zeros(s, np.float32) for k, s in gpt_param_shapes(config).items()}
    save_hf_gpt2(tmp_path, params, config)
    path = tmp_path / name
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero" if kind == "link_to_dev_zero" else tmp_path / "nothing")
    error = raised_in_thread(lambda: load_hf_gpt2(tmp_path), path, reading=True)
    if kind == "link_to_nothing":
        message = f"{tmp_path} is not a GPT-2 checkpoint folder: {name} is missing"
    else:
        message = f"{path} is not a regular file (a FIFO, device, directory or a link to one)"
    assert type(error) is ValueError and str(error) == message


@pytest.mark.parametrize(
    "names", [["W", "V"], [f"t{i}" for i in range(300)], ["PK\x01\x02", "a/PK\x01\x02PK\x01\x02"]]
)
def test_the_early_count_of_a_zip_directory_is_never_below_zipfiles(names):
    """``_directory_entries`` (the count that bounds a directory before zipfile reads it) against
    zipfile itself: at least the entries zipfile reads, names holding the entries' signature too."""
    blob = npz_file([(f"{name}.npy", npy(B)) for name in names])
    end = zipfile._EndRecData(io.BytesIO(blob))
    directory = blob[end[zipfile._ECD_OFFSET] : end[zipfile._ECD_OFFSET] + end[zipfile._ECD_SIZE]]
    assert file_checks._directory_entries(directory) >= len(zipfile.ZipFile(io.BytesIO(blob)).infolist())
    assert file_checks._directory_entries(directory) == len(names) + sum(
        name.count("PK\x01\x02") for name in names
    )
