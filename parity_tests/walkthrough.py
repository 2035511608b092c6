"""``attn-parity walkthrough``: the notes replayed in their order, in three frameworks side by side.

Each stage computes what the notes print, on their input ("Your journey starts with one step")
and with the weights they drew (``torch.manual_seed(123)``), once with torch_ref, once with
numpy_attn and once with jax_attn, and shows the three results next to the call that made each.
The stages are listed here without any framework; ``Stage.run`` computes one with
``parity_tests.walkthrough_shows``, which needs torch and jax.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

__all__ = ["FRAMEWORKS", "STAGES", "Shown", "Stage"]

FRAMEWORKS = ("torch", "numpy", "jax")


@dataclass(frozen=True)
class Shown:
    """One tensor the notes print, computed in each framework by the call beside it."""

    label: str
    calls: dict[str, str]  # framework -> the call that computes it
    values: dict[str, np.ndarray]  # framework -> result (float64)
    boolean: bool = False  # a mask: shown as 0/1
    by_design: bool = False  # the frameworks differ on purpose (the label says why)

    def max_difference(self, framework: str) -> float:
        expected, actual = self.values["torch"], self.values[framework]
        finite = np.isfinite(expected) & np.isfinite(actual)
        same_special = np.array_equal(np.isnan(expected), np.isnan(actual))
        return float(np.abs(expected[finite] - actual[finite]).max(initial=0.0)) if same_special else np.inf


@dataclass(frozen=True)
class Stage:
    """One stage of the notes: ``show`` names the function of ``parity_tests.walkthrough_shows``
    that computes what it shows."""

    name: str
    title: str
    text: str
    show: str

    def run(self) -> list[Shown]:
        """The tensors of this stage, in each framework (imports torch and jax)."""
        return getattr(importlib.import_module("parity_tests.walkthrough_shows"), self.show)()


STAGES: list[Stage] = [
    Stage(
        "one-query",
        "Attention for one query, without weights",
        "The dot product of x^2 ('journey') with every token scores their similarity; "
        "normalising the scores gives attention weights, and the weighted sum of the inputs is "
        "the context vector z^2.",
        "one_query",
    ),
    Stage(
        "all-queries",
        "Every query at once",
        "One matrix product scores every pair of tokens; a "
        "softmax over each row and a second product give all context vectors.",
        "all_queries",
    ),
    Stage(
        "softmax",
        "Naive versus stable softmax",
        "exp(x) / sum(exp(x)) overflows for large "
        "scores; subtracting the row maximum first gives the same result without overflow.",
        "softmax",
    ),
    Stage(
        "trainable-one-query",
        "Trainable weights, one query",
        "Queries, keys and values are "
        "projections of the inputs (note 002's randn weights under seed 123); scores are "
        "scaled by sqrt(d_k) before the softmax.",
        "trainable_one_query",
    ),
    Stage(
        "self-attention-classes",
        "SelfAttentionV1 and SelfAttentionV2",
        "The same computation "
        "packaged as classes: raw (d_in, d_out) matrices used as x @ W (V1), then nn.Linear "
        "layers storing (d_out, d_in) weights used as x @ W.T (V2).",
        "classes",
    ),
    Stage(
        "causal-masking",
        "Hiding future tokens, both ways",
        "Multiply by tril and renormalise "
        "(note 004), or put -inf above the diagonal before the softmax: a single softmax, and "
        "the same weights.",
        "causal_mask",
    ),
    Stage(
        "dropout",
        "Dropout",
        "Dropout zeroes weights with probability p and scales the rest by "
        "1 / (1 - p). Each framework draws from its own generator, so the same seed gives "
        "different masks; passing one keep-mask everywhere makes the runs identical.",
        "dropout",
    ),
    Stage(
        "causal-attention",
        "CausalAttention",
        "Projections, causal mask, softmax, dropout, context: one head, batched.",
        "causal_attention",
    ),
    Stage(
        "wrapper",
        "MultiHeadAttentionWrapper",
        "Two independent causal heads, outputs concatenated: width num_heads * d_out.",
        "multi_head_attention_wrapper",
    ),
    Stage(
        "multi-head",
        "MultiHeadAttention",
        "One projection per role split into heads with "
        "view + transpose(1, 2), attention per head, heads merged back, output projection.",
        "multi_head_attention",
    ),
    Stage(
        "fused",
        "The fused classes (note 003)",
        "One Wqkv projection whose thirds are the "
        "queries, keys and values; FusedCausalAttention ORs the causal mask with a padding "
        "mask (True = padding).",
        "fused",
    ),
]
