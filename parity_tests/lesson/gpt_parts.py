"""Sections 4.1-4.3: the book's token ids, LayerNorm on the book's example, and GELU."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

import jax_attn
import numpy_attn
import torch_ref
from numpy_attn import gpt as numpy_gpt
from parity_tests.book_gpt import batch_ids
from parity_tests.lesson.code import excerpt, three
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.walkthrough import FRAMEWORKS, Shown
from torch_ref import gpt as torch_gpt

__all__ = ["gpt_parts", "row_mean", "row_variance"]


def row_mean(x: Any) -> Any:
    """Each row's mean, kept as a column."""
    return x.mean(axis=-1, keepdims=True)


def row_variance(x: Any) -> Any:
    """Each row's variance, dividing by n (``unbiased=False``: what LayerNorm divides by)."""
    return ((x - row_mean(x)) ** 2).mean(axis=-1, keepdims=True)


def gpt_parts() -> list[Shown]:
    torch.manual_seed(123)
    batch_example = torch.randn(2, 5)
    x = batch_example.numpy()
    weights = {"scale": np.ones(5, np.float32), "shift": np.zeros(5, np.float32)}
    normed = {
        "torch": torch_ref.LayerNorm(5)(batch_example).detach(),
        "numpy": numpy_attn.layer_norm(weights, x),
        "jax": jax_attn.layer_norm({k: jnp.asarray(v) for k, v in weights.items()}, jnp.asarray(x)),
    }
    lines = ("mean =", "var =", "norm_x =", "return")
    points = np.linspace(-3, 3, 7, dtype=np.float32)
    gelu = {
        "torch": torch_ref.GELU()(torch.from_numpy(points)),
        "numpy": numpy_attn.gelu(points),
        "jax": jax_attn.gelu(jnp.asarray(points)),
    }
    ids = batch_ids()
    return [
        shown(
            "token ids of 'Every effort moves you' and 'Every day holds a'",
            dict.fromkeys(FRAMEWORKS, excerpt(batch_ids, "return")),
            {"torch": torch.from_numpy(ids), "numpy": ids, "jax": jnp.asarray(ids)},
            PRINTED["batch_ids"],
            "tiktoken's GPT-2 encoding of the two texts, one id per token",
        ),
        shown(
            "LayerNorm(emb_dim=5) of torch.randn(2, 5) under seed 123",
            three((torch_gpt.LayerNorm.forward, *lines), (numpy_gpt.layer_norm, *lines)),
            normed,
            note="scale 1 and shift 0 until trained; eps = 1e-5 keeps the division finite",
        ),
        shown(
            "its rows' means",
            dict.fromkeys(FRAMEWORKS, excerpt(row_mean, "return")),
            {f: row_mean(v) for f, v in normed.items()},
            PRINTED["layer_norm_mean"],
            "0 up to float32 rounding: torch prints -0.0000 for a tiny negative",
        ),
        shown(
            "its rows' variances",
            dict.fromkeys(FRAMEWORKS, excerpt(row_variance, "return")),
            {f: row_variance(v) for f, v in normed.items()},
            PRINTED["layer_norm_var"],
            "torch's x.var() divides by n - 1 unless unbiased=False; NumPy's and JAX's divide by n",
        ),
        shown(
            "GELU at -3, -2, ..., 3",
            three((torch_gpt.GELU.forward, "scale =", "return"), (numpy_gpt.gelu, "return")),
            gelu,
            note="about x for large x, about 0 for very negative x, smooth at 0 where ReLU has a kink",
        ),
    ]
