"""Weight files: the weights format saved as safetensors or ``.npz``, never pickle.

``save_weights(path, params)`` writes ``.safetensors`` (read and written here with NumPy alone,
following the format's specification) or ``.npz``; ``load_weights(path)`` reads them back and
checks everything it can: the file's structure (a truncated or altered header, data that does
not add up), the data's integrity (safetensors files written here carry a SHA-256 of their data
in ``__metadata__``; ``.npz`` members carry zip CRC-32s), and, given a ``layer``, every key,
shape and dtype against that class, and that every value is finite. Loading never unpickles.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import sys
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from numpy_attn.spec import LAYERS, infer_dims, param_shapes
from numpy_attn.validation import check_finite, check_params

__all__ = ["load_weights", "save_weights"]

# safetensors dtype codes <-> NumPy dtype names (BF16 needs ml_dtypes, see _numpy_dtype)
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_NAMES = {code: name for name, code in _CODES.items()}
_CHECKSUM_KEY = "attn_parity.sha256"
_MAX_HEADER = 100_000_000  # the format's own bound on the JSON header


def save_weights(path: str | os.PathLike, params: Mapping[str, Any]) -> None:
    """Write ``params`` (``dict[str, array]``, floating) to a ``.safetensors`` or ``.npz`` file."""
    arrays = {name: np.ascontiguousarray(value) for name, value in params.items()}
    for name, array in arrays.items():
        if array.dtype.name not in _CODES:
            raise TypeError(
                f"params[{name!r}] has dtype {array.dtype.name}; weight files hold {list(_CODES)}"
            )
    suffix = _suffix(path)
    if suffix == ".npz":
        np.savez(path, **arrays)
        return
    header: dict[str, Any] = {}
    offset = 0
    for name, array in arrays.items():
        header[name] = {
            "dtype": _CODES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    data = b"".join(_little_endian(array).tobytes() for array in arrays.values())
    header["__metadata__"] = {_CHECKSUM_KEY: hashlib.sha256(data).hexdigest()}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded + data)


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
    (TypeError otherwise); without it they must all share one. Values must be finite.
    """
    suffix = _suffix(path)
    params = _read_npz(path) if suffix == ".npz" else _read_safetensors(path)
    dtypes = {array.dtype.name for array in params.values()}
    if dtype is not None and dtypes - {np.dtype(dtype).name}:
        raise TypeError(f"{os.fspath(path)} holds dtypes {sorted(dtypes)}, expected {np.dtype(dtype).name}")
    if len(dtypes) > 1:
        raise TypeError(f"{os.fspath(path)} mixes dtypes {sorted(dtypes)}; weights share one dtype")
    if layer is not None:
        if layer not in LAYERS:
            raise ValueError(f"unknown layer {layer!r}; known layers: {list(LAYERS)}")
        dims = infer_dims(layer, params, num_heads)
        expected = param_shapes(
            layer, d_in=dims.d_in, d_out=dims.d_out, num_heads=dims.num_heads,
            qkv_bias=dims.qkv_bias, out_bias=dims.out_bias,
        )  # fmt: skip
        check_params(params, expected, layer=layer)
    check_finite(params)
    return params


def _suffix(path: str | os.PathLike) -> str:
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix not in (".safetensors", ".npz"):
        raise ValueError(f"weight files are .safetensors or .npz, got {os.fspath(path)!r}")
    return suffix


def _read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
        # truncated or altered archives (bad CRC, cut members), or object arrays needing pickle
        raise ValueError(f"{os.fspath(path)} is not a readable .npz weight file: {error}") from error


def _numpy_dtype(code: str, path: str) -> np.dtype:
    if code not in _NAMES:
        raise ValueError(f"{path}: unsupported dtype {code!r}; weight files hold {sorted(_NAMES)}")
    if code == "BF16":
        ml_dtypes = sys.modules.get("ml_dtypes")  # loaded by jax or torch_ref; not imported here
        if ml_dtypes is None:
            raise TypeError(f"{path} holds bfloat16 weights: import ml_dtypes (or jax) to read them")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_NAMES[code])


def _read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    name = os.fspath(path)
    with open(path, "rb") as file:
        blob = file.read()
    if len(blob) < 8:
        raise ValueError(f"{name} is truncated: {len(blob)} bytes, shorter than the 8-byte header size")
    (header_size,) = struct.unpack("<Q", blob[:8])
    if header_size > min(_MAX_HEADER, len(blob) - 8):
        raise ValueError(
            f"{name} is truncated or not safetensors: its header claims {header_size} bytes, "
            f"the file has {len(blob) - 8} after the size field"
        )
    try:
        header = json.loads(blob[8 : 8 + header_size], object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as error:  # ValueError: bad JSON, duplicate names
        raise ValueError(f"{name} has a corrupt safetensors header: {error}") from error
    if not isinstance(header, dict):
        raise ValueError(f"{name} has a corrupt safetensors header: not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data = blob[8 + header_size :]
    entries = sorted(header.items(), key=lambda item: _offsets(item, name)[0])
    params, end = {}, 0
    for key, entry in entries:
        begin, stop = _offsets((key, entry), name)
        dtype = _numpy_dtype(entry.get("dtype"), name)
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"{name}: tensor {key!r} has an invalid shape {shape!r}")
        if begin != end or stop - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(
                f"{name}: tensor {key!r} ({entry['dtype']}, shape {tuple(shape)}) has data offsets "
                f"[{begin}, {stop}] that do not fit its size or follow the previous tensor"
            )
        if stop > len(data):
            raise ValueError(
                f"{name} is truncated: tensor {key!r} ends at data byte {stop}, the file holds {len(data)}"
            )
        end = stop
        stored = np.frombuffer(data, dtype=_little_endian_dtype(dtype), count=math.prod(shape), offset=begin)
        params[key] = stored.astype(dtype).reshape(shape)  # a native, writable copy
    if end != len(data):
        raise ValueError(
            f"{name} is truncated or has trailing bytes: the header describes {end} data bytes, "
            f"the file holds {len(data)}"
        )
    checksum = metadata.get(_CHECKSUM_KEY)
    if checksum is not None and checksum != hashlib.sha256(data).hexdigest():
        raise ValueError(
            f"{name} was altered: its data does not match the SHA-256 recorded when it was saved"
        )
    return {key: params[key] for key in header}  # in the header's order


def _little_endian_dtype(dtype: np.dtype) -> np.dtype:
    """safetensors stores little-endian data (bfloat16 from ml_dtypes has no byte order)."""
    return dtype if dtype.name == "bfloat16" else dtype.newbyteorder("<")


def _little_endian(array: np.ndarray) -> np.ndarray:
    return array.astype(_little_endian_dtype(array.dtype), copy=False)


def _offsets(item: tuple[str, Any], name: str) -> tuple[int, int]:
    key, entry = item
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise ValueError(f"{name}: tensor {key!r} has invalid data_offsets {offsets!r}")
    return offsets[0], offsets[1]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(
            f"duplicate tensor names in the header: {sorted({k for k in keys if keys.count(k) > 1})}"
        )
    return dict(pairs)
