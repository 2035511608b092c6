"""Weight files: the weights format saved as ``.safetensors`` or ``.npz``, never pickle.

``save_weights(path, params)`` writes a file with the format's own library (``safetensors.numpy``;
``zipfile`` and NumPy's ``.npy`` writer for ``.npz``), atomically (``numpy_attn.files``);
``load_weights(path)`` reads it back with the same libraries (``safetensors``, ``np.load`` with
``allow_pickle=False``). On top of the formats, this module keeps the project's own rules:

* weights are float16, float32, float64 (bfloat16 in safetensors, with ``ml_dtypes`` loaded), at
  least 1-D, one dtype for all, finite, named by text UTF-8 can encode; integer, bool, complex
  and object arrays are refused on saving and on loading;
* bounds that keep any refusal within about a second, checked from the small parts of a file
  before its data is read: at most ``MAX_TENSORS`` tensors, ``_MAX_HEADER`` bytes of safetensors
  header or zip directory, and members of an ``.npz`` that inflate to at most
  ``_MAX_NPZ_EXPANSION`` times the file's size (``_NPZ_EXPANSION_FLOOR`` for a small file);
* only regular files are read or written (``numpy_attn.files``);
* an integrity record in every file ``save_weights`` writes (a SHA-256 of the names, dtypes,
  shapes and data; an ``.npz`` also holds one of all its bytes in its zip comment), so that a
  changed file is refused or loads exactly what was saved. Files from elsewhere have none and
  load after the structural checks (a 0-d array among them loads as shape ``()``).
"""

from __future__ import annotations

import collections
import errno
import hashlib
import json
import math
import os
import re
import reprlib
import struct
import sys
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from numpy_attn.checks import (
    JAX_FLOATS,
    check_array,
    check_dtype_argument,
    check_finite,
    check_mapping,
    check_numpy_dtype,
    check_params,
)
from numpy_attn.files import atomic_write, open_regular_file

__all__ = ["MAX_TENSORS", "load_weights", "read_arrays", "save_weights"]

MAX_TENSORS = 10_000  # the most tensors a weight file holds (GPT-2 XL has 580)
_MAX_HEADER = 8 << 20  # bytes of safetensors header or zip directory (safetensors allows 100 MB)
_MAX_NPZ_EXPANSION = 10  # an .npz's members inflate to at most this many times the file's size...
_NPZ_EXPANSION_FLOOR = 64 << 20  # ... or this many bytes (weights deflate to about 1:1.1)
_MAX_DEFLATE_RATIO = 1100  # deflate expands at most ~1032:1: a member claiming more lies
_MAX_ZIP_NAME = 0xFFFF - len(".npy")  # a zip member's name holds at most 65535 bytes
_ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}  # the weight dtypes of safetensors
# ... and the others, which a checkpoint's leftover buffers may have
_ANY_ITEMSIZE = {**_ITEMSIZE, "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
                 "I32": 4, "U32": 4, "I64": 8, "U64": 8, "C64": 8}  # fmt: skip
_CODES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
_NPZ_FLOATS = ("float16", "float32", "float64")  # .npy has no bfloat16
_FORMAT = {"format": "pt"}  # torch's layout and names (transformers 4.x needs the tag)
_KEYS, _DIGEST = "attn_parity.keys", "attn_parity.sha256"  # the record in safetensors' __metadata__
_NPZ_RECORD = "__attn_parity__"  # the .npz member holding the record
_RESERVED = ("__metadata__", _NPZ_RECORD)
_DIGEST_LENGTH = 64  # hex characters of a SHA-256: an .npz's zip comment
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so that equal weights give equal files
_NOT_UTF8 = "names must be text that UTF-8 can encode (not a lone surrogate)"
_CHUNK = 1 << 20
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    EOFError,
    OSError,
    struct.error,
    zlib.error,
    NotImplementedError,
    UnicodeError,
)


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
        dtype = check_dtype_argument(dtype, JAX_FLOATS)
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
        check_params(params, spec.shapes(**read_arguments(spec, params, arguments)), layer=layer)
    check_finite(params)
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
    check_mapping(params)
    if not params:
        raise ValueError("params is empty: a weight file holds at least one array")
    _check_count(len(params), "params")
    arrays = {}
    for name, value in params.items():
        where = f"params[{name!r}]"
        if name in _RESERVED:
            raise ValueError(f"{where}: the names {list(_RESERVED)} are reserved by weight files")
        if "\0" in name:
            raise ValueError(f"{where}: names may not hold a NUL character (zip cuts them there)")
        if not _is_utf8(name):
            raise ValueError(f"{where}: {_NOT_UTF8}")
        if suffix == ".npz" and len(name.encode()) > _MAX_ZIP_NAME:
            raise ValueError(f"{where}: a name in .npz holds at most {_MAX_ZIP_NAME} bytes of UTF-8")
        check_array(where, value)
        check_numpy_dtype(where, value)
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
    check_finite(arrays)
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
        _check_header_size(struct.unpack("<Q", written.read(8))[0], "params", "header")


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
        _check_zip_directory(written, "params")
        size = written.seek(0, os.SEEK_END)
        digest = _head_digest(written, size - _DIGEST_LENGTH)
        written.write(digest)


