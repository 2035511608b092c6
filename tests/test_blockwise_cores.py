"""The blockwise building blocks, ``blockwise_attention`` and ``blockwise_self_attention``, in
numpy_attn and jax_attn: the reference math's result (split heads merged without a copy, no whole
projection stored), their dropout, their errors alike in both packages, blocks fitted to the
sequence. The layers' blockwise path: tests/test_blockwise.py."""

import functools
import re
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn
from numpy_attn.fast.blocks import fit_block_size
from numpy_attn.spec import parameter_shapes
from parity_tests.frameworks import jax_context
from parity_tests.tolerances import TOLERANCES


def test_blockwise_output_of_split_heads_merges_without_a_copy():
    """Heads split from (B, T, E) projections are views; the blockwise context is laid out as
    (B, T, N, H) in memory, so merging the heads back is a view too (no O(T * E) copy)."""
    rng = np.random.default_rng(5)
    projections = [rng.standard_normal((2, 9, 8)) for _ in range(3)]  # (B, T, E)
    queries, keys, values = (numpy_attn.split_heads(p, 2) for p in projections)  # (B, N, T, H)
    context_vec = numpy_attn.blockwise_attention(queries, keys, values, causal=True, block_size=4)
    merged = numpy_attn.merge_heads(context_vec)
    assert np.shares_memory(merged, context_vec)
    reference = numpy_attn.scaled_dot_product_attention(queries, keys, values, numpy_attn.causal_mask(9, 9))
    np.testing.assert_allclose(merged, numpy_attn.merge_heads(reference), rtol=1e-12, atol=1e-12)


def self_attention_inputs(seed=6, batch=2, tokens=13, d_in=5, num_heads=2, head_dim=3):
    rng = np.random.default_rng(seed)
    width = 3 * num_heads * head_dim
    return (
        rng.standard_normal((batch, tokens, d_in)),
        rng.standard_normal((width, d_in)),
        rng.standard_normal(width),
    )


def test_numpy_blockwise_self_attention_stores_no_whole_projection():
    """One head's (B, T, 3H) projection at a time: the traced peak stays below the (B, T, 3E)
    projection plus the context (4 arrays of (T, E); measured 4.33 that way, 2.91 per head)."""
    x, weight, bias = self_attention_inputs(tokens=2048, d_in=64, num_heads=4, head_dim=16)
    tracemalloc.start()
    numpy_attn.blockwise_self_attention(x[:1], weight, bias, num_heads=4, causal=True, block_size=64)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3.5 * x[:1].nbytes


def split_heads_blockwise(package, x, weight, bias, num_heads, **kwargs):
    """What ``blockwise_self_attention`` equals: project, split into heads, attend, merge."""
    parts = package.split_projection(x, weight, bias)
    heads = (package.split_heads(part, num_heads) for part in parts)
    return package.merge_heads(package.blockwise_attention(*heads, **kwargs))


def test_blockwise_self_attention_dropout_matches_split_heads():
    """The same keep-mask gives the same output in both packages; in JAX, the same key draws
    the same per-block masks as ``blockwise_attention`` on split heads (bit for bit)."""
    x, weight, bias = self_attention_inputs()
    keep = np.random.default_rng(7).random((2, 2, 13, 13)) >= 0.4
    args = {"num_heads": 2, "causal": True, "dropout": 0.4, "block_size": 4}
    expected = split_heads_blockwise(numpy_attn, x, weight, bias, **args, attn_keep_mask=keep)
    numpy_output = numpy_attn.blockwise_self_attention(x, weight, bias, **args, attn_keep_mask=keep)
    np.testing.assert_allclose(numpy_output, expected, rtol=1e-12, atol=1e-12)
    with jax_context("float64"):
        jx, jweight, jbias = (jnp.asarray(a) for a in (x, weight, bias))
        jax_output = jax_attn.blockwise_self_attention(
            jx, jweight, jbias, **args, attn_keep_mask=jnp.asarray(keep)
        )
        np.testing.assert_allclose(jax_output, expected, rtol=1e-12, atol=1e-12)
        key = jax.random.key(8)
        drawn = jax_attn.blockwise_self_attention(jx, jweight, jbias, **args, key=key)
        np.testing.assert_array_equal(
            drawn, split_heads_blockwise(jax_attn, jx, jweight, jbias, **args, key=key)
        )
        assert not np.allclose(
            drawn, jax_attn.blockwise_self_attention(jx, jweight, jbias, **args, key=jax.random.key(9))
        )


