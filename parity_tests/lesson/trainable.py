"""Section 3.4: self-attention with trainable weights, one query step by step, then the classes."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

import torch_ref
from jax_attn import ops as jax_ops
from jax_attn import self_attention as jax_self_attention
from numpy_attn import ops
from numpy_attn import self_attention as numpy_self_attention
from parity_tests import notes
from parity_tests.lesson.code import Code, excerpt, joined, three
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.notes import INPUTS, notes_steps
from parity_tests.walkthrough import FRAMEWORKS, Shown
from torch_ref import self_attention as torch_self_attention

__all__ = ["classes", "one_query"]

QUERY = 1  # x^2, "journey"
V1 = torch_self_attention.SelfAttentionV1.forward
V2 = torch_self_attention.SelfAttentionV2.forward


def _steps(name: str) -> dict[str, Any]:
    return {f: notes_steps(f, name, INPUTS) for f in FRAMEWORKS}


def _v1(torch_start: str, numpy_start: str) -> dict[str, Code]:
    return three((V1, torch_start), (numpy_self_attention.self_attention_v1, numpy_start))


def _attention(torch_starts: tuple[str, ...], ops_starts: tuple[str, ...]) -> dict[str, Code]:
    """SelfAttention_v1's lines in torch; the attention core they share in NumPy and JAX."""
    return three((V1, *torch_starts), (ops.scaled_dot_product_attention, *ops_starts))


def one_query() -> list[Shown]:
    steps = _steps("004/SelfAttentionV1")
    row = {"note": "row 1: query x^2 ('journey')"}
    w_query = notes.notes_module("004/SelfAttentionV1").W_query
    params = torch_ref.to_params(notes.notes_module("004/SelfAttentionV1"))
    handed_over = excerpt(notes_steps, "return fn(")
    return [
        shown(
            "W_query: torch.rand(3, 2) under seed 123 (W_key and W_value follow)",
            {
                "torch": excerpt(torch_self_attention.SelfAttentionV1.__init__, "self.W_query"),
                "numpy": handed_over,
                "jax": handed_over,
            },
            {"torch": w_query, "numpy": params["W_query"], "jax": jnp.asarray(params["W_query"])},
            PRINTED["W_query"],
            "torch draws the weights; NumPy and JAX are handed torch's (torch_ref.to_params)",
        ),
        shown(
            "query_2 = x^2 @ W_query",
            _v1("queries =", "queries ="),
            {f: s["queries"][QUERY] for f, s in steps.items()},
            PRINTED["query_2"],
            **row,
        ),
        shown(
            "keys = inputs @ W_key: a key per token",
            _v1("keys =", "keys ="),
            {f: s["keys"] for f, s in steps.items()},
            PRINTED["keys"],
        ),
        shown(
            "key_2",
            _v1("keys =", "keys ="),
            {f: s["keys"][QUERY] for f, s in steps.items()},
            PRINTED["key_2"],
            **row,
        ),
        shown(
            "value_2",
            _v1("values =", "values ="),
            {f: s["values"][QUERY] for f, s in steps.items()},
            PRINTED["value_2"],
            **row,
        ),
        shown(
            "attn_score_22 = query_2 . key_2",
            _attention(("attn_scores =",), ("attn_scores =",)),
            {f: s["attn_scores"][QUERY, QUERY] for f, s in steps.items()},
            PRINTED["attn_score_22"],
            "row 1, column 1 of queries @ keys.T",
        ),
        shown(
            "attn_scores_2 = query_2 @ keys.T",
            _attention(("attn_scores =",), ("attn_scores =",)),
            {f: s["attn_scores"][QUERY] for f, s in steps.items()},
            PRINTED["trainable_attn_scores_2"],
            **row,
        ),
        shown(
            "attn_weights_2 = softmax(attn_scores_2 / sqrt(d_k))",
            _attention(("d_k =", "attn_weights ="), ("attn_weights = softmax",)),
            {f: s["attn_weights"][QUERY] for f, s in steps.items()},
            PRINTED["trainable_attn_weights_2"],
            **row,
        ),
        shown(
            "context_vec_2 = attn_weights_2 @ values",
            _attention(("context_vec =",), ("context_vec =",)),
            {f: s["output"][QUERY] for f, s in steps.items()},
            PRINTED["trainable_context_vec_2"],
            **row,
        ),
        shown(
            "query_2 with note 002's weights: torch.randn instead of torch.rand",
            _v1("queries =", "queries ="),
            {f: s["queries"][QUERY] for f, s in _steps("002/SelfAttentionV1").items()},
            PRINTED["randn_query_2"],
            "note 002 draws from a normal distribution: other weights, other numbers",
        ),
    ]


def classes() -> list[Shown]:
    v2 = {
        "numpy": joined(
            excerpt(numpy_self_attention.self_attention_v2, "queries ="), excerpt(ops.linear, "out =")
        ),
        "jax": joined(
            excerpt(jax_self_attention.self_attention_v2, "queries ="), excerpt(jax_ops.linear, "out =")
        ),
    }
    return [
        shown(
            "SelfAttention_v1(3, 2) under seed 123: every context vector",
            _v1("queries =", "queries ="),
            {f: s["output"] for f, s in _steps("004/SelfAttentionV1").items()},
            PRINTED["sa_v1"],
            "raw (d_in, d_out) matrices: x @ W; row 1 is context_vec_2",
        ),
        shown(
            "SelfAttention_v2(3, 2): nn.Linear projections",
            {"torch": excerpt(V2, "queries ="), **v2},
            {f: s["output"] for f, s in _steps("002/SelfAttentionV2").items()},
            PRINTED["sa_v2"],
            "nn.Linear stores W as (d_out, d_in) and computes x @ W.T (note 002's seed-123 draws)",
        ),
    ]
