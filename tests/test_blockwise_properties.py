"""Property-based checks of the blockwise cores in NumPy and JAX against the reference math.

``blockwise_attention``: random ranks ((T, H), (B, T, H), (B, N, T, H)), lengths that block
sizes do not divide, causal or not (T != S when not), padding masks with fully hidden rows, and
block sizes from 1 to past the length. ``blockwise_self_attention``: random widths, head
counts, biases, causal or not, padding masks, block sizes, against projecting, splitting,
attending and merging with the reference math. ``make test`` runs a derandomized fast profile;
the slow profile runs under ``slow``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jax_attn
import numpy_attn
from parity_tests.frameworks import jax_context

FAST_EXAMPLES = 8
SLOW_EXAMPLES = 300
TOLERANCE = 1e-12  # float64: the two paths differ only in summation order


@st.composite
def problems(draw):
    rank = draw(st.sampled_from([2, 3, 4]))
    lead = {2: (), 3: (draw(st.integers(1, 3)),), 4: (draw(st.integers(1, 3)), draw(st.integers(1, 3)))}[rank]
    causal = draw(st.booleans())
    tokens = draw(st.integers(1, 12))
    num_keys = tokens if causal else draw(st.integers(1, 12))
    head_dim, value_dim = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    padding_mask = None
    if rank == 4 and draw(st.booleans()):
        padding_mask = rng.random((lead[0], num_keys)) < 0.4  # True = padding; rows may see no key
    return {
        "queries": rng.standard_normal((*lead, tokens, head_dim)),
        "keys": rng.standard_normal((*lead, num_keys, head_dim)),
        "values": rng.standard_normal((*lead, num_keys, value_dim)),
        "causal": causal,
        "padding_mask": padding_mask,
        "block_size": draw(st.integers(1, 14)),
    }


def reference(problem):
    queries, keys = problem["queries"], problem["keys"]
    mask = numpy_attn.causal_mask(queries.shape[-2], keys.shape[-2]) if problem["causal"] else None
    if problem["padding_mask"] is not None:
        hidden_keys = problem["padding_mask"][:, None, None, :]
        mask = hidden_keys if mask is None else mask | hidden_keys
    return numpy_attn.scaled_dot_product_attention(queries, keys, problem["values"], mask)


def check_blockwise(problem):
    expected = reference(problem)
    numpy_output = numpy_attn.blockwise_attention(**problem)
    with jax_context("float64"):
        static = {k: problem[k] for k in ("causal", "block_size")}
        arrays = {k: None if v is None else jnp.asarray(v) for k, v in problem.items() if k not in static}
        jax_output = np.asarray(jax.jit(functools.partial(jax_attn.blockwise_attention, **static))(**arrays))
    for output in (numpy_output, jax_output):
        assert output.shape == expected.shape
        np.testing.assert_allclose(output, expected, rtol=TOLERANCE, atol=TOLERANCE)


@st.composite
def self_attention_problems(draw):
    batch, tokens = draw(st.integers(1, 3)), draw(st.integers(1, 12))
    num_heads, head_dim, d_in = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    width = 3 * num_heads * head_dim
    padding = draw(st.booleans())
    return {
        "x": rng.standard_normal((batch, tokens, d_in)),
        "weight": rng.standard_normal((width, d_in)),
        "bias": rng.standard_normal(width) if draw(st.booleans()) else None,
        "num_heads": num_heads,
        "causal": draw(st.booleans()),
        "padding_mask": rng.random((batch, tokens)) < 0.4 if padding else None,
        "block_size": draw(st.integers(1, 14)),
    }


def self_attention_reference(problem):
    parts = numpy_attn.split_projection(problem["x"], problem["weight"], problem["bias"])
    queries, keys, values = (numpy_attn.split_heads(part, problem["num_heads"]) for part in parts)
    context_vec = reference({**problem, "queries": queries, "keys": keys, "values": values})
    return numpy_attn.merge_heads(context_vec)


def check_self_attention(problem):
    expected = self_attention_reference(problem)
    numpy_output = numpy_attn.blockwise_self_attention(**problem)
    with jax_context("float64"):
        static = {k: problem[k] for k in ("num_heads", "causal", "block_size")}
        arrays = {k: None if v is None else jnp.asarray(v) for k, v in problem.items() if k not in static}
        function = functools.partial(jax_attn.blockwise_self_attention, **static)
        jax_output = np.asarray(jax.jit(function)(**arrays))
    for output in (numpy_output, jax_output):
        assert output.shape == expected.shape
        np.testing.assert_allclose(output, expected, rtol=TOLERANCE, atol=TOLERANCE)


COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "database": None}


def test_blockwise_matches_the_reference_math():
    @settings(max_examples=FAST_EXAMPLES, derandomize=True, **COMMON)
    @given(problems())
    def check(problem):
        check_blockwise(problem)

    check()


@pytest.mark.slow
def test_blockwise_matches_the_reference_math_slow_profile():
    @settings(max_examples=SLOW_EXAMPLES, **COMMON)
    @given(problems())
    def check(problem):
        check_blockwise(problem)
        jax.clear_caches()  # one program per shape: see test_properties

    check()


def test_blockwise_self_attention_matches_the_reference_math():
    @settings(max_examples=FAST_EXAMPLES, derandomize=True, **COMMON)
    @given(self_attention_problems())
    def check(problem):
        check_self_attention(problem)

    check()


@pytest.mark.slow
def test_blockwise_self_attention_matches_the_reference_math_slow_profile():
    @settings(max_examples=SLOW_EXAMPLES, **COMMON)
    @given(self_attention_problems())
    def check(problem):
        check_self_attention(problem)
        jax.clear_caches()

    check()
