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
from tests.ports.numpy_steps_mha import mha as port
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


# --- bugs injected into a port recording its steps (tests/ports/numpy_steps_mha.py) -------------


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
