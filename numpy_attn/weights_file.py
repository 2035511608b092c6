"""Weight files: the weights format saved as ``.safetensors`` or ``.npz``, never pickle.

``save_weights(path, params)`` writes a file with the format's own library (``safetensors.numpy``;
``zipfile`` and NumPy's ``.npy`` writer for ``.npz``), atomically (``numpy_attn.files``);
``load_weights(path)`` reads it back with the same libraries (``safetensors``, ``np.load`` with
``allow_pickle=False``). On top of the formats, this module keeps the project's own rules:

* weights are float16, float32, float64 (bfloat16 in safetensors, with ``ml_dtypes`` loaded), at
  least 1-D, one dtype for all, finite, named by text UTF-8 can encode; integer, bool, complex
  and object arrays are refused on saving and on loading;
* bounds that keep any refusal within about a second, checked from the small parts of a file
  before its data is read (``numpy_attn.file_checks``);
* only regular files are read or written (``numpy_attn.files``);
* an integrity record in every file ``save_weights`` writes (a SHA-256 of the names, dtypes,
  shapes and data; an ``.npz`` also holds one of all its bytes in its zip comment), so that a
  changed file is refused or loads exactly what was saved. Files from elsewhere have none and
  load after the structural checks (a 0-d array among them loads as shape ``()``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from numpy_attn import checks, file_checks, finite
from numpy_attn.file_checks import check_count, check_header_size, check_zip_directory, is_utf8
from numpy_attn.files import atomic_write, open_regular_file

_CODES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}  # in safetensors
_FORMAT = {"format": "pt"}  # torch's layout and names (transformers 4.x needs the tag)
_KEYS, _DIGEST = "attn_parity.keys", "attn_parity.sha256"  # the record in safetensors' __metadata__
_NPZ_RECORD = "__attn_parity__"  # the .npz member holding the record
_RESERVED = ("__metadata__", _NPZ_RECORD)
_DIGEST_LENGTH = 64  # hex characters of a SHA-256: an .npz's zip comment
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so that equal weights give equal files
_MAX_ZIP_NAME = 0xFFFF - len(".npy")  # a zip member's name holds at most 65535 bytes
# what zipfile raises for a cut or altered archive: a bad CRC, a cut member, a name that is not UTF-8,
# a member's own flags (patched data, strong encryption: NotImplementedError)
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, struct.error, EOFError, OSError, UnicodeError)
_ZIP_ERRORS += (NotImplementedError,)


def save_weights(path: str | os.PathLike, params: Mapping[str, Any]) -> None:
    """Write ``params`` (``dict[str, array]``: the weights format) to a ``.safetensors`` or ``.npz``
    file with an integrity record: what ``load_weights`` returns as it was, and nothing else.

    The file is replaced atomically (``numpy_attn.files.atomic_write``): a crash, a full disk or a
    concurrent save leaves the old complete file or a new complete one. Big-endian arrays are
    stored little-endian. Raises TypeError for a non-str name, an array that is not float16/32/64
    (bfloat16: safetensors only) or mixed dtypes; ValueError for a reserved name (``__metadata__``,
    ``__attn_parity__``), a NUL or a lone surrogate in a name, a 0-d array, non-finite values, an
    empty mapping, more than the bounds allow, or a target that is not a regular file; OSError
    naming ``path`` where it cannot be written.
    """
    suffix = _suffix(path)
    arrays = _checked_arrays(params, suffix)
    with atomic_write(path) as file:
        if suffix == ".npz":
            _write_npz(file, arrays)
        else:
            _write_safetensors(file, arrays, path)


def load_weights(
    path: str | os.PathLike, *, layer: str | None = None, dtype: Any | None = None, **arguments: Any
) -> dict[str, np.ndarray]:
    """The weights in ``path`` (``.safetensors`` or ``.npz``), in the order they were saved, in the
    machine's byte order: exactly what ``save_weights`` wrote, or a file from elsewhere.

    With ``layer`` (a torch class name, e.g. ``"MultiHeadAttention"``) and the constructor
    ``arguments`` the weights cannot tell (``num_heads=2``; ignored by a class without heads), they
    must fit that class exactly (``numpy_attn.spec``). With ``dtype`` (a floating dtype) every array
    has it; without, all share one. Raises ValueError for a file that is not a weight file, holds no
    tensor, was altered, or breaks a bound, and for weights that do not fit ``layer`` or are not
    finite; TypeError for other dtypes; OSError (FileNotFoundError...) naming ``path``.
    """
    from numpy_attn.spec import layer_spec, read_arguments  # spec imports the checks, not files

    if dtype is not None:
        dtype = checks.check_dtype_argument(dtype, checks.JAX_FLOATS)
    spec = None if layer is None else layer_spec(layer)
    if spec is None or "num_heads" not in spec.constructor:  # the old keyword, for a class without heads
        arguments.pop("num_heads", None)
    if spec is None and arguments:
        raise TypeError(f"load_weights takes constructor arguments {sorted(arguments)} only with layer=")
    params = read_arrays(path)
    dtypes = sorted({array.dtype.name for array in params.values()})
    if dtype is not None and dtypes != [dtype.name]:
        raise TypeError(f"{os.fspath(path)} holds dtypes {dtypes}, expected {dtype.name}")
    if len(dtypes) > 1:
        raise TypeError(f"{os.fspath(path)} mixes dtypes {dtypes}; weights share one dtype")
    if spec is not None:
        checks.check_params(params, spec.shapes(**read_arguments(spec, params, arguments)), layer=layer)
    finite.check_finite(params)
    return params


def read_arrays(path: str | os.PathLike, *, skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The arrays of a weight file after every check of the file itself (``load_weights`` adds those
    of the weights: one dtype, finite values, a layer). Tensors whose names end with one of ``skip``
    (a checkpoint's leftover buffers) are neither read nor held to the weights' dtypes."""
    suffix, name = _suffix(path), os.fspath(path)
    with open_regular_file(path) as file:
        size = os.fstat(file.fileno()).st_size
        if suffix == ".npz":
            arrays = _read_npz(file, size, name)
        else:
            arrays = _read_safetensors(file, size, name, skip)
    if not arrays:
        raise ValueError(f"{name} holds no tensor; a weight file holds at least one array")
    return arrays


