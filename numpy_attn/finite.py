"""The weights' values, where they are concrete: no NaN or inf, and none made by a cast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

_FINITE_CHUNK = 1 << 20  # values tested at a time: no copy of large weights


def check_finite(params: Mapping[str, Any]) -> None:
    """ValueError naming the first weight with NaN or inf (where values are concrete), tested
    ``_FINITE_CHUNK`` values at a time: no copy of the weights is made."""
    flats = [np.asarray(value).ravel() for value in params.values()]  # views of contiguous arrays
    if sum(flat.size for flat in flats) <= _FINITE_CHUNK and np.isfinite(np.concatenate(flats or [[]])).all():
        return  # a layer's small weights: one test
    for key, flat in zip(params, flats, strict=True):
        chunks = (flat[i : i + _FINITE_CHUNK] for i in range(0, flat.size, _FINITE_CHUNK))
        if not all(np.isfinite(chunk).all() for chunk in chunks):
            raise ValueError(f"params[{key!r}] has non-finite values (NaN or inf)")


def check_cast_finite(params: Mapping[str, Any], dtypes: Mapping[str, Any]) -> None:
    """ValueError naming the first finite weight that a cast to its variable's dtype (``dtypes``)
    would make inf (1e5 into float16), in torch_ref's words."""
    for key, value in params.items():
        flat, dtype = np.asarray(value).ravel(), np.dtype(dtypes[key])
        if flat.dtype == dtype or flat.dtype.itemsize < dtype.itemsize:
            continue
        with np.errstate(over="ignore"):  # the overflow is what is looked for
            fits = all(
                np.isfinite(flat[i : i + _FINITE_CHUNK].astype(dtype)).all()
                for i in range(0, flat.size, _FINITE_CHUNK)
            )
        if not fits:
            largest = float(
                (np.array(np.inf, dtype).view(f"u{dtype.itemsize}") - 1).view(dtype)
            )  # bfloat16 too
            raise ValueError(
                f"params[{key!r}] has values too large for the module's dtype {dtype.name} "
                f"(largest finite {largest:.6g})"
            )
