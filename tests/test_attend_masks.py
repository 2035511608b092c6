"""The masks of the reference path are checked as the blockwise path's are, and mean the same on
both: ``scaled_dot_product_attention``'s mask is bool and broadcasts to the scores; ``attend``'s
padding mask is bool ``(B, S)``, B the queries' first axis, whatever their rank and the
implementation; ``causal`` is a bool and ``path`` a known implementation. ``blockwise_attention``
with an empty axis gives ``scaled_dot_product_attention``'s result. One error text in numpy_attn,
jax_attn and under ``jax.jit``."""

import re

import jax
import numpy as np
import pytest

import jax_attn
import numpy_attn
from numpy_attn import AttnDropout, ComputePath, Masking
from parity_tests.tolerances import tolerance_for

PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}
RNG = np.random.default_rng(41)
QUERIES = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)  # (B, N, T, H)


def errors(function, *args, **kwargs):
    """``(type, text)`` of what ``function`` of numpy_attn, jax_attn and jax_attn under ``jax.jit``
    (the NumPy arrays among ``args`` traced, the other arguments closed over) raise."""
    traced = [i for i, arg in enumerate(args) if isinstance(arg, np.ndarray)]

    def jax_of_traced(*arrays):
        given = list(args)
        for i, array in zip(traced, arrays, strict=True):
            given[i] = array
        return getattr(jax_attn, function)(*given, **kwargs)

    found = []
    for call in (
        lambda: getattr(numpy_attn, function)(*args, **kwargs),
        lambda: getattr(jax_attn, function)(*args, **kwargs),
        lambda: jax.jit(jax_of_traced)(*(args[i] for i in traced)),
    ):
        with pytest.raises(Exception) as info:
            call()
        found.append((info.type, str(info.value)))
    return found


# ------------------------------------------------------------------ scaled_dot_product_attention's mask


def scores_mask_message(shape, dtype="bool"):
    return (
        "mask must be a bool array broadcastable to the scores' shape (..., T, S) = (1, 2, 3, 3), "
        f"got {dtype} array of shape {shape}"
    )


@pytest.mark.parametrize(
    "mask, message",
    [
        (np.ones((3, 3), np.float32), scores_mask_message((3, 3), "float32")),  # Flax's "1 = attend"
        (np.ones((3, 3), np.int8), scores_mask_message((3, 3), "int8")),
        (np.zeros((2, 2), bool), scores_mask_message((2, 2))),
        (np.zeros((3, 4), bool), scores_mask_message((3, 4))),
        (np.zeros((2, 1, 1, 3, 1), bool), scores_mask_message((2, 1, 1, 3, 1))),  # would widen the result
        (np.zeros((0, 3), bool), scores_mask_message((0, 3))),
    ],
    ids=["float_keep_mask", "int8", "small", "wide", "rank_5", "empty_rows"],
)
def test_scaled_dot_product_attention_refuses_a_mask_that_is_not_bool_or_not_the_scores_shape(mask, message):
    """Before: a float mask hid every key (all-zero output) and a mask of another shape raised
    NumPy's or JAX's own broadcast error (two texts), or widened the result."""
    assert (
        errors("scaled_dot_product_attention", QUERIES, QUERIES, QUERIES, mask) == [(ValueError, message)] * 3
    )


@pytest.mark.parametrize("shape", [(3, 3), (1, 3), (3, 1), (2, 1, 3), (1, 2, 3, 3), (1, 1, 1, 3)])
def test_scaled_dot_product_attention_takes_every_mask_that_broadcasts_to_the_scores(shape):
    mask = RNG.random(shape) < 0.3
    expected = numpy_attn.scaled_dot_product_attention(
        QUERIES, QUERIES, QUERIES, np.broadcast_to(mask, (1, 2, 3, 3))
    )
    for package in PACKAGES.values():
        actual = package.scaled_dot_product_attention(QUERIES, QUERIES, QUERIES, mask)
        np.testing.assert_allclose(np.asarray(actual), expected, *tolerance_for("float32"))


@pytest.mark.parametrize(
    "changed, shape, message",
    [
        ("keys", (2, 3, 3, 4), "keys must have leading axes that broadcast with (1, 2) (queries have shape "
         "(1, 2, 3, 4)), got shape (2, 3, 3, 4)"),
        ("values", (1, 3, 3, 4), "values must have leading axes that broadcast with (1, 2) (queries have "
         "shape (1, 2, 3, 4)), got shape (1, 3, 3, 4)"),
    ],
)  # fmt: skip
def test_keys_or_values_whose_leading_axes_do_not_broadcast_are_one_value_error(changed, shape, message):
    """Before: NumPy's and JAX's own broadcast errors, two texts."""
    arrays = {"queries": QUERIES, "keys": QUERIES, "values": QUERIES}
    arrays[changed] = RNG.standard_normal(shape).astype(np.float32)
    for function in ("scaled_dot_product_attention", "blockwise_attention"):
        assert errors(function, *arrays.values()) == [(ValueError, message)] * 3