def _suffix(path: str | os.PathLike) -> str:
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix not in (".safetensors", ".npz"):
        raise ValueError(f"weight files are .safetensors or .npz, got {os.fspath(path)!r}")
    return suffix


# ---------------------------------------------------------------- the rules, on saving


def _checked_arrays(params: Mapping[str, Any], suffix: str) -> dict[str, np.ndarray]:
    """``params`` as C-contiguous little-endian arrays, refusing what would not load back as it is."""
    checks.check_mapping(params)
    if not params:
        raise ValueError("params is empty: a weight file holds at least one array")
    check_count(len(params), "params")
    arrays = {}
    for name, value in params.items():
        where = f"params[{name!r}]"
        if name in _RESERVED:
            raise ValueError(f"{where}: the names {list(_RESERVED)} are reserved by weight files")
        if "\0" in name:
            raise ValueError(f"{where}: names may not hold a NUL character (zip cuts them there)")
        if not is_utf8(name):
            raise ValueError(f"{where}: {file_checks.NOT_UTF8}")
        if suffix == ".npz" and len(name.encode()) > _MAX_ZIP_NAME:
            raise ValueError(f"{where}: a name in .npz holds at most {_MAX_ZIP_NAME} bytes of UTF-8")
        checks.check_numpy_dtype(where, value)
        array = np.asarray(value)
        if array.ndim == 0:
            raise ValueError(f"{where} is 0-d (a scalar); weights have at least one axis")
        if array.dtype.name not in _CODES or array.dtype.kind not in "fV":
            raise TypeError(f"{where} has dtype {array.dtype.name}; weight files hold {list(_CODES)}")
        if suffix == ".npz" and array.dtype.name == "bfloat16":
            raise ValueError(f"{where} is bfloat16, which .npz cannot hold: use .safetensors")
        arrays[name] = np.ascontiguousarray(_little_endian(array))
    dtypes = sorted({array.dtype.name for array in arrays.values()})
    if len(dtypes) > 1:
        raise TypeError(f"params mix dtypes {dtypes}; weights share one dtype")
    finite.check_finite(arrays)
    return arrays


def _digest(entries: list[list[Any]], arrays: list[np.ndarray]) -> str:
    """The integrity record: a SHA-256 of the entries (name, dtype, shape[, offsets]) and the data."""
    digest = hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode())
    for array in arrays:
        digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return digest.hexdigest()


def _safetensors_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """The record of safetensors data: each entry's offsets as if stored in the record's order."""
    entries, offset = [], 0
    for name, array in arrays.items():
        entries.append([name, _CODES[array.dtype.name], list(array.shape), [offset, offset + array.nbytes]])
        offset += array.nbytes
    return _digest(entries, list(arrays.values()))


