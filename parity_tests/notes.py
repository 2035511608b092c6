"""The notes' running example, and their modules rebuilt with the weights the notes drew.

Every printed tensor in the notes comes from ``torch.manual_seed(123)`` followed by the draws the
notebook made, in its order. The builders below repeat those draws, so the modules hold exactly
the notes' weights; ``torch_ref.to_params`` then gives the same weights to NumPy and JAX.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

import torch_ref
from parity_tests.frameworks import layer_function

__all__ = ["INPUTS", "SEED", "TOKENS", "batch", "notes_module", "notes_steps"]

SEED = 123
TOKENS = ("Your", "journey", "starts", "with", "one", "step")
INPUTS = np.array(
    [
        [0.43, 0.15, 0.89],  # Your     (x^1)
        [0.55, 0.87, 0.66],  # journey  (x^2)
        [0.57, 0.85, 0.64],  # starts   (x^3)
        [0.22, 0.58, 0.33],  # with     (x^4)
        [0.77, 0.25, 0.10],  # one      (x^5)
        [0.05, 0.80, 0.55],  # step     (x^6)
    ],
    dtype=np.float32,
)


def batch() -> np.ndarray:
    """``torch.stack((inputs, inputs))``: shape (2, 6, 3)."""
    return np.stack([INPUTS, INPUTS])


def _randn_v1() -> torch_ref.SelfAttentionV1:
    """Note 002's ``SelfAttentionV1`` draws ``torch.randn`` (and names them W_q, ...)."""
    module = torch_ref.SelfAttentionV1(3, 2)
    torch.manual_seed(SEED)
    draws = {name: torch.randn(3, 2) for name in ("W_query", "W_key", "W_value")}
    return torch_ref.load_params(module, {k: v.numpy() for k, v in draws.items()})


def notes_module(name: str) -> torch.nn.Module:
    """A torch_ref module holding the weights of the notes' example called ``name``:

    - ``"002/SelfAttentionV1"``: randn weights under seed 123 (also the single-query example);
    - ``"002/SelfAttentionV2"``: built right after those three randn draws;
    - ``"004/SelfAttentionV1"``: ``torch.rand`` weights under seed 123 (the book's class);
    - ``"004/SelfAttentionV2"``: note 004's Linear ``SelfAttention_v1``, seed 123;
    - ``"CausalAttention"``, ``"MultiHeadAttentionWrapper"``, ``"MultiHeadAttention"``: seed 123,
      ``d_in=3, d_out=2, context_length=6, dropout=0.0`` (two heads where there are heads);
    - ``"004/MultiHeadAttentionClass"``: ``d_out=4``, two heads, ``out_proj`` bias off.
    """
    if name == "002/SelfAttentionV1":
        return _randn_v1().eval()
    torch.manual_seed(SEED)
    if name == "002/SelfAttentionV2":
        for _ in range(3):
            torch.randn(3, 2)
        return torch_ref.SelfAttentionV2(3, 2).eval()
    builders = {
        "004/SelfAttentionV1": lambda: torch_ref.SelfAttentionV1(3, 2),
        "004/SelfAttentionV2": lambda: torch_ref.SelfAttentionV2(3, 2),
        "CausalAttention": lambda: torch_ref.CausalAttention(3, 2, 6, 0.0),
        "MultiHeadAttentionWrapper": lambda: torch_ref.MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2),
        "MultiHeadAttention": lambda: torch_ref.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2),
        "004/MultiHeadAttentionClass": lambda: torch_ref.MultiHeadAttention(
            3, 4, 6, 0.0, num_heads=2, qkv_bias=False, out_bias=False
        ),
    }
    if name not in builders:
        known = ["002/SelfAttentionV1", "002/SelfAttentionV2", *builders]
        raise ValueError(f"unknown notes example {name!r}; known: {known}")
    return builders[name]().eval()


def notes_steps(framework: str, name: str, x: np.ndarray, **kwargs: object) -> Mapping[str, object]:
    """The step trace of the notes' example ``name`` (with its notes weights) on ``x``, computed
    by torch_ref (``"torch"``), numpy_attn (``"numpy"``) or jax_attn (``"jax"``)."""
    module = notes_module(name)
    if framework == "torch":
        return module(torch.from_numpy(x), return_steps=True)[1]
    fn = layer_function(framework, type(module).__name__)
    return fn(torch_ref.to_params(module), x, **kwargs, return_steps=True)[1]
