"""check_port: green for correct ports in any pair of frameworks, and it localises real bugs."""

import functools

import jax
import numpy as np
import pytest

import jax_attn
import numpy_attn
from parity_tests import check_port
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.frameworks import jax_context
from tests.covering import each_value_params
from torch_ref import to_params

# --- correct ports, across frameworks -----------------------------------------------------------


def implementations(case, params):
    """The same layer as a torch module, NumPy and JAX functions, a jitted JAX function and a
    Flax module."""
    kwargs = case.kwargs()
    return {
        "torch": case.build_torch(),
        "numpy": functools.partial(getattr(numpy_attn, case.function_name), **kwargs),
        "jax": functools.partial(getattr(jax_attn, case.function_name), **kwargs),
        "jax_jit": jax.jit(
            functools.partial(getattr(jax_attn, case.function_name), **kwargs), static_argnames="return_steps"
        ),
        "flax": getattr(jax_attn, case.layer).from_params(params, **kwargs),
    }


PAIRS = [
    ("torch", "numpy"),
    ("torch", "jax"),
    ("torch", "flax"),
    ("numpy", "jax"),
    ("flax", "numpy"),
    ("jax", "jax_jit"),
]


# every layer and every pair in `make test`, the rest of layer x pair in `make test-slow`
@pytest.mark.parametrize(
    "layer, pair",
    each_value_params({"layer": list(FUNCTION_NAMES), "pair": PAIRS}),
    ids=[f"{layer}-{'-vs-'.join(pair)}" for layer in FUNCTION_NAMES for pair in PAIRS],
)
def test_correct_ports_pass_in_every_framework_pair(layer, pair):
    case = Case(layer, batch=2, tokens=5, d_in=4, d_out=6, num_heads=3, bias=True, seed=1)
    params = to_params(case.build_torch())
    impls = implementations(case, params)
    report = check_port(impls[pair[0]], impls[pair[1]], case.make_input(), params=params)
    assert report.ok, f"\n{report}"
    assert report.causes == ()
    roles = {row.step.rsplit(".", 1)[-1] for row in report.rows}  # the wrapper's are heads.{i}.*
    assert roles >= {"queries", "attn_weights", "context_vec", "output"}


def test_a_port_that_records_only_its_output_is_still_checked():
    case = Case("MultiHeadAttention", d_in=4, d_out=4, bias=True)
    params = to_params(case.build_torch())
    only_output = lambda params, x: numpy_attn.multi_head_attention(params, x, num_heads=2, context_length=6)  # noqa: E731
    report = check_port(case.build_torch(), only_output, case.make_input(), params=params)
    assert report.ok
    missing = [row.step for row in report.rows if row.note == "missing in actual"]
    assert missing == [
        "queries",
        "keys",
        "values",
        "attn_scores",
        "masked_scores",
        "attn_weights",
        "attn_weights_dropped",
        "context_vec",
    ]


# --- a port of MultiHeadAttention with injectable bugs --------------------------------------------


def port(params, x, *, bug=None, num_heads=2, p=0.0, attn_keep_mask=None):
    """A hand-written NumPy port of the book's MultiHeadAttention; ``bug`` breaks one step."""
    b, t, _ = x.shape
    w = lambda name: params[f"{name}.weight"]  # noqa: E731
    bias = lambda name: params.get(f"{name}.bias", 0)  # noqa: E731
    queries = x @ (w("W_query") if bug == "transposed_projection" else w("W_query").T)
    queries = queries + (0 if bug == "missing_qkv_bias" else bias("W_query"))
    keys = x @ w("W_key").T + bias("W_key")
    values = x @ (w("W_key") if bug == "values_from_key_projection" else w("W_value")).T + bias("W_value")

    def split(m):
        if bug == "heads_split_without_transpose":
            return m.reshape(b, num_heads, t, -1)
        return m.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3)

    q, k, v = split(queries), split(keys), split(values)
    attn_scores = (k @ q.swapaxes(-1, -2)) if bug == "queries_keys_swapped" else q @ k.swapaxes(-1, -2)
    mask = np.triu(np.ones((t, t), bool), k=0 if bug == "mask_off_by_one" else 1)
    if bug == "inverted_mask":
        mask = ~mask
    masked_scores = np.where(mask, -np.inf, attn_scores)
    scale = queries.shape[-1] if bug == "scale_by_d_out" else q.shape[-1]
    attn_weights = numpy_attn.softmax(
        masked_scores / scale**0.5, axis=-2 if bug == "softmax_over_queries" else -1
    )
    dropped = attn_weights
    if attn_keep_mask is not None:
        dropped = attn_weights * attn_keep_mask / (1 if bug == "dropout_not_rescaled" else 1 - p)
    context = dropped @ v  # (B, N, T, H)
    if bug == "heads_merged_without_transpose":
        context_vec = context.reshape(b, t, -1)
    else:
        context_vec = context.transpose(0, 2, 1, 3).reshape(b, t, -1)
    output = context_vec @ w("out_proj").T + (0 if bug == "output_bias_dropped" else bias("out_proj"))
    steps = dict(
        queries=queries,
        keys=keys,
        values=values,
        attn_scores=attn_scores,
        masked_scores=masked_scores,
        attn_weights=attn_weights,
    )
    if attn_keep_mask is not None:
        steps["attn_weights_dropped"] = dropped
    steps["context_vec"] = context_vec
    return output, steps


