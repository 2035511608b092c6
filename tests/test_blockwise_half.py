"""Half precision: the blockwise path gives the reference path's answer (issue 16).

The reference path computes scores and softmax in float32 for float16 and bfloat16 inputs; the
blockwise cores compute scores, masks, running maximum, running sum and context in float32 and
cast the context back once. So neither scores beyond float16's range (|q . k| / sqrt(H) above
65504) nor an unnormalised running sum that outgrows it (many keys, large values) overflows,
and ``implementation="auto"`` gives one answer on either side of ``AUTO_BLOCKWISE_TOKENS``.
numpy_attn takes float16 only (NumPy has no bfloat16 arithmetic), jax_attn bfloat16 too.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn
from numpy_attn.fast.options import AUTO_BLOCKWISE_TOKENS
from numpy_attn.spec import parameter_shapes
from parity_tests.compare import compare_arrays

# (package, jitted, dtype): numpy_attn, jax_attn under jax.jit and eagerly. Eagerly the blockwise
# functions and the layers run the program their door compiles (the jitted one's bits) and
# scaled_dot_product_attention runs op by op: 9 s of compiles, with the slow tests (`make test-slow`).
SHORT = AUTO_BLOCKWISE_TOKENS - 12  # tokens: "auto" runs the reference math


def runs(dtype: str, *, numpy: bool = True) -> list:
    eager = pytest.param("jax", False, dtype, marks=pytest.mark.slow, id=f"jax-False-{dtype}")
    return [*([("numpy", False, dtype)] if numpy else []), ("jax", True, dtype), eager]


FLOAT16_RUNS = runs("float16")
HALF_RUNS = [*FLOAT16_RUNS, *runs("bfloat16", numpy=False)]


def call(package, jitted, function_name, arrays, **kwargs):
    """``function_name`` of numpy_attn or jax_attn on ``arrays`` (NumPy arrays or dicts of them),
    the other arguments bound; returns a NumPy array."""
    if package == "numpy":
        return getattr(numpy_attn, function_name)(*arrays, **kwargs)
    function = functools.partial(getattr(jax_attn, function_name), **kwargs)
    if jitted:
        function = jax.jit(function)
    return np.asarray(function(*jax.tree.map(jnp.asarray, arrays)))


def to_dtype(array, dtype):
    return array.astype(jnp.dtype(dtype))  # ml_dtypes' bfloat16 through JAX's dtype name


def assert_close(actual, expected):
    """Within the tolerance of the arrays' dtype (``parity_tests.tolerances``), finite."""
    row = compare_arrays("context_vec", expected, actual)
    assert np.isfinite(expected).all() and row.ok, row


def test_the_example_of_the_issue_stays_finite():
    queries = np.full((1, 1, 3, 4), 182, np.float16)  # scaled scores 182 * 182 * 4 / 2 = 66248
    values = np.arange(12, dtype=np.float16).reshape(1, 1, 3, 4)
    for package, jitted in (("numpy", False), ("jax", False), ("jax", True)):  # the issue's example: all
        arrays = (queries, queries, values)
        expected = call(package, jitted, "scaled_dot_product_attention", arrays)
        actual = call(package, jitted, "blockwise_attention", arrays, block_size=2)
        assert actual.dtype == np.float16
        np.testing.assert_array_equal(expected, [[[[4, 5, 6, 7]] * 3]])  # equal scores: the mean
        np.testing.assert_array_equal(actual, expected)


def half_inputs(dtype, num_tokens, scale, seed):
    """(1, 2, T, 4) queries, keys and values; the queries and keys scaled by ``scale``."""
    rng = np.random.default_rng(seed)
    queries, keys, values = rng.standard_normal((3, 1, 2, num_tokens, 4))
    return tuple(to_dtype(a, dtype) for a in (queries * scale, keys * scale, values))