# ---------------------------------------------------------------- the rules, on loading


def _read_safetensors(file: BinaryIO, size: int, path: str, skip: tuple[str, ...]) -> dict[str, np.ndarray]:
    header, metadata = _read_header(file, size, path, skip)
    recorded = _KEYS in metadata or _DIGEST in metadata  # written by save_weights: all is read and checked
    names = [key for key in header if recorded or not _skipped(key, skip)]
    try:  # the file this descriptor holds, even if the path was replaced since it was opened
        source = f"/dev/fd/{file.fileno()}" if os.path.isdir("/dev/fd") else path
        with safe_open(source, framework="numpy", backend="pread") as tensors:
            arrays = {key: tensors.get_tensor(key) for key in names}
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
    if recorded:
        arrays = _checked_record(arrays, metadata, path)
    return {key: value for key, value in arrays.items() if not _skipped(key, skip)}


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


def _read_header(
    file: BinaryIO, size: int, path: str, skip: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, str]]:
    """A safetensors file's tensor entries (in the header's order) and metadata, read from its first
    bytes and checked in full: JSON of bounded size and count, each entry's name, dtype, shape and
    offsets, the offsets laid end to end to exactly the file's size."""
    if size < 8:
        raise ValueError(f"{path} is truncated: {size} bytes, shorter than the 8-byte header size")
    (header_size,) = struct.unpack("<Q", file.read(8))
    if header_size > size - 8:
        raise ValueError(
            f"{path} is truncated or not safetensors: its header claims {header_size} bytes, the file has "
            f"{size - 8} after the size field"
        )
    _check_header_size(header_size, path, "header")
    text = file.read(header_size)
    try:
        if not text.startswith(b"{"):
            raise ValueError("it does not start with '{'")
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_HeaderObjects(path))
    except _TooManyTensors:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # ValueError: bad JSON, duplicates
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ValueError(f"{path} has a corrupt safetensors header: {reason}") from None
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map str to str, got {reprlib.repr(metadata)}")
    _check_count(len(header), path)
    end = 0
    for key, entry in sorted(header.items(), key=lambda item: _check_entry(item, path, skip)):
        begin, stop = entry["data_offsets"]
        dtype = entry["dtype"]
        if begin != end or stop - begin != math.prod(entry["shape"]) * _ANY_ITEMSIZE[dtype]:
            raise ValueError(
                f"{path}: tensor {key!r} ({dtype}, shape {tuple(entry['shape'])}) has data offsets "
                f"[{begin}, {stop}] that do not fit its size or follow the previous tensor"
            )
        end = stop
    data = size - 8 - header_size
    if end != data:
        raise ValueError(
            f"{path} {'is truncated' if end > data else 'has trailing bytes'}: the header describes {end} "
            f"data bytes, the file holds {data} ({size} bytes in all, {8 + header_size + end} expected)"
        )
    return header, metadata


