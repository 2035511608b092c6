"""Weight files: the weights format saved as safetensors or ``.npz``, never pickle.

``save_weights(path, params)`` writes ``.safetensors`` (read and written here with NumPy alone,
following the format's specification; the ``safetensors`` library reads these files and writes
files that load here) or ``.npz``; ``load_weights(path)`` reads them back. Loading ends with the
arrays that were saved, or with a ValueError or TypeError that names the problem, whatever the
file holds:

* only regular files are opened (a FIFO, a device or a link to one is refused before opening,
  so that nothing blocks), and a file is read once, up to its size;
* the structure is checked in full before any array is built: the header's JSON (its types,
  duplicate names, nesting), every name, dtype, shape and data offset against the data's size,
  the zip members of an ``.npz`` (no encryption, no pickle, sizes that can be true);
* files written by ``save_weights`` carry an integrity record, which a single-bit change
  anywhere in the file breaks: in safetensors, ``__metadata__`` holds the key list and a
  SHA-256 of the header's entries (names, dtypes, shapes, data offsets) and of the data; an
  ``.npz`` holds the key list and a SHA-256 of names, dtypes, shapes and data in a reserved
  member (``__attn_parity__``) and a SHA-256 of every byte before it in the zip comment. Files
  from elsewhere, without the record, are checked structurally.

A safetensors file's ``__metadata__`` also says ``"format": "pt"``, as torch's own files do: the
weights are torch's ``state_dict`` in torch's layout, and transformers 4.x loads no file without it.

Weights are float16, float32, float64 (and bfloat16 in safetensors, with ``ml_dtypes``
loaded); integer, bool, complex and object arrays are refused, on saving and on loading.
Big-endian floats are stored little-endian, as safetensors requires, and loaded in the
machine's byte order: the values are exact, only the byte order differs. Saving refuses what
could not come back as it was: a reserved or non-str name, a 0-d array, bfloat16 in ``.npz``,
an empty mapping.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import math
import os
import re
import reprlib
import stat
import struct
import sys
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.spec import check_weights
from numpy_attn.validation import check_array, check_finite, check_mapping, check_numpy_dtype

__all__ = ["load_weights", "save_weights"]

# safetensors dtype codes <-> NumPy dtype names (BF16 needs ml_dtypes, see _numpy_dtype)
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_NAMES = {code: name for name, code in _CODES.items()}
_NPZ_FLOATS = ["float64", "float32", "float16"]  # .npy has no bfloat16
_RECORD_KEYS = "attn_parity.keys"  # safetensors __metadata__: the key list, as JSON
_RECORD_DIGEST = "attn_parity.sha256"  # ... and the digest of the header's entries and data
_FORMAT = {"format": "pt"}  # safetensors __metadata__: torch's layout and names (transformers 4.x needs it)
_NPZ_RECORD = "__attn_parity__"  # the .npz member holding the key list and the digest
_RESERVED = ("__metadata__", _NPZ_RECORD)
_MAX_HEADER = 100_000_000  # the safetensors format's own bound on the JSON header
_MAX_RANK = 64  # NumPy's maximum number of axes
_DIGEST_LENGTH = 64  # hex characters of a SHA-256
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so that equal weights give equal files
_MAX_DEFLATE_RATIO = 1100  # deflate expands at most ~1032:1; a larger claimed size is a lie
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def save_weights(path: str | os.PathLike, params: Mapping[str, Any]) -> None:
    """Write ``params`` (``dict[str, array]``, float16/32/64 or bfloat16, at least 1-D, finite,
    one dtype) to a ``.safetensors`` or ``.npz`` file, with an integrity record (see the module
    docstring): what ``load_weights`` accepts, and nothing else.

    Raises TypeError for a non-str name, a non-floating array or mixed dtypes, ValueError for a
    reserved name (``__metadata__``, ``__attn_parity__``), a name with a NUL character, a 0-d
    array, non-finite values, bfloat16 in ``.npz`` or an empty mapping: the file is not written.
    """
    suffix = _suffix(path)
    arrays = _checked_arrays(params, suffix)
    blob = _npz_bytes(arrays) if suffix == ".npz" else _safetensors_bytes(arrays)
    with open(path, "wb") as file:
        file.write(blob)


def load_weights(
    path: str | os.PathLike,
    *,
    layer: str | None = None,
    num_heads: int = 1,
    dtype: Any | None = None,
) -> dict[str, np.ndarray]:
    """Read a weight file written by ``save_weights`` (or any safetensors / ``.npz`` file).

    With ``layer`` (a torch class name, e.g. ``"MultiHeadAttention"``; ``num_heads`` where the
    class has heads) the weights must fit that class exactly: one ValueError names every
    missing, unexpected and mis-shaped key. With ``dtype`` every array must have that dtype
    (TypeError otherwise); without it they must all share one. Values must be finite. A file
    that is not what ``save_weights`` wrote raises ValueError (TypeError for a dtype that
    weights cannot have); a missing or unreadable file raises the usual OSError.
    """
    suffix = _suffix(path)
    blob = _read_regular_file(path)
    name = os.fspath(path)
    params = _parse_npz(blob, name) if suffix == ".npz" else _parse_safetensors(blob, name)
    dtypes = {array.dtype.name for array in params.values()}
    if dtype is not None and dtypes - {np.dtype(dtype).name}:
        raise TypeError(f"{name} holds dtypes {sorted(dtypes)}, expected {np.dtype(dtype).name}")
    if len(dtypes) > 1:
        raise TypeError(f"{name} mixes dtypes {sorted(dtypes)}; weights share one dtype")
    if layer is not None:
        check_weights(layer, params, num_heads)
    check_finite(params)
    return params


def _suffix(path: str | os.PathLike) -> str:
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix not in (".safetensors", ".npz"):
        raise ValueError(f"weight files are .safetensors or .npz, got {os.fspath(path)!r}")
    return suffix


# ---------------------------------------------------------------- saving


def _checked_arrays(params: Mapping[str, Any], suffix: str) -> dict[str, np.ndarray]:
    """``params`` as contiguous little-endian arrays, refusing what would not load back as it is."""
    check_mapping(params)
    if not params:
        raise ValueError("params is empty: a weight file holds at least one array")
    arrays = {}
    for name, value in params.items():
        if not isinstance(name, str):
            raise TypeError(f"params keys must be str, got {name!r} ({type(name).__name__})")
        if name in _RESERVED:
            raise ValueError(f"params[{name!r}]: the names {list(_RESERVED)} are reserved by weight files")
        if "\0" in name:
            raise ValueError(f"params[{name!r}]: names may not hold a NUL character (zip cuts them there)")
        check_array(f"params[{name!r}]", value)
        check_numpy_dtype(f"params[{name!r}]", value)
        array = np.asarray(value)
        if array.ndim == 0:
            raise ValueError(f"params[{name!r}] is 0-d (a scalar); weights have at least one axis")
        if array.dtype.name not in _CODES or array.dtype.kind not in "fV":
            raise TypeError(
                f"params[{name!r}] has dtype {array.dtype.name}; weight files hold {list(_CODES)}"
            )
        if suffix == ".npz" and array.dtype.name == "bfloat16":
            raise ValueError(f"params[{name!r}] is bfloat16, which .npz cannot hold: use .safetensors")
        arrays[name] = np.ascontiguousarray(_little_endian(array))
    dtypes = sorted({array.dtype.name for array in arrays.values()})
    if len(dtypes) > 1:
        raise TypeError(f"params mix dtypes {dtypes}; weights share one dtype")
    check_finite(arrays)
    return arrays


def _digest(entries: list[list[Any]], chunks: list[bytes]) -> str:
    """SHA-256 of a file's entries (name, dtype, shape[, offsets]) and its data."""
    digest = hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode())
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _safetensors_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    header: dict[str, Any] = {}
    offset = 0
    for name, array in arrays.items():
        header[name] = {
            "dtype": _CODES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    data = b"".join(array.tobytes() for array in arrays.values())
    header["__metadata__"] = {
        **_FORMAT,
        _RECORD_KEYS: json.dumps(list(arrays)),
        _RECORD_DIGEST: _digest(_safetensors_entries(header), [data]),
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(encoded)) + encoded + data


def _npz_entries(arrays: dict[str, np.ndarray]) -> list[list[Any]]:
    return [[name, array.dtype.name, list(array.shape)] for name, array in arrays.items()]


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    record = {
        "keys": list(arrays),
        "sha256": _digest(_npz_entries(arrays), [array.tobytes() for array in arrays.values()]),
    }
    members = {**arrays, _NPZ_RECORD: np.frombuffer(json.dumps(record).encode(), np.uint8)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in members.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(name + ".npy", date_time=_ZIP_DATE), member.getvalue())
        archive.comment = b"0" * _DIGEST_LENGTH  # replaced by the digest of everything before it
    blob = buffer.getvalue()[:-_DIGEST_LENGTH]
    return blob + hashlib.sha256(blob).hexdigest().encode()


# ---------------------------------------------------------------- loading


def _read_regular_file(path: str | os.PathLike) -> bytes:
    """The bytes of ``path``, which must be a regular file (checked before opening, so that a
    FIFO or a device cannot block the read, and again on the open descriptor)."""
    name = os.fspath(path)
    if not stat.S_ISREG(os.stat(path).st_mode):  # follows links: a link to a FIFO is a FIFO
        raise ValueError(f"{name} is not a regular file (a FIFO, device, directory or a link to one)")
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{name} is not a regular file (it was replaced while being opened)")
        blob = file.read(info.st_size + 1)
    if len(blob) != info.st_size:
        raise ValueError(f"{name} changed size while it was read")
    return blob


def _numpy_dtype(code: Any, path: str) -> np.dtype:
    if not isinstance(code, str) or code not in _NAMES:
        raise TypeError(f"{path}: unsupported dtype {code!r}; weight files hold {sorted(_NAMES)}")
    if code == "BF16":
        ml_dtypes = sys.modules.get("ml_dtypes")  # loaded by jax or torch_ref; not imported here
        if ml_dtypes is None:
            raise TypeError(f"{path} holds bfloat16 weights: import ml_dtypes (or jax) to read them")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_NAMES[code])


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_shape(shape: Any, key: str, path: str) -> None:
    if not (isinstance(shape, list) and len(shape) <= _MAX_RANK and all(map(_is_index, shape))):
        raise ValueError(f"{path}: tensor {key!r} has an invalid shape {_preview(shape)}")


