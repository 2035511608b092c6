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

from numpy_attn.spec import SPECS, LayerSpec

__all__ = ["CAUSAL_LAYERS", "DROPOUT_LAYERS", "FUNCTION_NAMES", "SHAPES", "Case", "case_product"]

# torch class name -> numpy_attn / jax_attn function name (from the layer specs)
FUNCTION_NAMES: dict[str, str] = {name: spec.function for name, spec in SPECS.items()}
# the classes that hide later tokens (they take a context length), and those with dropout
CAUSAL_LAYERS = [name for name, spec in SPECS.items() if spec.context]
DROPOUT_LAYERS = [name for name, spec in SPECS.items() if spec.dropouts]


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
    def spec(self) -> LayerSpec:
        return SPECS[self.layer]

    @property
    def function_name(self) -> str:
        return self.spec.function

    @property
    def fused(self) -> bool:
        return "hidden_size" in self.spec.constructor

    @property
    def input_shape(self) -> tuple[int, ...]:
        width = self.d_out if self.fused else self.d_in
        if self.spec.input_layout == "(T, D)":
            return (self.tokens, width)
        return (self.batch, self.tokens, width)

    @property
    def attn_shape(self) -> tuple[int, ...]:
        """Shape of the attention weights (and of an ``attn_keep_mask``)."""
        heads = (self.num_heads,) if self.spec.multi_head else ()
        return self.input_shape[:-2] + heads + (self.tokens, self.tokens)

    def constructor_arguments(self, dropout: float = 0.0) -> dict[str, Any]:
        """The torch class's constructor arguments for this case, by name."""
        ctx = self.context_length or self.tokens
        values = {
            "d_in": self.d_in, "d_out": self.d_out, "hidden_size": self.d_out, "num_heads": self.num_heads,
            "context_length": ctx, "context_size": ctx, "dropout": dropout, "attn_drop": dropout,
            "out_drop": dropout, "qkv_bias": self.bias, "bias": self.bias, "out_bias": self.out_bias,
        }  # fmt: skip
        return {name: values[name] for name in self.spec.constructor}

    def kwargs(self, dropout: float = 0.0) -> dict[str, Any]:
        """Keyword arguments of the numpy_attn / jax_attn function (the constructor arguments
        that the weights cannot tell)."""
        arguments = self.constructor_arguments(dropout)
        return {name: arguments[name] for name in self.spec.arguments}

    def build_torch(self, dropout: float = 0.0):
        """The torch_ref module with weights drawn under ``torch.manual_seed(seed)``, cast to
        the case's dtype, in eval mode."""
        import torch

        import torch_ref

        torch.manual_seed(self.seed)
        module = getattr(torch_ref, self.layer)(**self.constructor_arguments(dropout))
        return module.to(getattr(torch, self.dtype)).eval()

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