def _check_entry(item: tuple[str, Any], path: str, skip: tuple[str, ...]) -> list[int]:
    """One header entry checked (its name, its fields' types, a weight dtype unless skipped);
    returns its data offsets, to sort by."""
    key, entry = item
    if not _is_utf8(key):  # JSON can spell a lone surrogate; the safetensors library refuses it too
        raise ValueError(f"{path}: tensor {key!r}: {_NOT_UTF8}")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(
            f"{path}: tensor {key!r} must be an object with dtype, shape and data_offsets, "
            f"got {reprlib.repr(entry)}"
        )
    offsets, shape, dtype = entry["data_offsets"], entry["shape"], entry["dtype"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_index, offsets))):
        raise ValueError(f"{path}: tensor {key!r} has invalid data_offsets {reprlib.repr(offsets)}")
    if not (isinstance(shape, list) and _is_shape(shape)):
        raise ValueError(f"{path}: tensor {key!r} has an invalid shape {reprlib.repr(shape)}")
    if not isinstance(dtype, str) or dtype not in (_ANY_ITEMSIZE if _skipped(key, skip) else _ITEMSIZE):
        raise TypeError(f"{path}: unsupported dtype {dtype!r}; weight files hold {sorted(_ITEMSIZE)}")
    if dtype == "BF16" and "ml_dtypes" not in sys.modules:  # loaded by jax or torch_ref; not imported here
        raise TypeError(f"{path} holds bfloat16 weights: import ml_dtypes (or jax) to read them")
    return offsets


def _read_npz(file: BinaryIO, size: int, path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file through ``np.load(allow_pickle=False)``, after its zip directory
    and every member's ``.npy`` header were checked (nothing is inflated before), and its record."""
    try:
        _check_zip_directory(file, path)
        if file.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):  # what np.load reads as a zip
            raise zipfile.BadZipFile("File is not a zip file")
        file.seek(0)
        with np.load(file, allow_pickle=False) as npz:
            infos = _members(npz.zip, size, path)
            for info in infos:
                _check_npy_header(npz.zip, info, path)
            arrays = {info.filename.removesuffix(".npy"): npz[info.filename] for info in infos}
            comment = npz.zip.comment
    except _ZIP_ERRORS as error:  # a truncated or altered archive: bad CRC, cut members, names
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


def _check_zip_directory(file: BinaryIO, path: str) -> None:
    """Bound the zip directory before ``zipfile`` reads it: at most ``_MAX_HEADER`` bytes, and at most
    ``MAX_TENSORS`` members (and the record) as its end record claims and as its entries count
    (``_directory_entries``: zipfile reads every entry whatever the end record says)."""
    end = zipfile._EndRecData(file)  # the end record ZipFile reads, found as ZipFile finds it
    if end is None:
        raise zipfile.BadZipFile("File is not a zip file")
    _check_count(end[zipfile._ECD_ENTRIES_TOTAL] - 1, path)
    _check_header_size(end[zipfile._ECD_SIZE], path, "zip directory")
    start = end[zipfile._ECD_LOCATION] - end[zipfile._ECD_SIZE]  # ZipFile's start_dir
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    file.seek(max(start, 0))
    _check_count(_directory_entries(file.read(end[zipfile._ECD_SIZE])) - 1, path)
    file.seek(0)


def _directory_entries(directory: bytes) -> int:
    """At least as many entries as ``zipfile`` reads from this zip directory: each begins with the
    central directory's signature (names may hold it too: the count errs high only)."""
    return directory.count(zipfile.stringCentralDir)


def _members(archive: zipfile.ZipFile, size: int, path: str) -> list[zipfile.ZipInfo]:
    """The archive's members, each a plain (stored or deflated, unencrypted) ``.npy`` named once,
    whose claimed sizes can be true and together inflate within the bound."""
    infos = archive.infolist()
    _check_count(len(infos) - 1, path)  # whatever _directory_entries counted
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate members {_duplicates(names)}")
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise ValueError(f"{path}: member {info.filename!r} is not a .npy array")
        if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(f"{path}: member {info.filename!r} is encrypted or not stored/deflated")
        stored = info.compress_type == zipfile.ZIP_STORED
        limit = info.compress_size if stored else info.compress_size * _MAX_DEFLATE_RATIO + 1024
        if info.compress_size > size or info.file_size > limit or (stored and info.file_size != limit):
            raise ValueError(
                f"{path}: member {info.filename!r} claims {info.file_size} bytes from {info.compress_size} "
                f"in a {size}-byte file"
            )
    if sum(info.compress_size for info in infos) > size:  # members that overlap: a zip bomb
        raise ValueError(f"{path}: its members claim more bytes than the file's {size}")
    inflated = sum(info.file_size for info in infos)
    if inflated > max(_MAX_NPZ_EXPANSION * size, _NPZ_EXPANSION_FLOOR):  # a zip bomb
        raise ValueError(
            f"{path}: its members inflate to {inflated} bytes, more than {_MAX_NPZ_EXPANSION} times the "
            f"file's {size} (and than {_NPZ_EXPANSION_FLOOR}); weights do not compress so far"
        )
    return infos