@pytest.mark.parametrize("package, jitted, dtype", HALF_RUNS)
@pytest.mark.parametrize("causal", [False, True])
def test_scores_beyond_float16s_range_match_the_reference(package, jitted, dtype, causal):
    """Scores up to ~1e5 (float16's largest is 65504): the blockwise core matches the reference
    math, with and without a dropout keep-mask."""
    queries, keys, values = half_inputs(dtype, num_tokens=40, scale=120, seed=1)
    mask = numpy_attn.causal_mask(40) if causal else None
    keep = np.random.default_rng(2).random((1, 2, 40, 40)) >= 0.25
    for dropout in ({}, {"dropout": 0.25, "attn_keep_mask": keep}):
        arrays = (queries, keys, values)
        expected = call(package, jitted, "scaled_dot_product_attention", (*arrays, mask), **dropout)
        actual = call(package, jitted, "blockwise_attention", arrays, causal=causal, block_size=16, **dropout)
        assert actual.dtype == np.dtype(jnp.dtype(dtype))
        assert_close(actual, expected)


def layer_params(layer, dtype, **arguments):
    """Zero query and key weights, so that every score is 0 and a query's weights are uniform;
    value weights of 100, so that the unnormalised running sum of 1000 keys' values exceeds
    float16's range (1000 x 100 x ~1.5 > 65504); output projection weights of 0.01."""
    fill = {"W_query": 0, "W_key": 0, "W_value": 100, "out_proj": 0.01}
    shapes = parameter_shapes(layer, **arguments)
    return {name: to_dtype(np.full(shape, fill[name.split(".")[0]]), dtype) for name, shape in shapes.items()}


# (function, the layer spec and its arguments, the layer's keyword arguments): a single head (the
# blockwise core) and multi-head attention (blockwise_self_attention: the heads projected in it)
LAYERS = [
    ("causal_attention", "CausalAttention", {"d_in": 2, "d_out": 2}, {}),
    ("multi_head_attention", "MultiHeadAttention", {"d_in": 4, "d_out": 4, "num_heads": 2}, {"num_heads": 2}),
]


# bfloat16 jitted only: its range is float32's, so nothing overflows here on the old code either
@pytest.mark.parametrize("package, jitted, dtype", [*FLOAT16_RUNS, ("jax", True, "bfloat16")])
@pytest.mark.parametrize("function, layer, arguments, kwargs", LAYERS, ids=[layer[0] for layer in LAYERS])
def test_long_sequences_of_large_values_give_one_answer_whatever_the_path(
    package, jitted, dtype, function, layer, arguments, kwargs
):
    """Below and above ``AUTO_BLOCKWISE_TOKENS``, "blockwise" and "auto" match "reference"; and the
    output of a token, the mean of its values, does not depend on the sequence's length."""
    params = layer_params(layer, dtype, **arguments)
    x = to_dtype(np.random.default_rng(3).uniform(0.5, 1.0, (1, 1000, arguments["d_in"])), dtype)
    context_vecs = {}
    for num_tokens in (SHORT, 1000):
        arrays = (params, x[:, :num_tokens])
        for implementation in ("reference", "blockwise", "auto"):
            context_vecs[num_tokens, implementation] = call(
                package, jitted, function, arrays, context_length=1000, implementation=implementation,
                block_size=256, **kwargs,
            )  # fmt: skip
        for implementation in ("blockwise", "auto"):
            actual = context_vecs[num_tokens, implementation]
            assert_close(actual, context_vecs[num_tokens, "reference"])
    assert_close(context_vecs[1000, "auto"][:, :SHORT], context_vecs[SHORT, "auto"])


def test_numpy_heads_on_threads_give_the_bits_of_one_head_after_another_in_float16():
    params = layer_params("MultiHeadAttention", "float16", d_in=4, d_out=4, num_heads=2)
    x = np.random.default_rng(4).uniform(0.5, 1.0, (1, 600, 4)).astype(np.float16)
    layer = functools.partial(
        numpy_attn.multi_head_attention,
        params,
        x,
        num_heads=2,
        context_length=600,
        implementation="blockwise",
    )
    expected = numpy_attn.multi_head_attention(params, x, num_heads=2, context_length=600)
    with numpy_attn.parallel_heads(2, contextlib.nullcontext, min_scores=0):
        on_threads = layer()
    np.testing.assert_array_equal(on_threads, layer())
    assert_close(on_threads, expected)