BUGS = {  # bug -> (first diverging step, a phrase its likely causes must contain)
    "transposed_projection": ("queries", "wrong layout"),
    "missing_qkv_bias": ("queries", "bias missing"),
    "values_from_key_projection": ("values", "wrong names"),
    "heads_split_without_transpose": ("attn_scores", "wrong head split"),
    "queries_keys_swapped": ("attn_scores", "queries and keys swapped"),
    "inverted_mask": ("masked_scores", "mask meaning inverted"),
    "mask_off_by_one": ("masked_scores", "off by one"),
    "scale_by_d_out": ("attn_weights", "wrong scale"),
    "softmax_over_queries": ("attn_weights", "wrong axis"),
    "dropout_not_rescaled": ("attn_weights_dropped", "1 / (1 - p)"),
    "heads_merged_without_transpose": ("context_vec", "merged in the wrong order"),
    "output_bias_dropped": ("output", "output projection"),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_injected_bug_is_localised(bug):
    case = Case(
        "MultiHeadAttention", batch=2, tokens=6, d_in=4, d_out=4, num_heads=2, bias=True, dtype="float64"
    )
    params = to_params(case.build_torch())
    x = case.make_input()
    keep = {}
    if bug == "dropout_not_rescaled":  # a training-mode check: both sides get the same keep-mask
        keep = {"attn_keep_mask": np.random.default_rng(0).random(case.attn_shape) >= 0.5}
    reference = functools.partial(
        numpy_attn.multi_head_attention, **case.kwargs(0.5 if keep else 0.0), **keep
    )
    assert check_port(reference, functools.partial(port, p=0.5, **keep), x, params=params).ok  # no bug

    report = check_port(reference, functools.partial(port, bug=bug, p=0.5, **keep), x, params=params)
    step, phrase = BUGS[bug]
    assert not report.ok
    assert report.first_divergence == step, f"\n{report}"
    assert any(phrase in cause for cause in report.causes), report.causes
    assert all(row.ok for row in report.rows[: [r.step for r in report.rows].index(step)])


def test_bugs_are_found_against_torch_and_jax_references_too():
    case = Case("MultiHeadAttention", batch=2, tokens=6, d_in=4, d_out=4, num_heads=2, bias=True)
    params = to_params(case.build_torch())
    x = case.make_input()
    buggy = functools.partial(port, bug="inverted_mask")
    jax_reference = jax_attn.MultiHeadAttention.from_params(params, **case.kwargs())
    with jax_context("float32"):
        for reference in (case.build_torch(), jax_reference):
            assert check_port(reference, buggy, x, params=params).first_divergence == "masked_scores"


def test_shape_mismatch_gets_a_layout_hint():
    case = Case("MultiHeadAttention", d_in=4, d_out=4, bias=True)
    params = to_params(case.build_torch())

    def heads_last(params, x):
        output, steps = numpy_attn.multi_head_attention(
            params, x, num_heads=2, context_length=6, return_steps=True
        )
        return output, {**steps, "attn_scores": np.moveaxis(steps["attn_scores"], 1, -1)}

    report = check_port(case.build_torch(), heads_last, case.make_input(), params=params)
    assert report.first_divergence == "attn_scores"
    assert "axis order" in report.causes[0]