def _check_npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> None:
    """One member's ``.npy`` header, read by NumPy's reader: a float dtype (the record's uint8), a
    shape whose bytes are the member's data (so nothing is allocated or inflated past it)."""
    name = info.filename
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            if version not in _NPY_HEADERS:
                raise ValueError(f"unsupported .npy version {version}")
            shape, _, dtype = _NPY_HEADERS[version](member)
            if not _is_shape(shape):
                raise ValueError(f"invalid shape {reprlib.repr(shape)}")
        except (ValueError, TypeError, SyntaxError, RecursionError, OverflowError) as error:
            raise ValueError(f"{path}: member {name!r} has a corrupt .npy header: {error}") from None
        data = info.file_size - member.tell()
    weight = dtype.kind == "f" and dtype.name in _NPZ_FLOATS
    if not weight and not (name == f"{_NPZ_RECORD}.npy" and dtype == np.uint8):
        needs = " (loading it would need pickle)" if dtype.hasobject else ""
        raise TypeError(f"{path}: member {name!r} has dtype {dtype}{needs}; .npz weights are {_NPZ_FLOATS}")
    if data != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{path}: member {name!r} ({dtype}, shape {shape}) holds {data} bytes of data")


# ---------------------------------------------------------------- small shared helpers


def _head_digest(file: BinaryIO, count: int) -> bytes:
    """The SHA-256 (hex) of the first ``count`` bytes of ``file``; the file is left at ``count``."""
    file.seek(0)
    digest = hashlib.sha256()
    for start in range(0, max(count, 0), _CHUNK):
        digest.update(file.read(min(_CHUNK, count - start)))
    return digest.hexdigest().encode()


def _little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` stored little-endian, as safetensors requires (bfloat16 has no byte order)."""
    little = array.dtype if array.dtype.name == "bfloat16" else array.dtype.newbyteorder("<")
    return array.astype(little, copy=False)


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    return bool(skip) and name.endswith(skip)


def _duplicates(names: list[str]) -> list[str]:
    return sorted(name for name, count in collections.Counter(names).items() if count > 1)


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_shape(shape: Any) -> bool:
    """Whether NumPy can make an array of ``shape`` (a zero-size one too) in any weight dtype."""
    return (
        isinstance(shape, list | tuple)
        and len(shape) <= 64
        and all(map(_is_index, shape))
        and math.prod(filter(None, shape)) <= sys.maxsize // 8
    )


class _TooManyTensors(ValueError):
    pass


def _check_count(count: int, where: str) -> None:
    if count > MAX_TENSORS:
        raise _TooManyTensors(f"{where} holds more than {MAX_TENSORS} tensors, the most a weight file holds")


def _check_header_size(size: int, where: str, what: str) -> None:
    if size > _MAX_HEADER:
        raise ValueError(
            f"{where}: a {what} of {size} bytes, more than the {_MAX_HEADER} a weight file may have"
        )


class _HeaderObjects:
    """``json.loads``' hook for a header's objects: refuses duplicate names, and stops the parse once
    there are more objects than a file's tensors (and the header and its ``__metadata__``)."""

    def __init__(self, path: str) -> None:
        self.path, self.count = path, 0

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.count += 1
        _check_count(self.count - 2, self.path)
        header = dict(pairs)
        if len(header) != len(pairs):
            raise ValueError(f"duplicate names in the header: {_duplicates([name for name, _ in pairs])}")
        return header
