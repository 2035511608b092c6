"""Section 3.3: self-attention without trainable weights, for one query and for all of them."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

import jax_attn
import numpy_attn
import torch_ref
from numpy_attn import ops
from numpy_attn import simplified as numpy_simplified
from parity_tests.lesson.code import excerpt, three
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.notes import INPUTS, TOKENS
from parity_tests.walkthrough import FRAMEWORKS, Shown
from torch_ref import simplified as torch_simplified

__all__ = ["all_queries", "one_query", "softmax", "sum_normalised"]

QUERY = 1  # x^2, "journey"


def sum_normalised(attn_scores_2: Any) -> Any:
    """The first normalisation the book tries: each score divided by the sum of the scores."""
    return attn_scores_2 / attn_scores_2.sum()


def _steps() -> dict[str, Any]:
    """``simplified_self_attention``'s steps on the notes' inputs, in each framework."""
    return {
        "torch": torch_ref.simplified_self_attention(torch.from_numpy(INPUTS), return_steps=True)[1],
        "numpy": numpy_attn.simplified_self_attention(INPUTS, return_steps=True)[1],
        "jax": jax_attn.simplified_self_attention(jnp.asarray(INPUTS), return_steps=True)[1],
    }


def _line(start: str) -> dict[str, Any]:
    """The statement of ``simplified_self_attention`` starting with ``start`` in each framework."""
    return three(
        (torch_simplified.simplified_self_attention, start),
        (numpy_simplified.simplified_self_attention, start),
    )


def one_query() -> list[Shown]:
    steps = _steps()
    scores = {f: s["attn_scores"][QUERY] for f, s in steps.items()}
    naive = {
        "torch": torch_ref.softmax_naive(scores["torch"]),
        "numpy": numpy_attn.softmax_naive(scores["numpy"]),
        "jax": jax_attn.softmax_naive(scores["jax"]),
    }
    own = excerpt(sum_normalised, "return")
    row = f"row {QUERY}: query x^2 ('journey') against every token"
    return [
        shown("attention scores of x^2", _line("attn_scores ="), scores, PRINTED["attn_scores_2"], row),
        shown(
            "normalised by their sum",
            dict.fromkeys(FRAMEWORKS, own),
            {f: sum_normalised(s) for f, s in scores.items()},
            PRINTED["attn_weights_2_tmp"],
            "the same line in every framework; the weights sum to 1",
        ),
        shown(
            "normalised by the naive softmax: exp(x) / sum(exp(x))",
            three((torch_simplified.softmax_naive, "return"), (ops.softmax_naive, "return")),
            naive,
            PRINTED["softmax_naive"],
            "large scores overflow it (next stage)",
        ),
        shown(
            "attention weights: softmax",
            _line("attn_weights ="),
            {f: s["attn_weights"][QUERY] for f, s in steps.items()},
            PRINTED["attn_weights_2"],
            row,
        ),
        shown(
            "context vector z^2: the weighted sum of the inputs",
            _line("context_vec ="),
            {f: s["context_vec"][QUERY] for f, s in steps.items()},
            PRINTED["context_vec_2"],
            row,
        ),
    ]


def softmax() -> list[Shown]:
    big = np.array([1000.0, 1001.0, 1002.0], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = {
            "torch": torch_ref.softmax_naive(torch.from_numpy(big)),
            "numpy": numpy_attn.softmax_naive(big),
            "jax": jax_attn.softmax_naive(jnp.asarray(big)),
        }
    stable = {
        "torch": torch.softmax(torch.from_numpy(big), dim=-1),
        "numpy": numpy_attn.softmax(big),
        "jax": jax_attn.softmax(jnp.asarray(big)),
    }
    stable_code = three(
        (torch_simplified.simplified_self_attention, "attn_weights ="),
        (ops.softmax, "x_max =", "unnormalized =", "denominator = unnormalized", "return"),
    )
    return [
        shown(
            "the naive softmax of [1000, 1001, 1002]",
            three((torch_simplified.softmax_naive, "return"), (ops.softmax_naive, "return")),
            naive,
            note="exp(1000) overflows float32 to inf, and inf / inf is NaN: the same in every framework",
        ),
        shown(
            "softmax: the row maximum subtracted first",
            stable_code,
            stable,
            note="exp(x - max(x)) <= 1 never overflows; torch.softmax does the same in C++",
        ),
    ]


def all_queries() -> list[Shown]:
    steps = _steps()
    return [
        shown(
            "attention scores: every query against every key",
            _line("attn_scores ="),
            {f: s["attn_scores"] for f, s in steps.items()},
            PRINTED["attn_scores"],
            "query tokens down, key tokens across",
            tokens=TOKENS,
        ),
        shown(
            "attention weights: softmax over each row",
            _line("attn_weights ="),
            {f: s["attn_weights"] for f, s in steps.items()},
            PRINTED["attn_weights"],
            "each row sums to 1; torch's dim=-1 is NumPy's and JAX's axis=-1",
            tokens=TOKENS,
        ),
        shown(
            "context vectors: one per token",
            _line("context_vec ="),
            {f: s["context_vec"] for f, s in steps.items()},
            PRINTED["all_context_vecs"],
        ),
    ]
