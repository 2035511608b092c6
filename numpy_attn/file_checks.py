"""The structural checks of a weight file, on its first bytes, before any of its data is read.

A safetensors file's size field and JSON header, an ``.npz``'s zip directory and each member's
``.npy`` header are checked in full against the bounds that keep any refusal within about a second
and without a large allocation, whatever the file: at most ``MAX_TENSORS`` tensors, ``MAX_HEADER``
bytes of header or zip directory, members that inflate to at most ``MAX_NPZ_EXPANSION`` times the
file's size (or ``NPZ_EXPANSION_FLOOR`` bytes). The formats' libraries then read the data
(``numpy_attn.weights_file``). Each check raises ValueError (TypeError for a dtype) naming the file
and what is wrong with it.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import reprlib
import struct
import sys
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

MAX_TENSORS = 10_000  # the most tensors a weight file holds (GPT-2 XL has 580)
MAX_HEADER = 8 << 20  # bytes of safetensors header or zip directory (the format allows 100 MB)
MAX_NPZ_EXPANSION = 10  # an .npz's members inflate to at most this many times the file's size...
NPZ_EXPANSION_FLOOR = 64 << 20  # ... or this many bytes (weights deflate to about 1:1.1, zeros 1000:1)
_MAX_DEFLATE_RATIO = 1100  # deflate expands at most ~1032:1: a member claiming more lies
ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}  # the weights' dtypes in safetensors
_ANY_ITEMSIZE = {**ITEMSIZE, "BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8}  # a buffer's too
NPZ_FLOATS = ("float16", "float32", "float64")  # .npy has no bfloat16
NOT_UTF8 = "names must be text that UTF-8 can encode (not a lone surrogate)"
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class _TooManyTensors(ValueError):
    pass


def check_count(count: int, where: str) -> None:
    if count > MAX_TENSORS:
        raise _TooManyTensors(f"{where} holds more than {MAX_TENSORS} tensors, the most a weight file holds")


def check_header_size(size: int, where: str, what: str) -> None:
    if size > MAX_HEADER:
        raise ValueError(
            f"{where}: a {what} of {size} bytes, more than the {MAX_HEADER} a weight file may have"
        )


def is_utf8(name: str) -> bool:
    """Whether UTF-8 can encode ``name``: not a lone surrogate (zip and safetensors store UTF-8)."""
    return not any("\ud800" <= char <= "\udfff" for char in name)


def parse_json(text: bytes, failure: str, **options: Any) -> Any:
    """``text`` parsed as UTF-8 JSON (``json.loads`` with ``options``); ValueError ``failure: the
    reason`` where it is not (not UTF-8, bad JSON, a duplicate name, too many digits, too deep)."""
    try:
        return json.loads(text.decode("utf-8"), **options)
    except _TooManyTensors:  # a header's bound, which names the file itself
        raise
    except (ValueError, RecursionError) as error:  # ValueError: UnicodeDecodeError too
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ValueError(f"{failure}: {reason}") from None


def check_safetensors_header(
    file: BinaryIO, size: int, path: str, skip: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, str]]:
    """A safetensors file's tensor entries (in the header's order) and metadata, read from its first
    bytes and checked in full: JSON of bounded size and count, each entry's name, dtype (a weight's,
    unless its name ends with one of ``skip``), shape and offsets, laid end to end to exactly the
    file's size."""
    if size < 8:
        raise ValueError(f"{path} is truncated: {size} bytes, shorter than the 8-byte header size")
    (header_size,) = struct.unpack("<Q", file.read(8))
    if header_size > size - 8:
        raise ValueError(
            f"{path} is truncated or not safetensors: its header claims {header_size} bytes, the file has "
            f"{size - 8} after the size field"
        )
    check_header_size(header_size, path, "header")
    text, corrupt = file.read(header_size), f"{path} has a corrupt safetensors header"
    if not text.startswith(b"{"):
        raise ValueError(f"{corrupt}: it does not start with '{{'")
    header = parse_json(text, corrupt, object_pairs_hook=_header_objects(path))
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise ValueError(f"{path}: __metadata__ must map str to str, got {reprlib.repr(metadata)}")
    check_count(len(header), path)
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
    if not is_utf8(key):  # JSON can spell a lone surrogate; the safetensors library refuses it too
        raise ValueError(f"{path}: tensor {key!r}: {NOT_UTF8}")
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
    if not isinstance(dtype, str) or dtype not in (_ANY_ITEMSIZE if _skipped(key, skip) else ITEMSIZE):
        raise TypeError(f"{path}: unsupported dtype {dtype!r}; weight files hold {sorted(ITEMSIZE)}")
    if dtype == "BF16" and "ml_dtypes" not in sys.modules:  # loaded by jax or torch_ref; not imported here
        raise TypeError(f"{path} holds bfloat16 weights: import ml_dtypes (or jax) to read them")
    return offsets