def _safetensors_entries(header: Mapping[str, Any]) -> list[list[Any]]:
    return [
        [key, entry["dtype"], entry["shape"], entry["data_offsets"]]
        for key, entry in header.items()
        if key != "__metadata__"
    ]


def _parse_header(blob: bytes, path: str) -> tuple[dict[str, Any], dict[str, str], bytes]:
    """The tensor entries, the metadata and the data of a safetensors file, all checked for type."""
    if len(blob) < 8:
        raise ValueError(f"{path} is truncated: {len(blob)} bytes, shorter than the 8-byte header size")
    (header_size,) = struct.unpack("<Q", blob[:8])
    if header_size > min(_MAX_HEADER, len(blob) - 8):
        raise ValueError(
            f"{path} is truncated or not safetensors: its header claims {header_size} bytes, "
            f"the file has {len(blob) - 8} after the size field"
        )
    text = blob[8 : 8 + header_size]
    try:
        if not text.startswith(b"{"):
            raise ValueError("it does not start with '{'")
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # ValueError: bad JSON, duplicates
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ValueError(f"{path} has a corrupt safetensors header: {reason}") from None
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map str to str, got {_preview(metadata)}")
    for key, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(
                f"{path}: tensor {key!r} must be an object with dtype, shape and data_offsets, "
                f"got {_preview(entry)}"
            )
        offsets = entry["data_offsets"]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_index, offsets))):
            raise ValueError(f"{path}: tensor {key!r} has invalid data_offsets {_preview(offsets)}")
        _check_shape(entry["shape"], key, path)
        _numpy_dtype(entry["dtype"], path)
    return header, metadata, blob[8 + header_size :]


