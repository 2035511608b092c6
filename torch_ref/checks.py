"""The notes' one constructor check, as an error that survives ``python -O``."""

from __future__ import annotations

__all__ = ["check_divisible"]


def check_divisible(name: str, width: int, num_heads: int) -> None:
    """The notes' ``assert width % num_heads == 0``: ValueError "``name`` must be divisible by num_heads"."""
    if width % num_heads != 0:
        raise ValueError(f"{name} must be divisible by num_heads")