def check_zip_directory(file: BinaryIO, path: str) -> None:
    """Bound the zip directory before ``zipfile`` reads it: at most ``MAX_HEADER`` bytes, and at most
    ``MAX_TENSORS`` members (and the record) as its end record claims and as its entries count
    (``_directory_entries``: zipfile reads every entry whatever the end record says)."""
    end = zipfile._EndRecData(file)  # the end record ZipFile reads, found as ZipFile finds it
    if end is None:
        raise zipfile.BadZipFile("File is not a zip file")
    check_count(end[zipfile._ECD_ENTRIES_TOTAL] - 1, path)
    check_header_size(end[zipfile._ECD_SIZE], path, "zip directory")
    start = end[zipfile._ECD_LOCATION] - end[zipfile._ECD_SIZE]  # ZipFile's start_dir
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    file.seek(max(start, 0))
    check_count(_directory_entries(file.read(end[zipfile._ECD_SIZE])) - 1, path)
    file.seek(0)


def _directory_entries(directory: bytes) -> int:
    """At least as many entries as ``zipfile`` reads from this zip directory: each begins with the
    central directory's signature (names may hold it too: the count errs high only)."""
    return directory.count(zipfile.stringCentralDir)


def check_npz_members(archive: zipfile.ZipFile, size: int, path: str) -> list[zipfile.ZipInfo]:
    """The archive's members, each a plain (stored or deflated, unencrypted) ``.npy`` named once,
    whose claimed sizes can be true and together inflate within the bound."""
    infos = archive.infolist()
    check_count(len(infos) - 1, path)  # whatever _directory_entries counted
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
    if inflated > max(MAX_NPZ_EXPANSION * size, NPZ_EXPANSION_FLOOR):  # a zip bomb
        raise ValueError(
            f"{path}: its members inflate to {inflated} bytes, more than {MAX_NPZ_EXPANSION} times the "
            f"file's {size} (and than {NPZ_EXPANSION_FLOOR}); weights do not compress so far"
        )
    return infos


def check_npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, record: str) -> None:
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
    weight = dtype.kind == "f" and dtype.name in NPZ_FLOATS
    if not weight and not (name == f"{record}.npy" and dtype == np.uint8):
        needs = " (loading it would need pickle)" if dtype.hasobject else ""
        raise TypeError(f"{path}: member {name!r} has dtype {dtype}{needs}; .npz weights are {NPZ_FLOATS}")
    if data != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{path}: member {name!r} ({dtype}, shape {shape}) holds {data} bytes of data")


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    return bool(skip) and name.endswith(skip)


def _duplicates(names: list[str]) -> list[str]:
    return sorted(name for name, count in collections.Counter(names).items() if count > 1)


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


def _header_objects(path: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """``json.loads``' hook for a header's objects: refuses duplicate names, and stops the parse once
    there are more objects than a file's tensors (and the header and its ``__metadata__``)."""
    counted = itertools.count(-1)

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        check_count(next(counted), path)
        header = dict(pairs)
        if len(header) != len(pairs):
            raise ValueError(f"duplicate names in the header: {_duplicates([name for name, _ in pairs])}")
        return header

    return hook
