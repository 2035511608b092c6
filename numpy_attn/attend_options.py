"""What ``attend`` and ``attend_heads`` are asked, in three groups: what hides keys
(``Masking``), dropout on the attention weights (``AttnDropout``) and how the core computes
(``ComputePath``). Framework-neutral: numpy_attn and jax_attn take the same objects, holding
NumPy or JAX arrays (and a NumPy ``Generator`` or a JAX PRNG key as the random source)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numpy_attn.implementation import DEFAULT_BLOCK_SIZE

__all__ = ["AttnDropout", "ComputePath", "Masking", "check_option_types"]


@dataclass(frozen=True)
class Masking:
    """What hides keys from queries: ``causal`` hides key s from query t when s > t (self-attention:
    ``attend`` refuses it with T != S);
    ``padding_mask`` is bool ``(B, S)``, True = padding (hidden from every query), or None."""

    causal: bool = False
    padding_mask: Any = None


@dataclass(frozen=True)
class AttnDropout:
    """Dropout on the attention weights: ``rate`` (None or 0: none), drawn from ``rng`` (a NumPy
    ``Generator`` in numpy_attn, a JAX PRNG key in jax_attn) or given as ``keep_mask`` (bool
    ``(..., T, S)``, True = keep). Without either the call is deterministic (eval mode)."""

    rate: float | None = None
    rng: Any = None
    keep_mask: Any = None


@dataclass(frozen=True)
class ComputePath:
    """How the core computes: ``implementation`` (see ``numpy_attn.implementation``), the
    ``block_size`` of the blockwise path and, for ``attend_heads``, whether the QKV projection
    runs as one matmul (``fused_qkv``: the layer decides, by ``fuses_projections``)."""

    implementation: str = "reference"
    block_size: int = DEFAULT_BLOCK_SIZE
    fused_qkv: bool = False


def check_option_types(masking: Any, dropout: Any, path: Any) -> None:
    """``attend``'s and ``attend_heads``' options are a ``Masking``, an ``AttnDropout`` and a
    ``ComputePath``: a TypeError naming the argument otherwise (None included: the defaults
    are the objects built without arguments)."""
    options = (("masking", masking, Masking), ("dropout", dropout, AttnDropout), ("path", path, ComputePath))
    for name, value, option in options:
        if not isinstance(value, option):
            raise TypeError(f"{name} must be a numpy_attn.{option.__name__}, got {type(value).__name__}")
