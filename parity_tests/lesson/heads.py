"""Section 3.6: multi-head attention, stacked (the wrapper) and with weight splits; note 003's fused class."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

import jax_attn
import numpy_attn
import torch_ref
from jax_attn import ops as jax_ops
from numpy_attn import causal as numpy_causal
from numpy_attn import fused as numpy_fused
from numpy_attn import multi_head as numpy_multi_head
from numpy_attn import ops
from parity_tests.lesson.code import Code, excerpt, joined, three
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.notes import TOKENS, batch, notes_steps
from parity_tests.walkthrough import FRAMEWORKS, Shown
from torch_ref import causal as torch_causal
from torch_ref import fused as torch_fused
from torch_ref import multi_head as torch_multi_head

__all__ = ["fused", "multi_head", "wrapper"]

MHA = torch_multi_head.MultiHeadAttention.forward
HEADS = {"num_heads": 2, "context_length": 6, "dropout": 0.0}
B, T, N, H = 2, 6, 2, 1  # the notes' example: d_out 2 split into 2 heads of size 1


def wrapper() -> list[Shown]:
    steps = {f: notes_steps(f, "MultiHeadAttentionWrapper", batch(), **HEADS) for f in FRAMEWORKS}
    per_head = three(
        (torch_causal.MultiHeadAttentionWrapper.forward, "for i, head"),
        (numpy_causal.multi_head_attention_wrapper, "for i in range"),
    )
    shows = [
        shown(
            f"head {head}: attention weights of the first sequence",
            per_head,
            {f: s[f"heads.{head}.attn_weights"][0] for f, s in steps.items()},
            note=f"head {head} is a CausalAttention of its own weights (the second draws after the first)",
            tokens=TOKENS,
        )
        for head in range(2)
    ]
    concatenated = three(
        (torch_causal.MultiHeadAttentionWrapper.forward, "context_vec = torch.cat"),
        (numpy_causal.multi_head_attention_wrapper, "context_vec = np.concatenate"),
        (jax_attn.causal.multi_head_attention_wrapper, "context_vec = jnp.concatenate"),
    )
    return [
        *shows,
        shown(
            "the heads' outputs concatenated: width num_heads * d_out = 4",
            concatenated,
            {f: s["output"] for f, s in steps.items()},
            PRINTED["wrapper"],
            "columns 0-1 are head 0's (CausalAttention's table), columns 2-3 head 1's",
        ),
    ]


def _split(keys: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keys ``(B, T, E)`` given extra head axes ``(B, T, N, H)``, then heads first ``(B, N, T, H)``,
    each framework with the operations its code shows."""
    viewed = {
        "torch": keys["torch"].view(B, T, N, H),
        "numpy": keys["numpy"].reshape(B, T, N, H),
        "jax": keys["jax"].reshape(B, T, N, H),
    }
    split = {
        "torch": viewed["torch"].transpose(1, 2),
        "numpy": numpy_attn.split_heads(keys["numpy"], N),
        "jax": jax_attn.split_heads(keys["jax"], N),
    }
    return viewed, split


def _split_code() -> tuple[dict[str, Code], dict[str, Code]]:
    view = three((MHA, "keys = keys.view"), (ops.split_heads, "x = x.reshape"))
    transpose = three((MHA, "keys = keys.transpose"), (ops.split_heads, "return"))
    return view, transpose


def _per_head_context(steps: dict[str, Any], values_split: dict[str, Any]) -> dict[str, Any]:
    """``attn_weights @ values`` per head, heads moved back after the tokens: ``(B, T, N, H)``."""
    return {
        "torch": (steps["torch"]["attn_weights"] @ values_split["torch"]).transpose(1, 2),
        "numpy": (steps["numpy"]["attn_weights"] @ values_split["numpy"]).swapaxes(1, 2),
        "jax": (steps["jax"]["attn_weights"] @ values_split["jax"]).swapaxes(1, 2),
    }


