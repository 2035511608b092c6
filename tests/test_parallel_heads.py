"""numpy_attn.parallel_heads: heads on threads give the same bits as one after another (under the
same BLAS), enter the caller's BLAS limit around the threaded loop alone, and keep random dropout
in draw order."""

import contextlib
import re

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

import numpy_attn
from numpy_attn.fast import blockwise, threads
from numpy_attn.fast.threads import HeadThreads, head_threads

NUM_HEADS = 4


class CountingLimit:
    """A stand-in for a BLAS limit: counts how often it is entered."""

    def __init__(self):
        self.entered = 0

    def __call__(self):
        self.entered += 1
        return contextlib.nullcontext()


def inputs(dtype):
    rng = np.random.default_rng(31)
    x = rng.standard_normal((2, 37, 6)).astype(dtype)
    weight = (rng.standard_normal((3 * 4 * NUM_HEADS, 6)) / 3).astype(dtype)
    bias = rng.standard_normal(3 * 4 * NUM_HEADS).astype(dtype)
    padding_mask = np.zeros((2, 37), bool)
    padding_mask[1, -5:] = True
    return x, weight, bias, padding_mask


def self_attention(x, weight, bias, padding_mask, **kwargs):
    return numpy_attn.blockwise_self_attention(
        x, weight, bias, num_heads=NUM_HEADS, causal=True, padding_mask=padding_mask, block_size=8, **kwargs
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("workers", [2, 3, 8])
def test_heads_on_threads_give_the_same_bits(dtype, workers):
    x, weight, bias, padding_mask = inputs(dtype)
    keep = np.random.default_rng(5).random((2, NUM_HEADS, 37, 37)) >= 0.3
    expected = self_attention(x, weight, bias, padding_mask)
    expected_dropped = self_attention(x, weight, bias, padding_mask, dropout=0.3, attn_keep_mask=keep)
    limit = CountingLimit()
    with numpy_attn.parallel_heads(workers, limit, min_scores=0):
        actual = self_attention(x, weight, bias, padding_mask)
        actual_dropped = self_attention(x, weight, bias, padding_mask, dropout=0.3, attn_keep_mask=keep)
    np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(actual_dropped, expected_dropped)
    assert limit.entered == 2  # once per call, around the threaded loop
    assert not np.array_equal(actual_dropped, actual)


def test_the_layer_with_blas_really_limited():
    """The benchmark's setting: threadpoolctl keeps BLAS to one thread inside the loop, the
    layer's other matmuls keep every thread; split heads too (``blockwise_attention``). OpenBLAS
    may round a matmul differently on one thread than on several: equal to rounding."""
    x, weight, bias, _ = inputs(np.float64)
    params = {
        f"{name}.weight": w
        for name, w in zip(("W_query", "W_key", "W_value"), np.split(weight, 3), strict=True)
    }
    params["out_proj.weight"] = np.eye(4 * NUM_HEADS)[::-1].copy()
    params["out_proj.bias"] = bias[: 4 * NUM_HEADS]
    kwargs = {"num_heads": NUM_HEADS, "context_length": 37, "implementation": "blockwise", "block_size": 8}
    heads = [np.random.default_rng(seed).standard_normal((2, NUM_HEADS, 37, 4)) for seed in (1, 2, 3)]
    expected = numpy_attn.multi_head_attention(params, x, **kwargs)
    expected_split = numpy_attn.blockwise_attention(*heads, causal=True, block_size=8)
    blas = ThreadpoolController()
    threads_inside = []

    def one_thread_blas():
        limit = blas.limit(limits=1, user_api="blas")
        threads_inside.append([info["num_threads"] for info in blas.select(user_api="blas").info()])
        return limit

    with numpy_attn.parallel_heads(2, one_thread_blas, min_scores=0):
        actual = numpy_attn.multi_head_attention(params, x, **kwargs)
        actual_split = numpy_attn.blockwise_attention(*heads, causal=True, block_size=8)
    np.testing.assert_allclose(actual, expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(actual_split, expected_split, rtol=1e-13, atol=1e-15)
    assert len(threads_inside) == 2 and all(threads == [1] * len(threads) for threads in threads_inside)


def test_random_dropout_keeps_the_draw_order_and_runs_one_head_at_a_time():
    x, weight, bias, padding_mask = inputs(np.float64)
    expected = self_attention(x, weight, bias, padding_mask, dropout=0.3, rng=np.random.default_rng(9))
    limit = CountingLimit()
    with numpy_attn.parallel_heads(2, limit, min_scores=0):
        actual = self_attention(x, weight, bias, padding_mask, dropout=0.3, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(actual, expected)
    assert limit.entered == 0


def test_one_worker_one_head_or_few_scores_run_no_threads():
    x, weight, bias, padding_mask = inputs(np.float64)
    limit = CountingLimit()
    with numpy_attn.parallel_heads(1, limit, min_scores=0):
        self_attention(x, weight, bias, padding_mask)
    with numpy_attn.parallel_heads(4, limit, min_scores=0):
        numpy_attn.blockwise_self_attention(x, weight[:12], bias[:12], num_heads=1, block_size=8)
    with numpy_attn.parallel_heads(4, limit, min_scores=2 * 37 * 37 + 1):  # B x T x S + 1
        self_attention(x, weight, bias, padding_mask)
    assert limit.entered == 0
    with numpy_attn.parallel_heads(4, limit, min_scores=2 * 37 * 37):
        self_attention(x, weight, bias, padding_mask)
    assert limit.entered == 1
    with numpy_attn.parallel_heads(4, limit):  # the default: 2**22 scores
        self_attention(x, weight, bias, padding_mask)
    assert limit.entered == 1 and threads.MIN_SCORES == 2**22


def test_the_setting_is_scoped_and_nests():
    assert head_threads() == HeadThreads(1, contextlib.nullcontext, 2**22)
    outer, inner = CountingLimit(), CountingLimit()
    with numpy_attn.parallel_heads(2, outer):
        with numpy_attn.parallel_heads(3, inner, min_scores=5):
            assert head_threads() == HeadThreads(3, inner, 5)
        assert head_threads() == HeadThreads(2, outer, 2**22)
    assert head_threads() == HeadThreads(1, contextlib.nullcontext, 2**22)


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        ((0, contextlib.nullcontext), ValueError, "workers must be a positive int, got 0"),
        ((True, contextlib.nullcontext), TypeError, r"workers must be a positive int, got True \(bool\)"),
        ((2.0, contextlib.nullcontext), TypeError, r"workers must be a positive int, got 2.0 \(float\)"),
        ((2, None), TypeError, "one_thread_blas must be callable, got NoneType"),
        ((2, contextlib.nullcontext, -1), ValueError, "min_scores must be a non-negative integer, got -1"),
        (
            (2, contextlib.nullcontext, np.int64(-1)),
            ValueError,
            re.escape("min_scores must be a non-negative integer, got np.int64(-1)"),
        ),
        (
            (2, contextlib.nullcontext, 1e6),
            TypeError,
            re.escape("min_scores must be a non-negative integer, got 1000000.0 (float)"),
        ),
        (
            (2, contextlib.nullcontext, True),
            TypeError,
            re.escape("min_scores must be a non-negative integer, got True (bool)"),
        ),
        (
            (2, contextlib.nullcontext, "5"),
            TypeError,
            re.escape("min_scores must be a non-negative integer, got '5' (str)"),
        ),
    ],
)
def test_bad_settings_are_rejected(arguments, error, match):
    """Each as every size (``check_size``): TypeError for a type that is not an int, ValueError
    for an int out of range."""
    workers, one_thread_blas, *min_scores = arguments
    keywords = {"min_scores": min_scores[0]} if min_scores else {}
    with (
        pytest.raises(error, match=f"^{match}$"),
        numpy_attn.parallel_heads(workers, one_thread_blas, **keywords),
    ):
        pass


def test_numpy_ints_are_ints():
    """``min_scores`` takes a NumPy int as ``workers`` does (and as every size)."""
    x, weight, bias, padding_mask = inputs(np.float64)
    expected = self_attention(x, weight, bias, padding_mask)
    limit = CountingLimit()
    with numpy_attn.parallel_heads(np.int64(2), limit, min_scores=np.int64(2 * 37 * 37)):
        np.testing.assert_array_equal(self_attention(x, weight, bias, padding_mask), expected)
    assert limit.entered == 1  # the heads ran on threads


def test_an_error_in_a_head_is_raised_to_the_caller(monkeypatch):
    def broken_block_scores(*args):
        raise FloatingPointError("a head failed")

    monkeypatch.setattr(blockwise, "_block_scores", broken_block_scores)
    x, weight, bias, padding_mask = inputs(np.float64)
    with (
        numpy_attn.parallel_heads(2, contextlib.nullcontext, min_scores=0),
        pytest.raises(FloatingPointError, match="a head"),
    ):
        self_attention(x, weight, bias, padding_mask)