SELF_ATTENTION_ERRORS = [
    (
        "rank_2_x",
        lambda a: a.update(x=a["x"][0]),
        ValueError,
        r"x must have shape \(B, T, D\), got shape \(13, 5\)",
    ),
    ("int_x", lambda a: a.update(x=a["x"].astype(np.int64)), TypeError, "x must have a floating dtype"),
    (
        "weight_width",
        lambda a: a.update(weight=a["weight"][:, :4]),
        ValueError,
        r"weight must have shape \(3E, D\) with D=5",
    ),
    (
        "weight_rows",
        lambda a: a.update(weight=a["weight"][:-2]),
        ValueError,
        "weight must stack 3 projections of num_heads=2",
    ),
    ("num_heads", lambda a: a.update(num_heads=0), ValueError, "num_heads must be a positive int, got 0"),
    ("bias_shape", lambda a: a.update(bias=a["bias"][:-1]), ValueError, r"bias must have shape \(18,\)"),
    (
        "weight_dtype",
        lambda a: a.update(weight=a["weight"].astype(np.float32)),
        TypeError,
        "weight has dtype float32 but x has dtype float64",
    ),
    (
        "padding_shape",
        lambda a: a.update(padding_mask=np.zeros((2, 12), bool)),
        ValueError,
        r"padding_mask must be a bool array of shape \(B, S\)",
    ),
    (
        "keep_shape",
        lambda a: a.update(dropout=0.1, attn_keep_mask=np.ones((2, 13, 13), bool)),
        ValueError,
        "attn_keep_mask must be a bool array",
    ),
    (
        "block_size",
        lambda a: a.update(block_size=0),
        ValueError,
        "block_size must be a positive int, got 0",
    ),
    ("dropout", lambda a: a.update(dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1.0"),
]


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [e[1:] for e in SELF_ATTENTION_ERRORS],
    ids=[e[0] for e in SELF_ATTENTION_ERRORS],
)
def test_blockwise_self_attention_rejects_bad_arguments_alike(change, error, match):
    x, weight, bias = self_attention_inputs()
    arguments = {"x": x, "weight": weight, "bias": bias, "num_heads": 2, "causal": True}
    change(arguments)
    messages = []
    with jax_context("float64"):
        for package, to_array in ((numpy_attn, np.asarray), (jax_attn, jnp.asarray)):
            converted = {k: to_array(v) if isinstance(v, np.ndarray) else v for k, v in arguments.items()}
            with pytest.raises(error, match=match) as raised:
                package.blockwise_self_attention(**converted)
            messages.append(str(raised.value))
    assert messages[0] == messages[1].replace("bfloat16, ", "")  # JAX also computes in bfloat16


# attend's text (tests/test_attend_masks.py), one message from check_causal_lengths on both paths
CAUSAL_T_NOT_S = (
    "causal attention needs T = S (self-attention), got T=7, S=9; for queries at other positions pass "
    "causal_mask(T, S, offset) to scaled_dot_product_attention"
)


def test_causal_blockwise_attention_needs_as_many_queries_as_keys_in_both_packages():
    rng = np.random.default_rng(10)
    queries, keys = rng.standard_normal((7, 4)), rng.standard_normal((9, 4))
    for package, to_array in ((numpy_attn, np.asarray), (jax_attn, jnp.asarray)):
        with pytest.raises(ValueError, match=f"^{re.escape(CAUSAL_T_NOT_S)}$"):
            package.blockwise_attention(to_array(queries), to_array(keys), to_array(keys), causal=True)
        not_causal = package.blockwise_attention(
            to_array(queries), to_array(keys), to_array(keys), block_size=4
        )
        assert not_causal.shape == (7, 4)


def raised(call):
    """The exception ``call()`` raises."""
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_blockwise_random_sources_are_checked_as_the_layers_check_them():
    """``rng=0`` / ``key=0`` raise the layers' TypeError (not NumPy's AttributeError on
    ``0.random``, JAX's "invalid PRNG key data" or a TracerArrayConversionError)."""
    x, weight, bias = (a.astype(np.float32) for a in self_attention_inputs())  # (2, 13, 5), (18, 5), (18,)
    queries = np.random.default_rng(11).standard_normal((2, 2, 13, 3)).astype(np.float32)
    params = {name: weight[:4] for name in parameter_shapes("CausalAttention", d_in=5, d_out=4)}

    def calls(package, to_array, name):
        """The layer and both blockwise functions, with dropout, taking the random source."""
        return (
            lambda random: package.causal_attention(
                {k: to_array(v) for k, v in params.items()}, to_array(x), context_length=13, dropout=0.5,
                **{name: random},
            ),
            lambda random: package.blockwise_attention(
                *[to_array(queries)] * 3, dropout=0.5, **{name: random}
            ),
            lambda random: package.blockwise_self_attention(
                to_array(x), to_array(weight), to_array(bias), num_heads=2, dropout=0.5, **{name: random}
            ),
        )  # fmt: skip

    numpy_calls, jax_calls = calls(numpy_attn, np.asarray, "rng"), calls(jax_attn, jnp.asarray, "key")
    generator = "rng must be a numpy.random.Generator (numpy.random.default_rng(seed)) or None"
    key = "key must be a jax.random key (jax.random.key(seed)) or None"
    for runs, expected in (
        ([lambda call=call: call(0) for call in numpy_calls], f"{generator}, got 0 (int)"),
        # eagerly every door sees the int (the layer's check runs before its compiled program)
        ([lambda call=call: call(0) for call in jax_calls], f"{key}, got 0 (int)"),
        (
            [lambda call=call: jax.jit(call)(0) for call in jax_calls],
            f"{key}, got an array of dtype int32, shape ()",
        ),
    ):
        for run in runs:
            error = raised(run)
            assert (type(error), str(error)) == (TypeError, expected)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((4,), (6, 4), (6, 4)), "queries must have shape (..., T, H), got shape (4,) (rank 1)"),
        (((5, 4), (4,), (6, 4)), "keys must have shape (..., S, H), got shape (4,) (rank 1)"),
        (((5, 4), (6, 4), ()), "values must have shape (..., S, Hv), got shape () (rank 0)"),
    ],
)
def test_blockwise_attention_rejects_inputs_of_fewer_than_two_axes_alike(shapes, message):
    """A ValueError naming the argument and its shape (it was an IndexError), the same in
    numpy_attn, jax_attn and under jax.jit."""
    arrays = [np.ones(shape, np.float32) for shape in shapes]
    jax_arrays = [jnp.asarray(a) for a in arrays]
    for error in (
        raised(lambda: numpy_attn.blockwise_attention(*arrays)),
        raised(lambda: jax_attn.blockwise_attention(*jax_arrays)),
        raised(lambda: jax.jit(jax_attn.blockwise_attention)(*jax_arrays)),
    ):
        assert (type(error), str(error)) == (ValueError, message)