def multi_head() -> list[Shown]:
    steps = {f: notes_steps(f, "MultiHeadAttention", batch(), **HEADS) for f in FRAMEWORKS}
    steps["jax"] = {k: jnp.asarray(v) for k, v in steps["jax"].items()}
    keys = {f: s["keys"] for f, s in steps.items()}
    viewed, split = _split(keys)
    values_split = _split({f: s["values"] for f, s in steps.items()})[1]
    view_code, transpose_code = _split_code()
    context_code = {
        "torch": excerpt(MHA, "context_vec = (attn_weights_dropped"),
        "numpy": joined(
            excerpt(ops.scaled_dot_product_attention, "context_vec ="), excerpt(ops.merge_heads, "x = x.")
        ),
        "jax": joined(
            excerpt(jax_ops.scaled_dot_product_attention, "context_vec ="),
            excerpt(jax_ops.merge_heads, "x = x."),
        ),
    }
    heads = [
        shown(
            f"head {head}: attention weights of the first sequence",
            three((MHA, "attn_weights ="), (ops.scaled_dot_product_attention, "attn_weights = softmax")),
            {f: s["attn_weights"][0, head] for f, s in steps.items()},
            note=f"attn_weights[0, {head}]: every head's weights come from one batched matmul",
            tokens=TOKENS,
        )
        for head in range(N)
    ]
    return [
        shown(
            "keys = W_key(x): one projection for all the heads, (B, T, d_out)",
            three((MHA, "keys = self.W_key"), (numpy_multi_head.multi_head_attention, "keys =")),
            keys,
            PRINTED["mha_projected_shape"],
            "queries and values likewise; d_out = num_heads * head_dim = 2 * 1",
        ),
        shown(
            "split: the last axis becomes (num_heads, head_dim)",
            view_code,
            viewed,
            PRINTED["mha_view_shape"],
            "(B, T, N, H): token t's keys of head 0, then of head 1",
        ),
        shown(
            "heads before tokens: transpose(1, 2)",
            transpose_code,
            split,
            PRINTED["mha_heads_shape"],
            "(B, N, T, H): each head a (T, H) matrix, as one CausalAttention's keys",
        ),
        shown(
            "attention scores of every head at once",
            three((MHA, "attn_scores = queries @"), (ops.scaled_dot_product_attention, "attn_scores =")),
            {f: s["attn_scores"] for f, s in steps.items()},
            PRINTED["mha_scores_shape"],
            "(B, N, T, S): a batched matmul over the batch and head axes",
        ),
        *heads,
        shown(
            "the context per head, heads moved back after the tokens",
            context_code,
            _per_head_context(steps, values_split),
            PRINTED["mha_view_shape"],
            "(B, T, N, H)",
        ),
        shown(
            "merged: (B, T, N, H) -> (B, T, d_out)",
            three((MHA, "context_vec = context_vec.contiguous"), (ops.merge_heads, "return")),
            {f: s["context_vec"] for f, s in steps.items()},
            PRINTED["mha_merged_shape"],
            "torch's view needs a contiguous copy after the transpose; reshape copies by itself",
        ),
        shown(
            "output projection: the MultiHeadAttention's output",
            three((MHA, "context_vec = self.out_proj"), (numpy_multi_head.multi_head_attention, "output =")),
            {f: s["output"] for f, s in steps.items()},
            PRINTED["mha"],
        ),
    ]


def fused() -> list[Shown]:
    x = np.concatenate([batch(), np.zeros((2, 6, 1), np.float32)], axis=-1)  # hidden_size 4
    torch.manual_seed(123)
    module = torch_ref.FusedCausalAttention(
        4, num_heads=2, context_size=6, attn_drop=0.0, out_drop=0.0
    ).eval()
    params = torch_ref.to_params(module)
    padding = np.array([[False] * 6, [True, True] + [False] * 4])  # sequence 1: two pad tokens first
    kwargs = {"num_heads": 2, "context_size": 6, "attn_drop": 0.0, "out_drop": 0.0, "return_steps": True}
    traces = {
        "torch": module(torch.from_numpy(x), torch.from_numpy(padding), return_steps=True)[1],
        "numpy": numpy_attn.fused_causal_attention(params, x, padding, **kwargs)[1],
        "jax": jax_attn.fused_causal_attention(params, jnp.asarray(x), jnp.asarray(padding), **kwargs)[1],
    }
    forward = torch_fused.FusedCausalAttention.forward
    return [
        shown(
            "queries: the first third of Wqkv(x), first sequence",
            three(
                (forward, "qkv = self.Wqkv", "x = qkv.reshape", "q, k, v ="),
                (numpy_fused.fused_causal_attention, "qkv =", "queries, keys, values ="),
            ),
            {f: t["queries"][0] for f, t in traces.items()},
            note="FusedCausalAttention(4, 2, 6) under seed 123, on the sentence with a fourth feature 0",
        ),
        shown(
            "head 0's weights of the left-padded sequence",
            three(
                (forward, "combined_mask = self", "if mask is not None", "attn = attn.masked_fill"),
                (numpy_fused.fused_causal_attention, "mask = causal_mask", "if padding_mask"),
            ),
            {f: t["attn_weights"][1, 0] for f, t in traces.items()},
            note="rows 0-1 see only padding",
            by_design="torch's softmax of a row of -inf is NaN; numpy_attn and jax_attn give zeros",
            tokens=("<pad>", "<pad>", *TOKENS[2:]),
        ),
    ]
