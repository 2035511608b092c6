"""Weight files: the weights format saved as safetensors or ``.npz``, never pickle.

``save_weights(path, params)`` writes ``.safetensors`` (read and written here with NumPy alone,
following the format's specification; the ``safetensors`` library reads these files and writes
files that load here) or ``.npz``; ``load_weights(path)`` reads them back. Loading ends with the
arrays that were saved, or with a ValueError or TypeError that names the problem, whatever the
file holds:

* only regular files are opened or written (a FIFO, a device, a directory or a link to one is
  refused before opening, so that nothing blocks);
* the small parts are read first and the structure is checked in full before any data is read:
  safetensors' size field and header (its JSON's types, duplicate names, nesting; every name,
  dtype, shape and data offset), whose sizes must add up to the file's size; an ``.npz``'s zip
  directory (no encryption, sizes that can be true, members that do not overlap) and every
  member's ``.npy`` header (no pickle, a float dtype, a shape whose size is the member's). Data
  is then read straight into the arrays, never past the size a member claims;
* bounds keep any refusal within about a second: a file holds at most ``MAX_TENSORS`` (10,000)
  tensors (an ``.npz``'s zip directory entries are counted, not its end record's claim), and its
  safetensors header or zip directory at most ``_MAX_HEADER`` (8 MiB);
* an ``.npz``'s members together inflate to at most ``_MAX_NPZ_EXPANSION`` (10) times the
  file's size, or ``_NPZ_EXPANSION_FLOOR`` (64 MiB) for a smaller file: a zip bomb is refused
  from its directory, before anything is inflated (weights compress about 1.1:1);
* files written by ``save_weights`` carry an integrity record: in safetensors,
  ``__metadata__`` holds the key list and a SHA-256 of the header's entries (names, dtypes,
  shapes, data offsets) and of the data; an ``.npz`` holds the key list and a SHA-256 of names,
  dtypes, shapes and data in a reserved member (``__attn_parity__``) and a SHA-256 of every
  byte before it in the zip comment. A changed file is refused or loads exactly what was saved
  (the record covers what the JSON says, not how it spells it: ``\\u00e9`` or ``\\u00E9`` in a
  name); an ``.npz`` with a single changed bit is refused. Files from elsewhere, without the
  record, are checked structurally and load as they are: a 0-d array (a scalar, e.g. old GPT-2
  checkpoints' ``attn.masked_bias``) loads as shape ``()``.

A safetensors file's ``__metadata__`` also says ``"format": "pt"``, as torch's own files do: the
weights are torch's ``state_dict`` in torch's layout, and transformers 4.x loads no file without it.

Weights are float16, float32, float64 (and bfloat16 in safetensors, with ``ml_dtypes``
loaded); integer, bool, complex and object arrays are refused, on saving and on loading.
Big-endian floats are stored little-endian, as safetensors requires, and loaded in the
machine's byte order: the values are exact, only the byte order differs. Saving refuses what
could not come back as it was: a reserved or non-str name, a name UTF-8 cannot encode (a lone
surrogate), a 0-d array, bfloat16 in ``.npz``, an empty mapping, more than the bounds allow.
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
from typing import Any, BinaryIO, NoReturn

import numpy as np

from numpy_attn.checks import (
    JAX_FLOATS,
    check_array,
    check_dtype_argument,
    check_finite,
    check_mapping,
    check_numpy_dtype,
)

__all__ = [
    "MAX_TENSORS",
    "check_regular_file",
    "create_regular_file",
    "load_weights",
    "open_regular_file",
    "save_weights",
]

# safetensors dtype codes <-> NumPy dtype names (BF16 needs ml_dtypes, see _numpy_dtype)
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_NAMES = {code: name for name, code in _CODES.items()}
_NPZ_FLOATS = ["float64", "float32", "float16"]  # .npy has no bfloat16
_RECORD_KEYS = "attn_parity.keys"  # safetensors __metadata__: the key list, as JSON
_RECORD_DIGEST = "attn_parity.sha256"  # ... and the digest of the header's entries and data
_FORMAT = {"format": "pt"}  # safetensors __metadata__: torch's layout and names (transformers 4.x needs it)
_NPZ_RECORD = "__attn_parity__"  # the .npz member holding the key list and the digest
_RESERVED = ("__metadata__", _NPZ_RECORD)
# Bounds that keep any refusal within about a second, whatever the file (docs/hardening.md):
# the most tensors one weight file holds (GPT-2 XL has 580); load_hf_gpt2 bounds a config by it
MAX_TENSORS = 10_000
_MAX_HEADER = 8 << 20  # bytes of safetensors header or zip directory (the format allows 100 MB)
_NPY_HEAD = 12 + 10_000  # a .npy header's magic, version and length, and NumPy's bound on the rest
_MAX_ZIP_NAME = 0xFFFF - len(".npy")  # a zip member's name is at most 65535 bytes
_NOT_UTF8 = "names must be text that UTF-8 can encode (not a lone surrogate)"
_CHUNK = 1 << 20  # bytes read at a time
_MAX_RANK = 64  # NumPy's maximum number of axes
_MAX_ELEMENTS = sys.maxsize // 8  # NumPy's bound on an array's bytes, for the widest weight dtype
_DIGEST_LENGTH = 64  # hex characters of a SHA-256
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so that equal weights give equal files
_MAX_DEFLATE_RATIO = 1100  # deflate expands at most ~1032:1; a larger claimed size is a lie
# an .npz's members declare at most this many times the file's bytes (float weights deflate to
# about 1:1.1; zeros to 1:1000, a zip bomb), or the floor for a smaller file
_MAX_NPZ_EXPANSION = 10
_NPZ_EXPANSION_FLOOR = 64 << 20
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def save_weights(path: str | os.PathLike, params: Mapping[str, Any]) -> None:
    """Write ``params`` (``dict[str, array]``, float16/32/64 or bfloat16, at least 1-D, finite,
    one dtype) to a ``.safetensors`` or ``.npz`` file, with an integrity record (see the module
    docstring): what ``load_weights`` accepts, and nothing else.

    Raises TypeError for a non-str name, a non-floating array or mixed dtypes, ValueError for a
    reserved name (``__metadata__``, ``__attn_parity__``), a name with a NUL character or one
    UTF-8 cannot encode, a 0-d array, non-finite values, bfloat16 in ``.npz``, an empty mapping,
    more tensors or longer names than the bounds allow, or a destination that exists and is not
    a regular file (a FIFO would block): the file is not written.
    """
    suffix = _suffix(path)
    arrays = _checked_arrays(params, suffix)
    # the file's bytes, in pieces (safetensors: the header, then the arrays' own memory)
    pieces = _npz_pieces(arrays) if suffix == ".npz" else _safetensors_pieces(arrays)
    with create_regular_file(path) as file:
        for piece in pieces:
            file.write(piece)


def check_weights(layer, params, num_heads):
    from numpy_attn.checks import check_params
    from numpy_attn.spec import layer_spec, read_arguments

    spec = layer_spec(layer)
    arguments = read_arguments(spec, params, {"num_heads": num_heads} if "num_heads" in spec.constructor else {})
    check_params(params, spec.shapes(**arguments), layer=layer)


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
    (TypeError otherwise; ``dtype`` itself a floating dtype in the machine's byte order,
    ``check_dtype_argument``'s TypeError before the file is read); without it they must all
    share one. Values must be finite. A file
    that is not what ``save_weights`` wrote raises ValueError (TypeError for a dtype that
    weights cannot have); a missing or unreadable file raises the usual OSError.
    """
    suffix = _suffix(path)
    if dtype is not None:  # the dtypes a weight file holds (bfloat16 in safetensors)
        dtype = check_dtype_argument(dtype, JAX_FLOATS)
    name = os.fspath(path)
    with open_regular_file(path) as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(0)
        params = _parse_npz(file, size, name) if suffix == ".npz" else _parse_safetensors(file, size, name)
    dtypes = {array.dtype.name for array in params.values()}
    if dtype is not None and dtypes - {dtype.name}:
        raise TypeError(f"{name} holds dtypes {sorted(dtypes)}, expected {dtype.name}")
    if len(dtypes) > 1:
        raise TypeError(f"{name} mixes dtypes {sorted(dtypes)}; weights share one dtype")
    if layer is not None:
        check_weights(layer, params, num_heads)  # TODO(redesign)
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
    _check_count(len(params), "params")
    arrays = {}
    for name, value in params.items():
        if name in _RESERVED:
            raise ValueError(f"params[{name!r}]: the names {list(_RESERVED)} are reserved by weight files")
        if "\0" in name:
            raise ValueError(f"params[{name!r}]: names may not hold a NUL character (zip cuts them there)")
        if not _is_utf8(name):
            raise ValueError(f"params[{name!r}]: {_NOT_UTF8}")
        if suffix == ".npz" and len(name.encode()) > _MAX_ZIP_NAME:
            raise ValueError(f"params[{name!r}]: a name in .npz holds at most {_MAX_ZIP_NAME} bytes of UTF-8")
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


