"""How a layer computes, decided once for numpy_attn and jax_attn.

``"reference"`` is the notes' math, one (T, S) matrix per head; ``"blockwise"`` the O(T)-memory
path (online softmax over key blocks, hidden causal blocks skipped); ``"auto"`` blockwise from
``AUTO_BLOCKWISE_TOKENS`` query tokens on, the reference math below (benchmarks/README.md).
``attend`` takes its options in three frozen groups of NumPy or JAX values: what hides keys
(``Masking``), dropout on the attention weights (``AttnDropout``), how to compute (``ComputePath``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numpy_attn.checks import check_size

IMPLEMENTATIONS = ("reference", "blockwise", "auto")
AUTO_BLOCKWISE_TOKENS = 512
DEFAULT_BLOCK_SIZE = 512  # keys per block of one sequence (numpy_attn: of the batch, / isqrt(B))


def check_implementation(implementation: Any, block_size: Any) -> None:
    """One of ``IMPLEMENTATIONS`` (ValueError) and a positive int block size."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    check_size("block_size", block_size)


def uses_blockwise(implementation: str, num_queries: int) -> bool:
    """Whether a call with ``num_queries`` query tokens runs the blockwise path."""
    return num_queries >= AUTO_BLOCKWISE_TOKENS if implementation == "auto" else implementation == "blockwise"


def fuses_projections(implementation: str, num_tokens: int) -> bool:
    """Whether ``attend_heads`` projects queries, keys and values in one matmul: on a fast path whose
    core is the reference math (``"auto"``, short sequences); not before the blockwise loops, where
    XLA would copy the product's thirds apart."""
    return implementation != "reference" and not uses_blockwise(implementation, num_tokens)


@dataclass(frozen=True)
class Masking:
    """What hides keys: ``causal``, key s from query t when s > t (T = S); ``padding_mask``, bool
    ``(B, S)``, True = padding (hidden from every query), or None."""

    causal: bool = False
    padding_mask: Any = None


@dataclass(frozen=True)
class AttnDropout:
    """Dropout on the attention weights: ``rate`` (None or 0: none), drawn from ``rng`` (a NumPy
    ``Generator``; a JAX key in jax_attn) or given as ``keep_mask`` (bool ``(..., T, S)``, True =
    keep). With neither, the call is deterministic (eval mode)."""

    rate: float | None = None
    rng: Any = None
    keep_mask: Any = None


@dataclass(frozen=True)
class ComputePath:
    """How the core computes: the ``implementation``, the blockwise ``block_size`` and, for
    ``attend_heads``, whether the QKV projection is one matmul (``fused_qkv``)."""

    implementation: str = "reference"
    block_size: int = DEFAULT_BLOCK_SIZE
    fused_qkv: bool = False