def _npz_record(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    entries = [[name, array.dtype.name, list(array.shape)] for name, array in arrays.items()]
    record = {"keys": list(arrays), "sha256": _digest(entries, list(arrays.values()))}
    return np.frombuffer(json.dumps(record).encode(), np.uint8)


def _write_safetensors(file: BinaryIO, arrays: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """``arrays`` written by the safetensors library to ``file.name``, then held to the header bound."""
    metadata = {**_FORMAT, _KEYS: json.dumps(list(arrays)), _DIGEST: _safetensors_digest(arrays)}
    try:
        safetensors.numpy.save_file(arrays, file.name, metadata=metadata)
    except SafetensorError as error:  # "... I/O error: File too large (os error 27)"
        number = int(found[1]) if (found := re.search(r"os error (\d+)", str(error))) else errno.EIO
        raise OSError(number, os.strerror(number), os.fspath(path)) from None
    with open(file.name, "rb") as written:
        check_header_size(struct.unpack("<Q", written.read(8))[0], "params", "header")


def _write_npz(file: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` as an uncompressed zip of ``.npy`` members and the record, then the SHA-256 of
    every byte before the zip comment written as that comment."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as archive:
        for name, array in {**arrays, _NPZ_RECORD: _npz_record(arrays)}.items():
            with archive.open(zipfile.ZipInfo(name + ".npy", _ZIP_DATE), "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
        archive.comment = b"0" * _DIGEST_LENGTH
    file.flush()
    with open(file.name, "r+b") as written:
        check_zip_directory(written, "params")
        size = written.seek(0, os.SEEK_END)
        digest = _head_digest(written, size - _DIGEST_LENGTH)
        written.write(digest)


# ---------------------------------------------------------------- the rules, on loading


def _read_safetensors(file: BinaryIO, size: int, path: str, skip: tuple[str, ...]) -> dict[str, np.ndarray]:
    header, metadata = file_checks.check_safetensors_header(file, size, path, skip)
    recorded = _KEYS in metadata or _DIGEST in metadata  # written by save_weights: all is read and checked
    names = [key for key in header if recorded or not (skip and key.endswith(skip))]
    try:  # the file this descriptor holds, even if the path was replaced since it was opened
        source = f"/dev/fd/{file.fileno()}" if os.path.isdir("/dev/fd") else path
        with safe_open(source, framework="numpy", backend="pread") as tensors:
            arrays = {key: tensors.get_tensor(key) for key in names}
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
    if recorded:
        arrays = _checked_record(arrays, metadata, path)
    return {key: value for key, value in arrays.items() if not (skip and key.endswith(skip))}


def _checked_record(arrays: dict[str, np.ndarray], metadata: dict[str, str], path: str) -> dict[str, Any]:
    """``arrays`` in the recorded order, if the record matches them; ValueError otherwise."""
    try:  # the key list as save_weights spells it (not another JSON spelling of the same names)
        text = metadata.pop(_KEYS, "null")
        keys = json.loads(text)
        ordered = {key: arrays[key] for key in keys} if json.dumps(keys) == text else None
    except (ValueError, TypeError, KeyError):
        ordered = None
    if ordered is not None and len(ordered) != len(arrays):
        ordered = None
    digest = _safetensors_digest({key: _little_endian(value) for key, value in (ordered or {}).items()})
    if ordered is None or metadata.pop(_DIGEST, None) != digest or metadata not in ({}, _FORMAT):
        raise ValueError(
            f"{path} was altered: its names, dtypes, shapes, offsets, data or metadata do not match the "
            "SHA-256 recorded when it was saved"
        )
    return ordered


def _read_npz(file: BinaryIO, size: int, path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file through ``np.load(allow_pickle=False)``, after its zip directory
    and every member's ``.npy`` header were checked (nothing is inflated before), and its record."""
    try:
        check_zip_directory(file, path)
        if file.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):  # what np.load reads as a zip
            raise zipfile.BadZipFile("File is not a zip file")
        file.seek(0)
        with np.load(file, allow_pickle=False) as npz:
            infos = file_checks.check_npz_members(npz.zip, size, path)
            for info in infos:
                file_checks.check_npy_header(npz.zip, info, path, _NPZ_RECORD)
            arrays = {info.filename.removesuffix(".npy"): npz[info.filename] for info in infos}
            comment = npz.zip.comment
    except _ZIP_ERRORS as error:
        raise ValueError(f"{path} is not a readable .npz weight file: {error}") from error
    record = arrays.pop(_NPZ_RECORD, None)
    if record is not None or re.fullmatch(rb"[0-9a-f]{64}", comment):  # written by save_weights
        intact = comment == _head_digest(file, size - _DIGEST_LENGTH) == file.read()  # the file ends there
        if not intact or record is None or record.tobytes() != _npz_record(arrays).tobytes():
            raise ValueError(
                f"{path} was altered: its names, dtypes, shapes, data or zip structure do not match the "
                "SHA-256 recorded when it was saved"
            )
    native = {key: array.dtype.newbyteorder("=") for key, array in arrays.items()}
    return {key: array.astype(native[key], order="C", copy=False) for key, array in arrays.items()}


# ---------------------------------------------------------------- small shared helpers


def _head_digest(file: BinaryIO, count: int) -> bytes:
    """The SHA-256 (hex) of the first ``count`` bytes of ``file``; the file is left at ``count``."""
    file.seek(0)
    digest = hashlib.sha256()
    for start in range(0, max(count, 0), 1 << 20):
        digest.update(file.read(min(1 << 20, count - start)))
    return digest.hexdigest().encode()


def _little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` stored little-endian, as safetensors requires (bfloat16 has no byte order)."""
    little = array.dtype if array.dtype.name == "bfloat16" else array.dtype.newbyteorder("<")
    return array.astype(little, copy=False)