@pytest.mark.parametrize(
    ("block_size", "length", "expected"),
    [
        (256, 1024, 256),  # divides: unchanged
        (512, 1000, 500),  # two blocks, cut equal: no padding
        (4, 9, 3),  # three blocks of 3 instead of 4, 4, 1
        (512, 6, 6),  # the sequence is shorter than one block
        (10**9, 6, 6),
        (1, 5, 1),
    ],
)
def test_blocks_are_fitted_to_the_sequence(block_size, length, expected):
    assert fit_block_size(block_size, length) == expected


def array_sizes(jaxpr_text):
    """Every axis length that occurs in a jaxpr's array types, e.g. ``f32[1,512,2,3]``."""
    return {int(n) for dims in re.findall(r"\[([\d,]+)\]", jaxpr_text) for n in dims.split(",")}


@pytest.mark.parametrize("block_size", [512, 10**9])
def test_jax_blockwise_does_not_pad_a_short_sequence_to_the_block_size(block_size):
    """T = 6 with ``block_size=512`` used to run on (512, 512) blocks (18x slower than one block of
    6) and ``block_size=10**9`` ran out of memory: the block is clamped to the sequence."""
    x, weight, bias = self_attention_inputs(tokens=6)
    parts = numpy_attn.split_projection(x, weight, bias)
    queries, keys, values = (numpy_attn.split_heads(p, 2) for p in parts)  # (B, N, T, H)
    expected = numpy_attn.scaled_dot_product_attention(queries, keys, values, numpy_attn.causal_mask(6))
    rtol, atol = TOLERANCES["float64"]
    with jax_context("float64"):
        core = functools.partial(jax_attn.blockwise_attention, causal=True, block_size=block_size)
        layer = functools.partial(
            jax_attn.blockwise_self_attention, num_heads=2, causal=True, block_size=block_size
        )
        for function, arguments, merge in (
            (core, (queries, keys, values), numpy_attn.merge_heads),
            (layer, (x, weight, bias), lambda context_vec: context_vec),
        ):
            jax_arguments = [jnp.asarray(a) for a in arguments]
            sizes = array_sizes(str(jax.make_jaxpr(function)(*jax_arguments)))
            assert max(sizes) == max(max(a.shape) for a in arguments)  # no axis longer than an input's
            actual = merge(np.asarray(jax.jit(function)(*jax_arguments)))
            np.testing.assert_allclose(actual, numpy_attn.merge_heads(expected), rtol=rtol, atol=atol)
    actual = numpy_attn.blockwise_self_attention(
        x, weight, bias, num_heads=2, causal=True, block_size=block_size
    )
    np.testing.assert_allclose(actual, numpy_attn.merge_heads(expected), rtol=1e-12, atol=1e-12)