def test_a_head_size_of_zero_is_one_value_error():
    """Before: NaN (and NumPy's RuntimeWarning) from the scale 1 / sqrt(0) on the reference path,
    a ZeroDivisionError on the blockwise path."""
    queries, values = QUERIES[..., :0], QUERIES
    message = "queries must have a head size H of at least 1, got shape (1, 2, 3, 0)"
    for function in ("scaled_dot_product_attention", "blockwise_attention"):
        assert errors(function, queries, queries, values) == [(ValueError, message)] * 3


# ------------------------------------------------------------------ attend: one padding mask, every path

PATHS = [ComputePath("reference"), ComputePath("blockwise", 2)]  # "auto" is one of them (uses_blockwise)


@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_attend_hides_the_padding_of_each_batch_row_whatever_the_queries_rank_and_path(rank):
    """Before: 3-D queries ``(B, T, H)`` with a ``(B, S)`` padding mask gave a ``(B, B, T, H)``
    result on the reference path (every batch row's mask applied to every row), ``(B, T, H)``
    on the blockwise path."""
    shape = {2: (3, 4), 3: (2, 3, 4), 4: (2, 2, 3, 4), 5: (2, 3, 2, 3, 4)}[rank]
    queries, keys, values = (RNG.standard_normal(shape).astype(np.float32) for _ in range(3))
    batch = shape[0] if rank > 2 else 1
    padding_mask = np.array([[False, False, True], [False, True, True]])[:batch]  # (B, S)
    rows = [array[None] if rank == 2 else array for array in (queries, keys, values)]  # (B, ..., T, H)
    for causal in (False, True):
        hidden_by_row = padding_mask[:, None, :] | (
            numpy_attn.causal_mask(3) if causal else False
        )  # (B, T, S)
        expected = np.stack([
            numpy_attn.scaled_dot_product_attention(q, k, v, np.broadcast_to(hidden, (*q.shape[:-1], 3)))
            for q, k, v, hidden in zip(*rows, hidden_by_row, strict=True)
        ]).reshape(shape)  # fmt: skip
        # jax_attn's reshape is numpy_attn's line for line: its eager compiles (1 s a rank) at 2 ranks
        for package in [numpy_attn, jax_attn] if rank <= 3 else [numpy_attn]:
            for path in PATHS:
                actual, _ = package.attend(queries, keys, values, Masking(causal, padding_mask), path=path)
                assert actual.shape == shape
                np.testing.assert_allclose(np.asarray(actual), expected, *tolerance_for("float32"))


@pytest.mark.parametrize("implementation", ["reference", "blockwise", "auto"])
@pytest.mark.parametrize(
    "padding_mask, causal, got",
    [
        (np.zeros((1, 4), bool), False, "bool array of shape (1, 4)"),
        (np.zeros((2, 3), bool), False, "bool array of shape (2, 3)"),
        (np.zeros((3,), bool), False, "bool array of shape (3,)"),
        (np.zeros((1, 3), np.float32), True, "float32 array of shape (1, 3)"),
    ],
    ids=["more_keys", "another_batch", "rank_1", "float_and_causal"],
)
def test_attend_refuses_a_padding_mask_that_is_not_bool_b_s_on_every_path(
    implementation, padding_mask, causal, got
):
    """Before, on the reference path: NumPy's and JAX's own broadcast errors, or 'ufunc bitwise_or
    not supported' and 'or does not accept dtype float32' for a float mask with ``causal``; the
    blockwise path named the mask."""
    message = f"padding_mask must be a bool array of shape (B, S) = (1, 3), got {got}"
    found = errors(
        "attend",
        QUERIES,
        QUERIES,
        QUERIES,
        Masking(causal, padding_mask),
        path=ComputePath(implementation, 2),
    )
    assert found == [(ValueError, message)] * 3


def attend_calls(package):
    """``attend`` and ``attend_heads`` of ``package`` on valid arrays, taking the options."""
    x = RNG.standard_normal((1, 3, 4)).astype(np.float32)
    qkv = (RNG.standard_normal((12, 4)).astype(np.float32), None)
    return {
        "attend": lambda *options: package.attend(QUERIES, QUERIES, QUERIES, *options),
        "attend_heads": lambda *options: package.attend_heads(x, qkv, 2, *options),
    }


BAD_OPTIONS = {
    "causal_str": (
        (Masking(causal="no"),),
        TypeError,
        "causal must be a bool, got 'no' (str)",
    ),
    "causal_int": ((Masking(causal=1),), TypeError, "causal must be a bool, got 1 (int)"),
    "unknown_implementation": (
        (Masking(), AttnDropout(), ComputePath("bogus")),
        ValueError,
        "implementation must be one of ('reference', 'blockwise', 'auto'), got 'bogus'",
    ),
    "block_size_zero": (
        (Masking(), AttnDropout(), ComputePath("reference", 0)),
        ValueError,
        "block_size must be a positive int, got 0",
    ),
    "fused_qkv_str": (
        (Masking(), AttnDropout(), ComputePath("reference", 512, "no")),
        TypeError,
        "path.fused_qkv must be a bool, got 'no' (str)",
    ),
    "block_size_float": (
        (Masking(), AttnDropout(), ComputePath("reference", 2.0)),
        TypeError,
        "block_size must be a positive int, got 2.0 (float)",
    ),
}