def _parse_safetensors(blob: bytes, path: str) -> dict[str, np.ndarray]:
    header, metadata, data = _parse_header(blob, path)
    params, end = {}, 0
    for key, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, stop = entry["data_offsets"]
        dtype, shape = _numpy_dtype(entry["dtype"], path), entry["shape"]
        if begin != end or stop - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(
                f"{path}: tensor {key!r} ({entry['dtype']}, shape {tuple(shape)}) has data offsets "
                f"[{begin}, {stop}] that do not fit its size or follow the previous tensor"
            )
        if stop > len(data):
            raise ValueError(
                f"{path} is truncated: tensor {key!r} ends at data byte {stop}, the file holds {len(data)}"
            )
        end = stop
        stored = np.frombuffer(data, dtype=_little_endian_dtype(dtype), count=math.prod(shape), offset=begin)
        params[key] = stored.astype(dtype).reshape(shape)  # a native, writable copy
    if end != len(data):
        raise ValueError(
            f"{path} is truncated or has trailing bytes: the header describes {end} data bytes, "
            f"the file holds {len(data)}"
        )
    if _RECORD_KEYS in metadata or _RECORD_DIGEST in metadata:  # written by save_weights
        recorded = (metadata.pop(_RECORD_KEYS, None), metadata.pop(_RECORD_DIGEST, None), metadata)
        expected = (json.dumps(list(header)), _digest(_safetensors_entries(header), [data]))
        if recorded not in ((*expected, _FORMAT), (*expected, {})):  # files from before the format tag
            raise ValueError(
                f"{path} was altered: its names, dtypes, shapes, offsets, data or metadata do not match "
                "the SHA-256 recorded when it was saved"
            )
    return {key: params[key] for key in header}  # in the header's order


