"""What each stage of ``attn-parity walkthrough`` shows, computed with torch_ref, numpy_attn and
jax_attn (``parity_tests.walkthrough.STAGES`` names these functions, one a stage)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import torch

import jax_attn
import numpy_attn
import torch_ref
from parity_tests.arrays import to_float64
from parity_tests.notes import INPUTS, batch, notes_steps
from parity_tests.walkthrough import FRAMEWORKS, Shown

__all__ = [
    "all_queries",
    "causal_attention",
    "causal_mask",
    "classes",
    "dropout",
    "fused",
    "multi_head_attention",
    "multi_head_attention_wrapper",
    "one_query",
    "softmax",
    "trainable_one_query",
]


def _shown(label: str, calls: dict[str, str], by_design: bool = False, **values: object) -> Shown:
    boolean = "bool" in str(values["torch"].dtype)
    converted = {framework: to_float64(values[framework]) for framework in FRAMEWORKS}
    return Shown(label, calls, converted, boolean, by_design)


def _tensor() -> torch.Tensor:
    return torch.from_numpy(INPUTS)


def _layer_steps(name: str, x: np.ndarray, **kwargs: object) -> dict[str, Mapping]:
    """The notes' module ``name`` (with the notes' weights) run in each framework."""
    return {framework: notes_steps(framework, name, x, **kwargs) for framework in FRAMEWORKS}


def one_query() -> list[Shown]:
    query = INPUTS[1]
    scores = {
        "torch": _tensor() @ _tensor()[1],
        "numpy": INPUTS @ query,
        "jax": jnp.asarray(INPUTS) @ query,
    }
    calls = {
        "torch": "inputs @ inputs[1]",
        "numpy": "INPUTS @ INPUTS[1]",
        "jax": "jnp.asarray(INPUTS) @ INPUTS[1]",
    }
    weights = {
        "torch": torch.softmax(scores["torch"], dim=0),
        "numpy": numpy_attn.softmax(scores["numpy"]),
        "jax": jax_attn.softmax(scores["jax"]),
    }
    return [
        _shown("attention scores of query x^2 ('journey')", calls, **scores),
        _shown(
            "naive normalisation: scores / scores.sum()",
            {f: "attn_scores_2 / attn_scores_2.sum()" for f in FRAMEWORKS},
            **{f: s / s.sum() for f, s in scores.items()},
        ),
        _shown(
            "attention weights: softmax",
            {
                "torch": "torch.softmax(s, dim=0)",
                "numpy": "numpy_attn.softmax(s)",
                "jax": "jax_attn.softmax(s)",
            },
            **weights,
        ),
        _shown(
            "context vector z^2 = weights @ inputs",
            {f: "attn_weights_2 @ inputs" for f in FRAMEWORKS},
            torch=weights["torch"] @ _tensor(),
            numpy=weights["numpy"] @ INPUTS,
            jax=weights["jax"] @ INPUTS,
        ),
    ]


def all_queries() -> list[Shown]:
    traces = {
        "torch": torch_ref.simplified_self_attention(_tensor(), return_steps=True)[1],
        "numpy": numpy_attn.simplified_self_attention(INPUTS, return_steps=True)[1],
        "jax": jax_attn.simplified_self_attention(INPUTS, return_steps=True)[1],
    }
    calls = {
        "torch": "torch_ref.simplified_self_attention(inputs)",
        "numpy": "numpy_attn.simplified_self_attention(INPUTS)",
        "jax": "jax_attn.simplified_self_attention(INPUTS)",
    }
    return [
        _shown(f"{step}  ({detail})", calls, **{f: t[step] for f, t in traces.items()})
        for step, detail in [
            ("attn_scores", "inputs @ inputs.T"),
            ("attn_weights", "softmax over each row"),
            ("context_vec", "attn_weights @ inputs"),
        ]
    ]


def softmax() -> list[Shown]:
    big = np.array([1000.0, 1001.0, 1002.0], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = {
            "torch": torch_ref.softmax_naive(torch.from_numpy(big)),
            "numpy": numpy_attn.softmax_naive(big),
            "jax": jax_attn.softmax_naive(big),
        }
    stable = {
        "torch": torch.softmax(torch.from_numpy(big), dim=0),
        "numpy": numpy_attn.softmax(big),
        "jax": jax_attn.softmax(big),
    }
    return [
        _shown(
            "naive softmax of [1000, 1001, 1002]: exp overflows to inf, inf / inf = NaN",
            {f: "softmax_naive(x)" for f in FRAMEWORKS},
            **naive,
        ),
        _shown(
            "stable softmax: subtract the row maximum first",
            {
                "torch": "torch.softmax(x, dim=0)",
                "numpy": "numpy_attn.softmax(x)",
                "jax": "jax_attn.softmax(x)",
            },
            **stable,
        ),
    ]


def trainable_one_query() -> list[Shown]:
    steps = _layer_steps("002/SelfAttentionV1", INPUTS)
    calls = {
        "torch": "SelfAttentionV1 with note 002's randn weights",
        "numpy": "numpy_attn.self_attention_v1(params, INPUTS)",
        "jax": "jax_attn.self_attention_v1(params, INPUTS)",
    }
    return [
        _shown(f"{label} (row 1 of {step})", calls, **{f: s[step][1] for f, s in steps.items()})
        for step, label in [
            ("queries", "query_2 = x^2 @ W_query"),
            ("attn_scores", "attn_scores_2 = query_2 @ keys.T"),
            ("attn_weights", "softmax(attn_scores_2 / sqrt(d_k))"),
            ("output", "context_vec_2 = attn_weights_2 @ values"),
        ]
    ]


def classes() -> list[Shown]:
    shown = []
    for name, label in [
        ("004/SelfAttentionV1", "SelfAttentionV1 (torch.rand weights, note 004)"),
        ("002/SelfAttentionV2", "SelfAttentionV2 (nn.Linear weights, note 002)"),
    ]:
        steps = _layer_steps(name, INPUTS)
        fn = "self_attention_v1" if "V1" in name else "self_attention_v2"
        calls = {
            "torch": f"torch_ref.{name.split('/')[1]}(3, 2)(inputs)",
            "numpy": f"numpy_attn.{fn}(params, INPUTS)",
            "jax": f"jax_attn.{fn}(params, INPUTS)",
        }
        shown.append(_shown(label, calls, **{f: s["output"] for f, s in steps.items()}))
    return shown


def causal_mask() -> list[Shown]:
    steps = _layer_steps("004/SelfAttentionV2", INPUTS)
    mask = {
        "torch": torch.triu(torch.ones(6, 6), diagonal=1).bool(),
        "numpy": numpy_attn.causal_mask(6),
        "jax": jax_attn.causal_mask(6),
    }
    scores = {f: to_float64(s["attn_scores"]) for f, s in steps.items()}
    tril = {f: s * ~np.asarray(mask[f]) for f, s in scores.items()}
    masked = {
        "torch": torch.from_numpy(scores["torch"]).masked_fill(mask["torch"], -torch.inf),
        "numpy": np.where(mask["numpy"], -np.inf, scores["numpy"]),
        "jax": jnp.where(mask["jax"], -jnp.inf, scores["jax"]),
    }
    return [
        _shown(
            "the causal mask, True = hidden",
            {
                "torch": "torch.triu(torch.ones(6, 6), diagonal=1).bool()",
                "numpy": "numpy_attn.causal_mask(6)",
                "jax": "jax_attn.causal_mask(6)",
            },
            **mask,
        ),
        _shown(
            "way 1 (note 004): scores * tril, then divide by the row sums",
            {f: "masked = scores * tril(ones); masked / masked.sum(-1)" for f in FRAMEWORKS},
            **{f: t / t.sum(axis=-1, keepdims=True) for f, t in tril.items()},
        ),
        _shown(
            "way 2: -inf above the diagonal, then softmax(masked / sqrt(d_k))",
            {
                "torch": "torch.softmax(scores.masked_fill(mask, -inf) / 2**0.5, -1)",
                "numpy": "numpy_attn.softmax(np.where(mask, -np.inf, scores) / 2**0.5)",
                "jax": "jax_attn.softmax(jnp.where(mask, -jnp.inf, scores) / 2**0.5)",
            },
            torch=torch.softmax(masked["torch"] / 2**0.5, dim=-1),
            numpy=numpy_attn.softmax(masked["numpy"] / 2**0.5),
            jax=jax_attn.softmax(masked["jax"] / 2**0.5),
        ),
    ]


def dropout() -> list[Shown]:
    ones = np.ones((6, 6), np.float32)
    torch.manual_seed(123)
    torch_dropped = torch.nn.Dropout(0.5)(torch.from_numpy(ones))
    keep = torch_dropped.numpy() != 0
    return [
        _shown(
            "Dropout(0.5) on ones, each framework's own generator, seed 123: different masks",
            by_design=True,
            calls={
                "torch": "torch.manual_seed(123); nn.Dropout(0.5)(ones)",
                "numpy": "numpy_attn.dropout(ones, 0.5, rng=np.random.default_rng(123))",
                "jax": "jax_attn.dropout(ones, 0.5, key=jax.random.key(123))",
            },
            torch=torch_dropped,
            numpy=numpy_attn.dropout(ones, 0.5, rng=np.random.default_rng(123)),
            jax=jax_attn.dropout(ones, 0.5, key=jax.random.key(123)),
        ),
        _shown(
            "the same keep-mask everywhere (True = keep): identical, kept entries scaled by 2",
            {
                "torch": "torch_ref modules take attn_keep_mask=keep",
                "numpy": "numpy_attn.dropout(ones, 0.5, keep_mask=keep)",
                "jax": "jax_attn.dropout(ones, 0.5, keep_mask=keep)",
            },
            torch=torch_dropped,
            numpy=numpy_attn.dropout(ones, 0.5, keep_mask=keep),
            jax=jax_attn.dropout(ones, 0.5, keep_mask=keep),
        ),
    ]


def _layer_stage(name: str, fn: str, **kwargs: object) -> Callable[[], list[Shown]]:
    def show() -> list[Shown]:
        steps = _layer_steps(name, batch(), **kwargs)
        arguments = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        calls = {
            "torch": f"torch_ref.{name}(...)(batch)",
            "numpy": f"numpy_attn.{fn}(params, batch, {arguments})",
            "jax": f"jax_attn.{fn}(params, batch, {arguments})",
        }
        weights = next(k for k in steps["torch"] if k.endswith("attn_weights"))
        return [
            _shown(f"{weights} of the first sequence", calls, **{f: s[weights][0] for f, s in steps.items()}),
            _shown(
                "output (both sequences are the same sentence)",
                calls,
                **{f: s["output"] for f, s in steps.items()},
            ),
        ]

    return show


def fused() -> list[Shown]:
    x = np.concatenate([batch(), np.zeros((2, 6, 1), np.float32)], axis=-1)  # hidden_size 4
    torch.manual_seed(123)
    module = torch_ref.FusedCausalAttention(
        4, num_heads=2, context_size=6, attn_drop=0.0, out_drop=0.0
    ).eval()
    params = torch_ref.to_params(module)
    padding = np.array([[False] * 6, [True, True] + [False] * 4])  # sequence 1: two pad tokens first
    kwargs = {"num_heads": 2, "context_size": 6, "attn_drop": 0.0, "out_drop": 0.0}
    traces = {
        "torch": module(torch.from_numpy(x), torch.from_numpy(padding), return_steps=True)[1],
        "numpy": numpy_attn.fused_causal_attention(params, x, padding, **kwargs, return_steps=True)[1],
        "jax": jax_attn.fused_causal_attention(params, x, padding, **kwargs, return_steps=True)[1],
    }
    calls = {
        "torch": "FusedCausalAttention(4, 2, 6)(x, padding_mask)",
        "numpy": "numpy_attn.fused_causal_attention(params, x, padding_mask, num_heads=2, ...)",
        "jax": "jax_attn.fused_causal_attention(params, x, padding_mask, num_heads=2, ...)",
    }
    return [
        _shown(
            "queries: the first third of Wqkv(x) (fused projection), first sequence",
            calls,
            **{f: t["queries"][0] for f, t in traces.items()},
        ),
        _shown(
            "head 0 weights of the left-padded sequence: rows 0-1 see only padding, torch gives "
            "NaN, numpy_attn and jax_attn give zeros",
            calls,
            True,
            **{f: t["attn_weights"][1, 0] for f, t in traces.items()},
        ),
    ]


causal_attention = _layer_stage("CausalAttention", "causal_attention", context_length=6, dropout=0.0)
multi_head_attention_wrapper = _layer_stage(
    "MultiHeadAttentionWrapper",
    "multi_head_attention_wrapper",
    num_heads=2,
    context_length=6,
    dropout=0.0,
)
multi_head_attention = _layer_stage(
    "MultiHeadAttention", "multi_head_attention", num_heads=2, context_length=6, dropout=0.0
)
