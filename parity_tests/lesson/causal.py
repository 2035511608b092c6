"""Section 3.5: hiding future tokens (both ways, and the notes' variants), dropout, CausalAttention."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

import jax_attn
import numpy_attn
import torch_ref
from numpy_attn import causal as numpy_causal
from numpy_attn import ops
from parity_tests.lesson.code import excerpt, joined, three
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.notes import INPUTS, TOKENS, batch, notes_module, notes_steps
from parity_tests.walkthrough import FRAMEWORKS, Shown
from torch_ref import causal as torch_causal
from torch_ref import recording
from torch_ref import self_attention as torch_self_attention

__all__ = ["causal_attention", "dropout", "masking", "renormalised", "softmax_again"]

SOFTMAX = {"torch": lambda x: torch.softmax(x, dim=-1), "numpy": numpy_attn.softmax, "jax": jax_attn.softmax}
WHERE = {"torch": torch.where, "numpy": np.where, "jax": jnp.where}
CAUSAL_FORWARD = torch_causal.CausalAttention.forward


def renormalised(attn_weights: Any, mask_simple: Any) -> Any:
    """The book's way 1: the weights above the diagonal zeroed by the ``tril`` mask, each row
    divided by its new sum."""
    masked_simple = attn_weights * mask_simple
    row_sums = masked_simple.sum(axis=-1, keepdims=True)
    return masked_simple / row_sums


def softmax_again(attn_weights: Any, mask: Any, softmax: Any, where: Any) -> Any:
    """Note 002's way 1: the *weights* set to -inf above the diagonal, then a second softmax."""
    attn_weights_masked = where(mask, -np.inf, attn_weights)
    return softmax(attn_weights_masked / 2**0.5)


def _masks() -> dict[str, Any]:
    """The causal mask (True = hidden) in each framework, as the reference code builds it."""
    return {
        "torch": torch.triu(torch.ones(6, 6), diagonal=1).bool(),
        "numpy": numpy_attn.causal_mask(6),
        "jax": jax_attn.causal_mask(6),
    }


def _way_2(name: str) -> dict[str, Any]:
    """The weights of ``CausalAttention`` holding the weights of the notes' example ``name``."""
    module = torch_ref.load_params(
        torch_ref.CausalAttention(3, 2, 6, 0.0).eval(), torch_ref.to_params(notes_module(name))
    )
    x, params = INPUTS[None], torch_ref.to_params(module)
    kwargs = {"context_length": 6, "dropout": 0.0, "return_steps": True}
    return {
        "torch": module(torch.from_numpy(x), return_steps=True)[1]["attn_weights"][0],
        "numpy": numpy_attn.causal_attention(params, x, **kwargs)[1]["attn_weights"][0],
        "jax": jax_attn.causal_attention(params, jnp.asarray(x), **kwargs)[1]["attn_weights"][0],
    }


def masking() -> list[Shown]:
    steps = {f: notes_steps(f, "004/SelfAttentionV2", INPUTS) for f in FRAMEWORKS}
    weights = {f: s["attn_weights"] for f, s in steps.items()}
    masks = _masks()
    way_1 = {f: renormalised(weights[f], ~masks[f]) for f in FRAMEWORKS}
    way_2 = _way_2("004/SelfAttentionV2")
    apart = float(np.abs(np.asarray(way_1["numpy"]) - np.asarray(way_2["numpy"])).max())
    own_way_1 = excerpt(renormalised, "masked_simple =", "row_sums =", "return")
    weights_002 = {f: notes_steps(f, "002/SelfAttentionV2", INPUTS)["attn_weights"] for f in FRAMEWORKS}
    map_of = {"tokens": TOKENS}
    return [
        shown(
            "attention weights before masking (note 004's nn.Linear SelfAttention_v1, seed 123)",
            three(
                (torch_self_attention.SelfAttentionV2.forward, "attn_weights ="),
                (ops.scaled_dot_product_attention, "attn_weights = softmax"),
            ),
            weights,
            PRINTED["linear_attn_weights"],
            "every token sees every token",
            **map_of,
        ),
        shown(
            "the causal mask, True = hidden: the keys after each query",
            three(
                (torch_causal.CausalAttention.__init__, "self.register_buffer"),
                (ops.causal_mask, "query_positions =", "return"),
            ),
            masks,
            PRINTED["mask"],
            "tril(ones), its complement, keeps the diagonal and below",
            **map_of,
        ),
        shown(
            "way 1 (the book): softmax, then zero the future with tril, then renormalise",
            dict.fromkeys(FRAMEWORKS, own_way_1),
            way_1,
            None,
            "the same lines in every framework; the book's example, no note prints it",
            **map_of,
        ),
        shown(
            "way 2: -inf above the diagonal, then one softmax",
            three(
                (CAUSAL_FORWARD, "attn_scores.masked_fill_", "attn_weights ="),
                (ops.scaled_dot_product_attention, "if mask", "attn_weights = softmax"),
            ),
            way_2,
            None,
            f"equal to way 1: max |way 1 - way 2| = {apart:.1e} (exp(-inf) = 0)",
            **map_of,
        ),
        shown(
            "note 004's way 1 renormalises the raw scores, not the weights",
            dict.fromkeys(FRAMEWORKS, own_way_1),
            {f: renormalised(s["attn_scores"], ~masks[f]) for f, s in steps.items()},
            PRINTED["raw_scores_renormalised"],
            "masked_simple = attn_scores * mask_simple: not a softmax, so not the causal weights",
            **map_of,
        ),
        shown(
            "note 002's way 1 masks the weights and applies softmax again",
            dict.fromkeys(FRAMEWORKS, excerpt(softmax_again, "attn_weights_masked =", "return")),
            {f: softmax_again(weights_002[f], masks[f], SOFTMAX[f], WHERE[f]) for f in FRAMEWORKS},
            PRINTED["softmax_twice"],
            "a softmax of weights (note 002's V2): nearly uniform rows, not the causal weights",
            **map_of,
        ),
    ]


