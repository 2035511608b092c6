"""The one place that decides how a layer computes: the implementations, when ``"auto"`` goes
blockwise, when the three projections run as one matmul, and the one default block size.

``"reference"`` is the notes' math, one (T, S) matrix per head; ``"blockwise"`` is the O(T)-memory
path (online softmax over key blocks, hidden causal blocks skipped); ``"auto"`` is blockwise from
``AUTO_BLOCKWISE_TOKENS`` query tokens on and the reference math below, where one (T, S) matrix
per head is small and one matmul per step is fastest. numpy_attn and jax_attn both follow these
rules; benchmarks/README.md holds the measurements behind the thresholds.
"""

from __future__ import annotations

from numpy_attn.validation import check_size

__all__ = [
    "AUTO_BLOCKWISE_TOKENS",
    "DEFAULT_BLOCK_SIZE",
    "IMPLEMENTATIONS",
    "check_implementation",
    "fuses_projections",
    "uses_blockwise",
]

IMPLEMENTATIONS = ("reference", "blockwise", "auto")
AUTO_BLOCKWISE_TOKENS = 512
DEFAULT_BLOCK_SIZE = 512  # keys per block of one sequence (numpy_attn: of the batch, / isqrt(B)), everywhere


def check_implementation(implementation: str, block_size: int) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    check_size("block_size", block_size)


def uses_blockwise(implementation: str, num_queries: int) -> bool:
    """Whether a layer call with ``num_queries`` query tokens runs the blockwise path."""
    auto_blockwise = implementation == "auto" and num_queries >= AUTO_BLOCKWISE_TOKENS
    return implementation == "blockwise" or auto_blockwise


def fuses_projections(implementation: str, num_tokens: int) -> bool:
    """Whether a layer runs its three projections as one matmul (``qkv_projections(fused=True)``):
    on a fast path whose core is the reference math (``"auto"`` on short sequences). Not before
    the blockwise loops: XLA would copy the three thirds of the fused product into separate
    buffers, where three matmuls cost the same time."""
    return implementation != "reference" and not uses_blockwise(implementation, num_tokens)