@pytest.mark.parametrize("package", list(PACKAGES))
@pytest.mark.parametrize("block", ["attend", "attend_heads"])
@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_attend_refuses_a_causal_that_is_not_a_bool_and_an_unknown_path(package, block, name):
    """Before: ``causal="no"`` meant causal and ``ComputePath("bogus")`` (or a block size of 0,
    unused there) ran the reference path."""
    options, error, message = BAD_OPTIONS[name]
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        attend_calls(PACKAGES[package])[block](*options)


@pytest.mark.parametrize("implementation", ["reference", "blockwise", "auto"])
@pytest.mark.parametrize("num_queries", [2, 4, 511, 512])
def test_causal_attend_needs_as_many_queries_as_keys_on_every_path(implementation, num_queries):
    """Before: the reference path ran a causal call with T != S (the top-left corner of the mask),
    the blockwise path refused it, so ``"auto"`` took 511 queries against 256 keys and refused 512."""
    queries = RNG.standard_normal((1, num_queries, 4)).astype(np.float32)
    keys = RNG.standard_normal((1, 3, 4)).astype(np.float32)
    message = (
        f"causal attention needs T = S (self-attention), got T={num_queries}, S=3; for queries at "
        "other positions pass causal_mask(T, S, offset) to scaled_dot_product_attention"
    )
    found = errors("attend", queries, keys, keys, Masking(causal=True), path=ComputePath(implementation))
    assert found == [(ValueError, message)] * 3


@pytest.mark.parametrize("package", list(PACKAGES))
def test_blockwise_attention_refuses_a_causal_that_is_not_a_bool(package):
    message = "causal must be a bool, got 'no' (str)"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        PACKAGES[package].blockwise_attention(QUERIES, QUERIES, QUERIES, causal="no")


@pytest.mark.parametrize("package", list(PACKAGES))
def test_a_numpy_bool_is_a_bool(package):
    expected = numpy_attn.attend(QUERIES, QUERIES, QUERIES, Masking(causal=True))[0]
    for path in PATHS:
        actual = PACKAGES[package].attend(QUERIES, QUERIES, QUERIES, Masking(causal=np.True_), path=path)[0]
        np.testing.assert_allclose(np.asarray(actual), expected, *tolerance_for("float32"))


# ------------------------------------------------------------------ blockwise_attention on an empty axis


@pytest.mark.parametrize(
    "queries_shape, keys_shape, causal",
    [
        ((1, 2, 4), (1, 0, 4), False),  # no key: zeros
        ((2, 4), (0, 4), False),
        ((1, 0, 4), (1, 3, 4), False),  # no query: empty
        ((1, 0, 4), (1, 0, 4), True),
        ((0, 1, 3, 4), (0, 1, 3, 4), False),  # no batch
        ((0, 1, 3, 4), (0, 1, 3, 4), True),
        ((2, 0, 3, 4), (2, 0, 3, 4), True),  # no head
    ],
    ids=["no_key", "no_key_2d", "no_query", "no_token_causal", "no_batch", "no_batch_causal", "no_head"],
)
def test_blockwise_attention_on_an_empty_axis_gives_scaled_dot_product_attentions_result(
    queries_shape, keys_shape, causal
):
    """Before: jax_attn raised 'slice slice_sizes must be less than or equal to operand shape' for
    no key, query or head (numpy_attn gave the result), both packages 'cannot reshape array of
    size 0' for no batch, and ``jax.jit`` a ZeroDivisionError."""
    queries = RNG.standard_normal(queries_shape).astype(np.float32)
    keys = RNG.standard_normal(keys_shape).astype(np.float32)
    mask = numpy_attn.causal_mask(queries_shape[-2]) if causal and queries_shape[-2] else None
    expected = numpy_attn.scaled_dot_product_attention(queries, keys, keys, mask)
    padding_mask = np.zeros((queries_shape[0] if len(queries_shape) > 2 else 1, keys_shape[-2]), bool)
    for kwargs in ({"causal": causal}, {"causal": causal, "padding_mask": padding_mask}):
        outputs = [
            numpy_attn.blockwise_attention(queries, keys, keys, **kwargs, block_size=2),
            jax_attn.blockwise_attention(queries, keys, keys, **kwargs, block_size=2),
            jax.jit(lambda q, k, kw=kwargs: jax_attn.blockwise_attention(q, k, k, **kw, block_size=2))(
                queries, keys
            ),
        ]
        for output in outputs:
            assert output.shape == expected.shape and output.dtype == expected.dtype
            np.testing.assert_array_equal(np.asarray(output), expected)