def _parse_npz(blob: bytes, path: str) -> dict[str, np.ndarray]:
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            infos = _members(archive, path)
            members = [(info, _read_member(archive, info, len(blob), path)) for info in infos]
            comment = archive.comment
    except (zipfile.BadZipFile, EOFError, OSError, struct.error, zlib.error, NotImplementedError) as error:
        # truncated or altered archives: bad CRC, cut members, names that differ between copies
        raise ValueError(f"{path} is not a readable .npz weight file: {error}") from error
    params = {info.filename.removesuffix(".npy"): array for info, array in members}
    record = params.pop(_NPZ_RECORD, None)
    # written by save_weights (one marker may have been altered away, not both): check it all
    if record is not None or re.fullmatch(rb"[0-9a-f]{%d}" % _DIGEST_LENGTH, comment):
        expected = {
            "keys": list(params),
            "sha256": _digest(_npz_entries(params), [array.tobytes() for array in params.values()]),
        }
        whole = hashlib.sha256(blob[:-_DIGEST_LENGTH]).hexdigest().encode()  # the comment's digest
        intact = comment == whole and blob.endswith(whole)
        if not intact or record is None or record.tobytes() != json.dumps(expected).encode():
            raise ValueError(
                f"{path} was altered: its names, dtypes, shapes, data or zip structure do not match "
                "the SHA-256 recorded when it was saved"
            )
    return {name: array.astype(array.dtype.newbyteorder("=")) for name, array in params.items()}


def _members(archive: zipfile.ZipFile, path: str) -> list[zipfile.ZipInfo]:
    """The archive's members, each a plain (stored or deflated, unencrypted) ``.npy``, named once."""
    infos = archive.infolist()
    counts = collections.Counter(info.filename for info in infos)
    if len(counts) != len(infos):
        raise ValueError(f"{path}: duplicate members {sorted(n for n, c in counts.items() if c > 1)}")
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise ValueError(f"{path}: member {info.filename!r} is not a .npy array")
        if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(f"{path}: member {info.filename!r} is encrypted or not stored/deflated")
    return infos


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, file_size: int, path: str) -> np.ndarray:
    """One ``.npy`` member, its claimed sizes checked before it is read, its header before any
    array is built; object arrays (pickle) and non-float dtypes are refused."""
    limit = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED else _MAX_DEFLATE_RATIO)
    if info.compress_size > file_size or info.file_size > limit + 1024:
        raise ValueError(
            f"{path}: member {info.filename!r} claims {info.file_size} bytes from "
            f"{info.compress_size} in a {file_size}-byte file"
        )
    stream = io.BytesIO(archive.read(info))
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _NPY_HEADERS:
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran_order, dtype = _NPY_HEADERS[version](stream)
    except (ValueError, TypeError, SyntaxError, RecursionError, OverflowError) as error:
        raise ValueError(f"{path}: member {info.filename!r} has a corrupt .npy header: {error}") from None
    name = info.filename
    weight = dtype.kind == "f" and dtype.name in _NPZ_FLOATS
    if not weight and not (name == _NPZ_RECORD + ".npy" and dtype == np.uint8):
        needs = " (loading it would need pickle)" if dtype.hasobject else ""
        raise TypeError(f"{path}: member {name!r} has dtype {dtype}{needs}; .npz weights are {_NPZ_FLOATS}")
    data = stream.read()
    if len(shape) > _MAX_RANK or len(data) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{path}: member {name!r} ({dtype}, shape {shape}) holds {len(data)} bytes of data")
    array = np.frombuffer(data, dtype=dtype).reshape(shape[::-1] if fortran_order else shape)
    return np.ascontiguousarray(array.T if fortran_order else array)


def _little_endian_dtype(dtype: np.dtype) -> np.dtype:
    """safetensors stores little-endian data (bfloat16 from ml_dtypes has no byte order)."""
    return dtype if dtype.name == "bfloat16" else dtype.newbyteorder("<")


def _little_endian(array: np.ndarray) -> np.ndarray:
    return array.astype(_little_endian_dtype(array.dtype), copy=False)


def _preview(value: Any) -> str:
    """A short ``repr`` for error messages about hostile headers (bounded in depth and length)."""
    return reprlib.repr(value)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    counts = collections.Counter(key for key, _ in pairs)
    if len(counts) != len(pairs):
        raise ValueError(f"duplicate names in the header: {sorted(k for k, n in counts.items() if n > 1)}")
    return dict(pairs)
