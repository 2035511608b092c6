"""``attn-parity walkthrough``: the book's chapters 3 and 4 (and its Llama 3 / Qwen3 bonus material)
replayed in their order, in three frameworks.

Each stage is a section of the book. It computes what the notes (``shared/notes``) print for the
book's code, on their input ("Your journey starts with one step") and with the weights they drew
(``torch.manual_seed(123)``), once with torch_ref, once with numpy_attn and once with jax_attn; it
shows the source lines that compute each step in the three, the values once, each framework's
largest difference from torch_ref, and what the notes print beside them. The GPT stage runs the
book's chapter-4 model (GPT_CONFIG_124M, 163 million weights, seed 123) on the book's token ids.
The last two stages, RoPE and grouped-query attention, come from the bonus notebooks of the book's
repository (ch05/07_gpt_to_llama, ch05/11_qwen3); the notes stop at chapter 4, so only the shapes
and weight count a notebook prints are ticked against a print, the rest against torch_ref alone.
The stages are listed here without any framework; ``Stage.run`` computes one with the modules of
``parity_tests.lesson``, which need torch and jax.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from parity_tests.compare import StepRow
    from parity_tests.lesson.code import Code
    from parity_tests.lesson.printed import Printed

__all__ = ["FRAMEWORKS", "STAGES", "Shown", "Stage"]

FRAMEWORKS = ("torch", "numpy", "jax")


@dataclass(frozen=True)
class Shown:
    """One step of a stage: the source lines computing it in each framework (``code``), its value
    in each (``values``, float64; a mask boolean), each other framework's comparison with torch_ref
    (``rows``, the tolerance table's), what the notes print for it (``printed``), a line on what it
    is (``note``: which row, which head, the shapes) and, where the frameworks differ on purpose,
    why (``by_design``)."""

    label: str
    code: dict[str, Code]
    values: dict[str, np.ndarray]
    rows: dict[str, StepRow]
    printed: Printed | None = None
    note: str = ""
    by_design: str = ""
    tokens: tuple[str, ...] = field(default=())  # the query/key labels of a (T, S) map

    @property
    def boolean(self) -> bool:
        return self.values["torch"].dtype == np.bool_

    def matches(self, framework: str) -> bool:
        """``framework``'s value is torch_ref's within the tolerance (or differs by design)."""
        return bool(self.by_design) or self.rows[framework].ok

    def printed_agrees(self) -> bool | None:
        """None when the notes print nothing for this step; else whether every framework's value
        prints as the notes' (torch_ref's alone where the frameworks differ by design)."""
        if self.printed is None:
            return None
        frameworks = ("torch",) if self.by_design else FRAMEWORKS
        return all(self.printed.agrees(self.values[f]) for f in frameworks)

    @property
    def ok(self) -> bool:
        return all(self.matches(f) for f in FRAMEWORKS[1:]) and self.printed_agrees() is not False


@dataclass(frozen=True)
class Stage:
    """One section of the book: ``show`` names the function (``module:function`` of
    ``parity_tests.lesson``) that computes what it shows."""

    name: str
    section: str
    text: str
    show: str

    def function(self) -> Callable[[], list[Shown]]:
        """The function computing this stage (importing it imports torch and jax)."""
        module, function = self.show.split(":")
        return getattr(importlib.import_module(f"parity_tests.lesson.{module}"), function)

    def run(self) -> list[Shown]:
        """The steps of this stage, in each framework."""
        return self.function()()


STAGES: list[Stage] = [
    Stage(
        "one-query",
        "3.3.1 A simple self-attention mechanism without trainable weights",
        "The dot product of x^2 ('journey') with every token scores their similarity; normalising "
        "the scores (by their sum, then with softmax) gives attention weights, and the weighted sum "
        "of the inputs is the context vector z^2. The lines shown compute every query at once; the "
        "values are row 1, query x^2.",
        "simple:one_query",
    ),
    Stage(
        "softmax",
        "3.3.1 Softmax: the naive formula and the stable one",
        "exp(x) / sum(exp(x)) overflows for large scores (exp(1000) is inf, inf / inf is NaN); "
        "subtracting the row maximum first gives the same weights without overflow.",
        "simple:softmax",
    ),
    Stage(
        "all-queries",
        "3.3.2 Computing attention weights for all input tokens",
        "One matrix product scores every pair of tokens; a softmax over each row and a second "
        "product give all context vectors.",
        "simple:all_queries",
    ),
    Stage(
        "trainable-one-query",
        "3.4.1 Computing the attention weights step by step",
        "Queries, keys and values are projections of the inputs by three weight matrices "
        "(torch.rand under seed 123, as the book draws them); the scores are scaled by sqrt(d_k) "
        "before the softmax. The values are row 1, query x^2.",
        "trainable:one_query",
    ),
    Stage(
        "self-attention-classes",
        "3.4.2 Implementing a compact self-attention Python class",
        "The same computation packaged as classes: raw (d_in, d_out) matrices used as x @ W "
        "(SelfAttention_v1), then nn.Linear layers, which store (d_out, d_in) weights and compute "
        "x @ W.T (SelfAttention_v2).",
        "trainable:classes",
    ),
    Stage(
        "causal-masking",
        "3.5.1 Applying a causal attention mask",
        "Token t may attend to tokens 0..t only. Way 1 (the book): softmax, zero the weights above "
        "the diagonal with tril, renormalise the rows. Way 2: -inf above the diagonal before the "
        "softmax. Both give the same weights; the notes' variants of way 1 do not.",
        "causal:masking",
    ),
    Stage(
        "dropout",
        "3.5.2 Masking additional attention weights with dropout",
        "Dropout zeroes weights with probability p and scales the rest by 1 / (1 - p). Each "
        "framework draws from its own generator, so the same seed gives different masks; one "
        "keep-mask passed everywhere makes the runs identical.",
        "causal:dropout",
    ),
    Stage(
        "causal-attention",
        "3.5.3 Implementing a compact causal attention class",
        "Projections, causal mask, softmax, dropout and context for one head, on a batch of two "
        "copies of the sentence.",
        "causal:causal_attention",
    ),
    Stage(
        "wrapper",
        "3.6.1 Stacking multiple single-head attention layers",
        "Two independent causal heads, their outputs concatenated: width num_heads * d_out.",
        "heads:wrapper",
    ),
    Stage(
        "multi-head",
        "3.6.2 Implementing multi-head attention with weight splits",
        "One projection per role, split into heads (torch: view, then transpose(1, 2)), attention "
        "in every head at once, the heads merged back and an output projection.",
        "heads:multi_head",
    ),
    Stage(
        "fused",
        "Beyond the book: one fused Wqkv projection (note 003)",
        "Another author's classes: one Wqkv projection whose thirds are the queries, keys and "
        "values; FusedCausalAttention ORs the causal mask with a padding mask (True = padding).",
        "heads:fused",
    ),
    Stage(
        "gpt-parts",
        "4.1-4.3 Token ids, layer normalization and GELU",
        "The GPT reads token ids; LayerNorm shifts and scales each row to mean 0 and variance 1 "
        "(then learns a scale and a shift), on the book's torch.randn(2, 5) under seed 123; GELU is "
        "the smooth ReLU of the feed-forward network.",
        "gpt_parts:gpt_parts",
    ),
    Stage(
        "gpt",
        "4.4-4.7 The GPT model, from token ids to the next tokens",
        "The book's GPT_CONFIG_124M (12 blocks of 12 heads, 163 million weights, seed 123) on the "
        "book's token ids: the embeddings, the first block's LayerNorm, attention, shortcut and "
        "feed-forward network, the logits and the greedy next tokens (about 15 s).",
        "gpt:gpt",
    ),
    Stage(
        "rope",
        "Bonus ch05/07: rotary position embeddings (RoPE)",
        "Llama and Qwen add no position embeddings: RoPE turns each query and key head by its "
        "position. The head's vector is cut into halves x1, x2 and pair i, (x1[i], x2[i]), turns by "
        "p * inv_freq[i] at position p, so a query-key score depends on their distance alone; "
        "Llama 3 slows the low frequencies. On the settings of the book's bonus notebooks "
        "(ch05/07_gpt_to_llama: random queries and keys under seed 123, LLAMA31_CONFIG_8B's "
        "scaling); they print none of these values, so each tick is the three frameworks' agreement.",
        "rope:rope",
    ),
    Stage(
        "gqa",
        "Bonus ch05/07, ch05/11: RMSNorm, grouped-query attention, QK-norm",
        "RMSNorm divides by the root mean square (no mean, no shift). Grouped-query attention "
        "shares G key/value heads among N query heads: query head n reads head n // (N/G). Qwen3 "
        "RMS-normalises each query and key head before RoPE (QK-norm; ch05/11_qwen3). The book's "
        "GQA of width 4096 gives the shapes its notebook prints (ch05/07_gpt_to_llama); the steps "
        "run on a small config of this project's: GroupedQueryAttention(d_in=3, num_heads=4, "
        "num_kv_groups=2, head_dim=2, qk_norm=True) under seed 123, on the notes' sentence.",
        "grouped:gqa",
    ),
]