def _is_utf8(name: str) -> bool:
    """Whether ``name`` is text UTF-8 can encode (zip and the safetensors format store UTF-8)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _digest(entries: list[list[Any]], chunks: list[bytes | np.ndarray]) -> str:
    """SHA-256 of a file's entries (name, dtype, shape[, offsets]) and its data."""
    digest = hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode())
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _safetensors_pieces(arrays: dict[str, np.ndarray]) -> list[bytes | np.ndarray]:
    """The safetensors file of ``arrays``: its length-prefixed header, then each array's bytes."""
    header: dict[str, Any] = {}
    offset = 0
    for name, array in arrays.items():
        header[name] = {
            "dtype": _CODES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    data = [_raw_bytes(array) for array in arrays.values()]  # views of the contiguous arrays
    header["__metadata__"] = {
        **_FORMAT,
        _RECORD_KEYS: json.dumps(list(arrays)),
        _RECORD_DIGEST: _digest(_safetensors_entries(header), data),
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to 8 bytes
    _check_header_size(len(encoded), "params", "header")
    return [struct.pack("<Q", len(encoded)) + encoded, *data]


def _npz_entries(arrays: dict[str, np.ndarray]) -> list[list[Any]]:
    return [[name, array.dtype.name, list(array.shape)] for name, array in arrays.items()]


def _npz_pieces(arrays: dict[str, np.ndarray]) -> list[bytes | memoryview]:
    """The ``.npz`` file of ``arrays``, its digest last: the zip is assembled in memory (one copy of
    the weights), so that its directory is checked before the file is opened."""
    record = {
        "keys": list(arrays),
        "sha256": _digest(_npz_entries(arrays), [_raw_bytes(array) for array in arrays.values()]),
    }
    members = {**arrays, _NPZ_RECORD: np.frombuffer(json.dumps(record).encode(), np.uint8)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in members.items():
            npy_header = io.BytesIO()  # what np.lib.format.write_array writes before the data
            np.lib.format.write_array_header_1_0(npy_header, np.lib.format.header_data_from_array_1_0(array))
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_DATE)
            info.file_size = npy_header.tell() + array.nbytes  # as writestr sets it (zip64 or not)
            with archive.open(info, "w") as member:
                member.write(npy_header.getvalue())
                member.write(_raw_bytes(array))  # the array's memory, not a copy
        archive.comment = b"0" * _DIGEST_LENGTH  # replaced by the digest of everything before it
    _check_zip_directory(buffer, "params")  # what loading allows: names of bounded length
    head = buffer.getbuffer()[:-_DIGEST_LENGTH]
    return [head, hashlib.sha256(head).hexdigest().encode()]


# ---------------------------------------------------------------- loading


def check_regular_file(path: str | os.PathLike, *, missing_ok: bool = False) -> None:
    """Refuse a ``path`` that exists and is not a regular file, before anything opens it: a FIFO
    or a device would block or never end (``os.stat`` follows links: a link to a FIFO is a FIFO)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"{os.fspath(path)} is not a regular file (a FIFO, device, directory or a link to one)"
        )


def _check_still_regular(file: BinaryIO, path: str | os.PathLike) -> None:
    """The same check on the open descriptor (the path may have been replaced in between)."""
    if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
        raise ValueError(f"{os.fspath(path)} is not a regular file (it was replaced while being opened)")


def create_regular_file(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for writing (binary, created or emptied), which must be a regular file if
    it exists (checked before opening, so that a FIFO cannot block the open until a reader
    came, and again on the open descriptor): a ValueError otherwise. Every file numpy_attn
    writes (weights, a checkpoint's config) is opened so."""
    check_regular_file(path, missing_ok=True)
    return _open_checked(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "wb")


def open_regular_file(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading (binary), which must be a regular file (checked before opening,
    so that a FIFO or a device cannot block, and again on the open descriptor): a ValueError
    otherwise. Every file numpy_attn reads (weights, a checkpoint's config) is opened so."""
    check_regular_file(path)
    return _open_checked(path, os.O_RDONLY, "rb")


def _open_checked(path: str | os.PathLike, flags: int, mode: str) -> BinaryIO:
    """``path`` opened with ``flags`` and without blocking (a FIFO that came after the check
    cannot hold the open), then checked again on the open descriptor (closed on a refusal)."""
    file = os.fdopen(os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o666), mode)
    try:
        _check_still_regular(file, path)
    except BaseException:
        file.close()
        raise
    return file


def _read_exactly(file: BinaryIO, count: int, path: str) -> bytes:
    data = file.read(count)
    if len(data) != count:
        _ended_early(path, len(data), count)
    return data


def _ended_early(path: str, read: int, expected: int) -> NoReturn:
    raise ValueError(
        f"{path} ended after {read} of {expected} bytes (a member shorter than it claims, "
        "or the file changed while it was read)"
    )


def _read_array(file: BinaryIO, dtype: np.dtype, shape: tuple[int, ...], path: str) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` read straight from ``file`` into its own memory."""
    array = np.empty(shape, dtype)
    view = array.reshape(-1).view(np.uint8)  # a view: np.empty is C-contiguous
    filled = 0
    while filled < view.size:
        count = file.readinto(view[filled : filled + _CHUNK])  # zip reads copy: in small pieces
        if not count:
            _ended_early(path, filled, view.size)
        filled += count
    return array


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


def _is_shape(shape: Any) -> bool:
    """Whether ``shape`` is one NumPy can make (a zero-size array too) for any weight dtype."""
    return (
        isinstance(shape, list | tuple)
        and len(shape) <= _MAX_RANK
        and all(map(_is_index, shape))
        and math.prod(filter(None, shape)) <= _MAX_ELEMENTS
    )


def _check_shape(shape: Any, key: str, path: str) -> None:
    if not (isinstance(shape, list) and _is_shape(shape)):
        raise ValueError(f"{path}: tensor {key!r} has an invalid shape {_preview(shape)}")


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
    """``json.loads``'s hook for a header's objects: refuses duplicate names, and ends the parse
    as soon as there are more objects than a weight file's tensors (and the header itself and
    its ``__metadata__``), so that a long header is refused in bounded time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.count += 1
        _check_count(self.count - 2, self.path)
        return _no_duplicates(pairs)


def _safetensors_entries(header: Mapping[str, Any]) -> list[list[Any]]:
    return [
        [key, entry["dtype"], entry["shape"], entry["data_offsets"]]
        for key, entry in header.items()
        if key != "__metadata__"
    ]


def _parse_header(file: BinaryIO, size: int, path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensor entries (checked for type, and their offsets against each other and against
    the file's size) and the metadata of a safetensors file: only the size field and the header
    are read, and the file is left where its data begins."""
    if size < 8:
        raise ValueError(f"{path} is truncated: {size} bytes, shorter than the 8-byte header size")
    (header_size,) = struct.unpack("<Q", _read_exactly(file, 8, path))
    if header_size > size - 8:
        raise ValueError(
            f"{path} is truncated or not safetensors: its header claims {header_size} bytes, "
            f"the file has {size - 8} after the size field"
        )
    _check_header_size(header_size, path, "header")
    text = _read_exactly(file, header_size, path)
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
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map str to str, got {_preview(metadata)}")
    _check_count(len(header), path)
    for key, entry in header.items():
        if not _is_utf8(key):  # JSON can spell a lone surrogate; the safetensors library refuses it
            raise ValueError(f"{path}: tensor {key!r}: {_NOT_UTF8}")
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
    end = 0
    for key, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, stop = entry["data_offsets"]
        if (
            begin != end
            or stop - begin != math.prod(entry["shape"]) * _numpy_dtype(entry["dtype"], path).itemsize
        ):
            raise ValueError(
                f"{path}: tensor {key!r} ({entry['dtype']}, shape {tuple(entry['shape'])}) has data offsets "
                f"[{begin}, {stop}] that do not fit its size or follow the previous tensor"
            )
        end = stop
    data_start = 8 + header_size
    if data_start + end != size:
        reason = "is truncated" if data_start + end > size else "has trailing bytes"
        raise ValueError(
            f"{path} {reason}: the header describes {end} data bytes, the file holds {size - data_start} "
            f"({size} bytes in all, {data_start + end} expected)"
        )
    return header, metadata


def _parse_safetensors(file: BinaryIO, size: int, path: str) -> dict[str, np.ndarray]:
    header, metadata = _parse_header(file, size, path)
    stored = {}
    for key, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        dtype = _little_endian_dtype(_numpy_dtype(entry["dtype"], path))
        stored[key] = _read_array(file, dtype, tuple(entry["shape"]), path)
    if _RECORD_KEYS in metadata or _RECORD_DIGEST in metadata:  # written by save_weights
        recorded = (metadata.pop(_RECORD_KEYS, None), metadata.pop(_RECORD_DIGEST, None), metadata)
        data = [_raw_bytes(array) for array in stored.values()]  # in the file's order
        expected = (json.dumps(list(header)), _digest(_safetensors_entries(header), data))
        if recorded not in ((*expected, _FORMAT), (*expected, {})):  # files from before the format tag
            raise ValueError(
                f"{path} was altered: its names, dtypes, shapes, offsets, data or metadata do not match "
                "the SHA-256 recorded when it was saved"
            )
    # in the header's order, in the machine's byte order (no copy where it is little-endian)
    return {key: stored[key].astype(_numpy_dtype(header[key]["dtype"], path), copy=False) for key in header}


def _parse_npz(file: BinaryIO, size: int, path: str) -> dict[str, np.ndarray]:
    try:
        start, directory = _check_zip_directory(file, path)
        with zipfile.ZipFile(_DirectoryServed(file, start, directory)) as archive:
            infos = _members(archive, size, path)
            layouts = {info.filename: _member_layout(archive, info, path) for info in infos}  # first
            params = {
                info.filename.removesuffix(".npy"): _read_member(archive, info, layouts[info.filename], path)
                for info in infos
            }
            comment = archive.comment
    except (
        zipfile.BadZipFile,
        EOFError,
        OSError,
        struct.error,
        zlib.error,
        NotImplementedError,
        UnicodeDecodeError,
    ) as error:
        # truncated or altered archives: bad CRC, cut members, names that differ between copies or
        # are not UTF-8
        raise ValueError(f"{path} is not a readable .npz weight file: {error}") from error
    record = params.pop(_NPZ_RECORD, None)
    # written by save_weights (one marker may have been altered away, not both): check it all
    if record is not None or re.fullmatch(rb"[0-9a-f]{%d}" % _DIGEST_LENGTH, comment):
        expected = {
            "keys": list(params),
            "sha256": _digest(_npz_entries(params), [_raw_bytes(array) for array in params.values()]),
        }
        whole = _head_digest(file, max(size - _DIGEST_LENGTH, 0), path)  # the comment's digest
        intact = comment == whole and file.read() == whole  # and the file ends with it
        if not intact or record is None or record.tobytes() != json.dumps(expected).encode():
            raise ValueError(
                f"{path} was altered: its names, dtypes, shapes, data or zip structure do not match "
                "the SHA-256 recorded when it was saved"
            )
    return {
        name: array.astype(array.dtype.newbyteorder("="), order="C", copy=False)
        for name, array in params.items()
    }


def _head_digest(file: BinaryIO, count: int, path: str) -> bytes:
    """The SHA-256 (hex) of the first ``count`` bytes of ``file``, read in chunks; the file is
    left at byte ``count``."""
    file.seek(0)
    digest = hashlib.sha256()
    for _ in range(count // _CHUNK):
        digest.update(_read_exactly(file, _CHUNK, path))
    digest.update(_read_exactly(file, count % _CHUNK, path))
    return digest.hexdigest().encode()


def _check_zip_directory(file: BinaryIO, path: str) -> tuple[int, bytes]:
    """Bound the central directory before ``zipfile`` reads it (in one read of the size it
    claims): at most ``_MAX_HEADER`` bytes and ``MAX_TENSORS`` members (and the record), both
    as the end record claims and as the directory's entries count. Returns where the directory
    starts and its bytes (``_DirectoryServed`` gives them to ``ZipFile``: read once)."""
    end = zipfile._EndRecData(file)  # the record ZipFile itself reads, found the same way
    if end is None:
        raise zipfile.BadZipFile("File is not a zip file")
    _check_count(end[zipfile._ECD_ENTRIES_TOTAL] - 1, path)
    _check_header_size(end[zipfile._ECD_SIZE], path, "zip directory")
    size = end[zipfile._ECD_SIZE]
    start = end[zipfile._ECD_LOCATION] - size  # ZipFile's start_dir (its offset plus "concat")
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    file.seek(max(start, 0))  # a negative start: ZipFile refuses the file itself
    directory = file.read(size)
    _check_count(_directory_entries(directory, size) - 1, path)
    file.seek(0)
    return start, directory


def _directory_entries(directory: bytes, size: int) -> int:
    """The entries of the zip ``directory`` (``size`` bytes claimed), stepped through as
    ``ZipFile`` reads them (it reads entries until the directory's size is used up, whatever
    the end record's count says), up to one more than a weight file may have: the count stops
    there, so it takes milliseconds."""
    count = position = 0
    while position + zipfile.sizeCentralDir <= min(size, len(directory)) and count <= MAX_TENSORS + 1:
        # the entry's name, extra field and comment lengths follow its 28 fixed bytes
        position += zipfile.sizeCentralDir + sum(struct.unpack_from("<3H", directory, position + 28))
        count += 1
    return count


class _DirectoryServed:
    """``file`` as ``zipfile.ZipFile`` reads it, its read of the zip directory (``directory``'s
    length at ``start``) served from the bytes ``_check_zip_directory`` read, so that the
    directory is read from the file once; every other call goes to ``file``."""

    def __init__(self, file: BinaryIO, start: int, directory: bytes) -> None:
        self._file, self._start, self._directory = file, start, directory

    def read(self, count: int = -1) -> bytes:
        if count == len(self._directory) and self._file.tell() == self._start:
            self._file.seek(count, os.SEEK_CUR)
            return self._directory
        return self._file.read(count)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def _members(archive: zipfile.ZipFile, size: int, path: str) -> list[zipfile.ZipInfo]:
    """The archive's members, each a plain (stored or deflated, unencrypted) ``.npy``, named
    once, whose claimed sizes can be true (checked before any member is read)."""
    infos = archive.infolist()
    _check_count(len(infos) - 1, path)  # as _check_zip_directory counted them before ZipFile read them
    counts = collections.Counter(info.filename for info in infos)
    if len(counts) != len(infos):
        raise ValueError(f"{path}: duplicate members {sorted(n for n, c in counts.items() if c > 1)}")
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise ValueError(f"{path}: member {info.filename!r} is not a .npy array")
        if info.flag_bits & 0x1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(f"{path}: member {info.filename!r} is encrypted or not stored/deflated")
        stored = info.compress_type == zipfile.ZIP_STORED
        limit = info.compress_size if stored else info.compress_size * _MAX_DEFLATE_RATIO + 1024
        if info.compress_size > size or info.file_size > limit or (stored and info.file_size != limit):
            raise ValueError(
                f"{path}: member {info.filename!r} claims {info.file_size} bytes from "
                f"{info.compress_size} in a {size}-byte file"
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


def _member_layout(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str
) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """The dtype, shape, Fortran order and data offset of one ``.npy`` member, from its header
    alone (at most NumPy's bound on a header is read), checked against the size the member
    claims; object arrays (pickle) and non-float dtypes are refused."""
    name = info.filename
    with archive.open(info) as member:
        stream = io.BytesIO(member.read(min(info.file_size, _NPY_HEAD)))
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _NPY_HEADERS:
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran_order, dtype = _NPY_HEADERS[version](stream)
        if not _is_shape(shape):
            raise ValueError(f"invalid shape {_preview(shape)}")
    except (ValueError, TypeError, SyntaxError, RecursionError, OverflowError) as error:
        raise ValueError(f"{path}: member {name!r} has a corrupt .npy header: {error}") from None
    weight = dtype.kind == "f" and dtype.name in _NPZ_FLOATS
    if not weight and not (name == _NPZ_RECORD + ".npy" and dtype == np.uint8):
        needs = " (loading it would need pickle)" if dtype.hasobject else ""
        raise TypeError(f"{path}: member {name!r} has dtype {dtype}{needs}; .npz weights are {_NPZ_FLOATS}")
    offset = stream.tell()
    if info.file_size - offset != math.prod(shape) * dtype.itemsize:
        raise ValueError(
            f"{path}: member {name!r} ({dtype}, shape {shape}) holds {info.file_size - offset} bytes of data"
        )
    return dtype, shape, fortran_order, offset


def _read_member(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    layout: tuple[np.dtype, tuple[int, ...], bool, int],
    path: str,
) -> np.ndarray:
    """One member's array (its layout checked by ``_member_layout``), read straight into it; the
    zip reader stops at the size the member claims, and checks its CRC there."""
    dtype, shape, fortran_order, offset = layout
    with archive.open(info) as member:
        member.read(offset)
        array = _read_array(member, dtype, shape[::-1] if fortran_order else shape, path)
    return array.T if fortran_order else array


def _raw_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of ``array`` in C order, as a flat uint8 view where it is C-contiguous (no copy)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


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
