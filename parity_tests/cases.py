"""The layers under test, and one named case = one layer, one shape, one dtype, one seed.

A ``Case`` knows how to build the torch_ref module (weights drawn by torch under its seed), the
input (drawn by NumPy under its seed) and the keyword arguments of the numpy_attn / jax_attn
function with the same name, so every test, the report and the CLI build runs the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

__all__ = ["FUNCTION_NAMES", "SHAPES", "Case", "case_product"]

# torch class name -> numpy_attn / jax_attn function name
FUNCTION_NAMES: dict[str, str] = {
    "SelfAttentionV1": "self_attention_v1",
    "SelfAttentionV2": "self_attention_v2",
    "CausalAttention": "causal_attention",
    "MultiHeadAttentionWrapper": "multi_head_attention_wrapper",
    "MultiHeadAttention": "multi_head_attention",
    "FusedSingleHeadAttention": "fused_single_head_attention",
    "FusedMultiHeadAttention": "fused_multi_head_attention",
    "FusedCausalAttention": "fused_causal_attention",
}


@dataclass(frozen=True)
class Case:
    """One parity case. ``d_in``/``d_out`` are the book classes' widths; the fused classes use
    ``hidden_size = d_out`` (so that it divides by ``num_heads``) as both widths. ``bias`` is
    ``qkv_bias`` (book classes) or ``bias`` (fused); ``out_bias`` only concerns
    ``MultiHeadAttention``. ``context_length`` defaults to ``tokens``."""

    layer: str
    batch: int = 2
    tokens: int = 6
    d_in: int = 3
    d_out: int = 4
    num_heads: int = 2
    bias: bool = False
    out_bias: bool = True
    context_length: int | None = None
    dtype: str = "float32"
    seed: int = 0

    @property
    def id(self) -> str:
        ctx = self.context_length or self.tokens
        return (
            f"{self.layer}-B{self.batch}-T{self.tokens}-ctx{ctx}-in{self.d_in}-out{self.d_out}"
            f"-N{self.num_heads}-bias{int(self.bias)}-{self.dtype}"
        )

    @property
    def function_name(self) -> str:
        return FUNCTION_NAMES[self.layer]

    @property
    def fused(self) -> bool:
        return self.layer.startswith("Fused")

    @property
    def input_shape(self) -> tuple[int, ...]:
        width = self.d_out if self.fused else self.d_in
        if self.layer in ("SelfAttentionV1", "SelfAttentionV2"):
            return (self.tokens, width)
        return (self.batch, self.tokens, width)

    @property
    def attn_shape(self) -> tuple[int, ...]:
        """Shape of the attention weights (and of an ``attn_keep_mask``)."""
        heads = (
            ()
            if self.layer
            in ("SelfAttentionV1", "SelfAttentionV2", "CausalAttention", "FusedSingleHeadAttention")
            else (self.num_heads,)
        )
        return self.input_shape[:-2] + heads + (self.tokens, self.tokens)

    def kwargs(self, dropout: float = 0.0) -> dict[str, Any]:
        """Keyword arguments of the numpy_attn / jax_attn function (the constructor arguments
        that the weights cannot tell)."""
        ctx = self.context_length or self.tokens
        return {
            "SelfAttentionV1": {},
            "SelfAttentionV2": {},
            "CausalAttention": {"context_length": ctx, "dropout": dropout},
            "MultiHeadAttentionWrapper": {
                "num_heads": self.num_heads,
                "context_length": ctx,
                "dropout": dropout,
            },
            "MultiHeadAttention": {
                "num_heads": self.num_heads,
                "context_length": ctx,
                "dropout": dropout,
            },
            "FusedSingleHeadAttention": {},
            "FusedMultiHeadAttention": {"num_heads": self.num_heads},
            "FusedCausalAttention": {
                "num_heads": self.num_heads,
                "context_size": ctx,
                "attn_drop": dropout,
                "out_drop": dropout,
            },
        }[self.layer]

    def build_torch(self, dropout: float = 0.0):
        """The torch_ref module with weights drawn under ``torch.manual_seed(seed)``, cast to
        the case's dtype, in eval mode."""
        import torch

        import torch_ref

        torch.manual_seed(self.seed)
        cls = getattr(torch_ref, self.layer)
        ctx = self.context_length or self.tokens
        n, bias = self.num_heads, self.bias
        args = {
            "SelfAttentionV1": (self.d_in, self.d_out),
            "SelfAttentionV2": (self.d_in, self.d_out, bias),
            "CausalAttention": (self.d_in, self.d_out, ctx, dropout, bias),
            "MultiHeadAttentionWrapper": (self.d_in, self.d_out, ctx, dropout, n, bias),
            "MultiHeadAttention": (self.d_in, self.d_out, ctx, dropout, n, bias, self.out_bias),
            "FusedSingleHeadAttention": (self.d_out, bias),
            "FusedMultiHeadAttention": (self.d_out, n, bias),
            "FusedCausalAttention": (self.d_out, n, ctx, dropout, dropout, bias),
        }[self.layer]
        module = cls(*args).to(getattr(torch, self.dtype))
        return module.eval()

    def make_input(self, scale: float = 1.0) -> np.ndarray:
        """Standard-normal input (times ``scale``) drawn under the case's seed, in its dtype."""
        x = np.random.default_rng(self.seed).standard_normal(self.input_shape) * scale
        return _as_dtype(x, self.dtype)

    def with_(self, **changes: Any) -> Case:
        return replace(self, **changes)


def _as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16)
    return x.astype(dtype)


# Named shapes of the parity table: (batch, tokens, context_length, d_in, d_out, num_heads).
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "one_token": (1, 1, 4, 3, 4, 2),  # T = 1, batch 1, T < context_length
    "full_context": (3, 6, 6, 5, 6, 3),  # T = context_length, batch 3, d_in != d_out
    "one_head": (2, 5, 8, 4, 4, 1),  # num_heads = 1
    "head_size_one": (1, 4, 5, 3, 4, 4),  # num_heads = d_out (head size 1)
    "wide": (2, 16, 16, 32, 32, 4),  # a larger model, d_in = d_out
}


def case_product(
    layers: list[str], shapes: list[str], biases: list[bool], dtypes: list[str]
) -> Iterator[Case]:
    """Every combination, each a named ``Case``."""
    for layer, shape, bias, dtype in itertools.product(layers, shapes, biases, dtypes):
        batch, tokens, ctx, d_in, d_out, heads = SHAPES[shape]
        yield Case(layer, batch, tokens, d_in, d_out, heads, bias, True, ctx, dtype)
