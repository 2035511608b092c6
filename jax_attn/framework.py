"""jax_attn's side of numpy_attn's door: what JAX does otherwise than NumPy.

Randomness is a ``jax.random`` key (``key=``); bfloat16 is computed too; float64 needs JAX's 64-bit
mode (JAX would compute it in float32 without a word); values are known only outside ``jax.jit``,
``jax.grad`` and ``jax.vmap`` (inside, the checks see shapes and dtypes, at trace time); and an
eager layer call runs the very program ``jax.jit`` compiles for it, so that eager and jitted
results are bit-identical (its static arguments: the spec's sizes and rates, the implementation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from numpy_attn import checks, memory
from numpy_attn.door import Framework


def check_key(key: Any, name: str = "key") -> None:
    """None, or one ``jax.random`` key: a typed key (``jax.random.key(seed)``) or a raw ``uint32``
    one (``jax.random.PRNGKey(seed)``); TypeError otherwise, ValueError for a batch of keys."""
    if key is None:
        return
    dtype = getattr(key, "dtype", None)
    typed = isinstance(key, jax.Array) and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    raw = isinstance(key, jax.Array) and dtype == np.uint32 and key.shape[-1:] == (2,)
    if not (typed or raw):
        got = (
            f"{key!r} ({type(key).__name__})"
            if dtype is None
            else f"an array of dtype {dtype}, shape {key.shape}"
        )
        raise TypeError(f"{name} must be a jax.random key (jax.random.key(seed)) or None, got {got}")
    batch = tuple(key.shape) if typed else tuple(key.shape[:-1])
    if batch:
        raise ValueError(
            f"{name} must be one jax.random key, got a batch of keys of shape {batch}: "
            f"pass one of them ({name}[0])"
        )


def _without_x64(dtype: Any) -> bool:
    return np.dtype(dtype) == np.float64 and not jax.config.jax_enable_x64


def check_x64(name: str, value: Any) -> None:
    """TypeError for a float64 array while JAX's 64-bit mode is off (under an outer ``jax.jit`` JAX
    has cast it to float32 already: its own rule)."""
    if _without_x64(value.dtype):
        raise TypeError(
            f"{name} has dtype float64, which JAX computes in float32 unless 64-bit mode is on: "
            "call jax.config.update('jax_enable_x64', True) at start-up (or compute inside "
            "`with jax.enable_x64(True):`), or pass float32 arrays"
        )


def _traced(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(map(_traced, value.values()))
    return isinstance(value, jax.core.Tracer)


class _Frozen(dict):
    """A mapping as a static ``jax.jit`` argument (a GPT's config): hashed by its hashable items."""

    def __hash__(self) -> int:  # type: ignore[override]
        items = []
        for item in sorted(self.items(), key=lambda item: str(item[0])):
            try:
                items.append(hash(item))
            except TypeError:  # a list from config.json: compared, not hashed
                continue
        return hash(tuple(items))


class JaxFramework(Framework):
    package = "jax_attn"
    floats = checks.JAX_FLOATS
    random = "key"
    array_types = (jax.Array,)

    def check_random(self, value: Any, name: str | None = None) -> None:
        check_key(value, name or self.random)

    def check_dtype(self, dtype: Any) -> np.dtype:
        resolved = checks.check_dtype_argument(dtype, self.floats)
        if _without_x64(resolved):
            raise TypeError(
                "dtype=float64 needs JAX's 64-bit mode: call jax.config.update('jax_enable_x64', True) at "
                "start-up (or construct inside `with jax.enable_x64(True):`), or pass dtype=jnp.float32"
            )
        return resolved

    def memory_bytes(self) -> int:
        """An accelerator's memory (its ``bytes_limit``), or this process's on the CPU."""
        stats = jax.local_devices()[0].memory_stats() or {}  # this process's (jax.distributed: not all are)
        return stats.get("bytes_limit") or memory.memory_bytes()

    def cache_length(self, cache: Any) -> int | None:
        return None if isinstance(cache.length, jax.core.Tracer) else int(cache.length)

    def split_random(self, random: Any) -> tuple[Any, Any]:
        return (None, None) if random is None else tuple(jax.random.split(random))

    def head_random(self, random: Any, head: int) -> Any:
        return None if random is None else jax.random.fold_in(random, head)

    def check_operands(self, *, optional: tuple[str, ...] = (), **arrays: Any) -> None:
        for name, value in arrays.items():  # float64 refused as such before any mismatch is named
            if value is not None or name not in optional:
                checks.check_floating(value, self.floats, name)
                check_x64(name, value)
        checks.check_operands(self.floats, optional=optional, **arrays)

    def check_float64(self, name: str, value: Any) -> None:
        check_x64(name, value)

    def concrete(self, values: Mapping[str, Any]) -> bool:
        return not any(map(_traced, values.values()))

    def read(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return arguments  # JAX reads NumPy arrays as they are

    def compile(self, fn: Callable[..., Any], static: tuple[str, ...]) -> Callable[..., Any]:
        """``run(with_steps, **arguments)``: ``fn`` compiled by ``jax.jit`` (``static`` arguments
        static), returning the steps only ``with_steps`` (XLA drops what is not returned)."""
        programs = {
            True: jax.jit(fn, static_argnames=static),
            False: jax.jit(lambda **arguments: fn(**arguments)[0], static_argnames=static),
        }

        def run(with_steps: bool, **arguments: Any) -> Any:
            frozen = {
                name: _Frozen(v) for name, v in arguments.items() if name in static and isinstance(v, Mapping)
            }
            result = programs[with_steps](**{**arguments, **frozen})
            return result if with_steps else (result, None)

        return run