def dropout() -> list[Shown]:
    ones = np.ones((6, 6), np.float32)
    torch.manual_seed(123)
    layer = torch.nn.Dropout(0.5)
    torch_dropped = layer(torch.from_numpy(ones))
    keep = torch_dropped.numpy() != 0
    numpy_code = joined(
        excerpt(ops.dropout, "keep_mask = draw_keep_mask", "return x"), excerpt(ops.draw_keep_mask, "return")
    )
    jax_code = joined(
        excerpt(jax_attn.ops.dropout, "keep_mask = draw_keep_mask", "return x"),
        excerpt(jax_attn.ops.draw_keep_mask, "return"),
    )
    keep_code = three((recording.dropout_or_keep, "return x"), (ops.dropout, "return x *"))
    return [
        shown(
            "Dropout(0.5) on ones, each framework's own generator under seed 123",
            {
                "torch": excerpt(recording.dropout_or_keep, "if keep_mask"),
                "numpy": numpy_code,
                "jax": jax_code,
            },
            {
                "torch": torch_dropped,
                "numpy": numpy_attn.dropout(ones, 0.5, rng=np.random.default_rng(123)),
                "jax": jax_attn.dropout(jnp.asarray(ones), 0.5, key=jax.random.key(123)),
            },
            PRINTED["dropout_ones"],
            "kept entries are scaled by 1 / (1 - 0.5) = 2",
            by_design="three generators, three masks: torch's draws are the notes', the others their own",
        ),
        shown(
            "the same keep-mask everywhere (torch's draws, True = keep)",
            keep_code,
            {
                "torch": recording.dropout_or_keep(layer, torch.from_numpy(ones), torch.from_numpy(keep)),
                "numpy": numpy_attn.dropout(ones, 0.5, keep_mask=keep),
                "jax": jax_attn.dropout(jnp.asarray(ones), 0.5, keep_mask=jnp.asarray(keep)),
            },
            PRINTED["dropout_ones"],
            "the layers take it as attn_keep_mask: training runs that compare exactly",
        ),
    ]


def causal_attention() -> list[Shown]:
    kwargs = {"context_length": 6, "dropout": 0.0}
    steps = {f: notes_steps(f, "CausalAttention", batch(), **kwargs) for f in FRAMEWORKS}
    lines = ("keys =", "queries =", "values =", "attn_scores =", "attn_scores.masked_fill_", "attn_weights =")
    numpy_lines = ("queries =", "keys =", "values =", "mask =", "context_vec, steps =")
    return [
        shown(
            "attention weights of the first sequence",
            {
                "torch": excerpt(CAUSAL_FORWARD, *lines),
                "numpy": excerpt(numpy_causal.causal_attention, *numpy_lines),
                "jax": excerpt(jax_attn.causal.causal_attention, *numpy_lines),
            },
            {f: s["attn_weights"][0] for f, s in steps.items()},
            None,
            "CausalAttention(3, 2, 6, 0.0) under seed 123; the rows sum to 1 over the visible keys",
            tokens=TOKENS,
        ),
        shown(
            "the context vectors: both sequences are the same sentence",
            three((CAUSAL_FORWARD, "context_vec ="), (ops.scaled_dot_product_attention, "context_vec =")),
            {f: s["output"] for f, s in steps.items()},
            PRINTED["ca_v2"],
        ),
    ]
