"""numpy_attn's blockwise shift: each query's scores are lowered by the first key block's maximum,
and a block is done again with the running maximum only when its weights say the shift is wrong.
These inputs force each reason for a new shift; every result must equal the reference math."""

import numpy as np
import pytest

import numpy_attn
from numpy_attn.fast import blockwise
from parity_tests.compare import compare_arrays
from parity_tests.tolerances import TOLERANCES

RTOL, ATOL = TOLERANCES["float64"]


def reference(queries, keys, values, causal=False, padding_mask=None):
    mask = numpy_attn.causal_mask(queries.shape[-2], keys.shape[-2]) if causal else None
    if padding_mask is not None:
        hidden_keys = padding_mask[:, None, None, :]  # (B, 1, 1, S)
        mask = hidden_keys if mask is None else mask | hidden_keys
    return numpy_attn.scaled_dot_product_attention(queries, keys, values, mask)


@pytest.fixture
def new_shifts(monkeypatch):
    """How many blocks were done again with a new shift."""
    calls = []

    def counted(*args):
        calls.append(blockwise._needs_new_shift.__wrapped__(*args))
        return calls[-1]

    counted.__wrapped__ = blockwise._needs_new_shift
    monkeypatch.setattr(blockwise, "_needs_new_shift", counted)
    return calls


def problem(num_tokens=64, head_dim=8, seed=0, batch=2, heads=2):
    rng = np.random.default_rng(seed)
    shape = (batch, heads, num_tokens, head_dim)
    return rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape)


def test_random_scores_keep_the_first_blocks_shift(new_shifts):
    queries, keys, values = problem(num_tokens=256)
    expected = reference(queries, keys, values, causal=True)
    actual = numpy_attn.blockwise_attention(queries, keys, values, causal=True, block_size=64)
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
    assert len(new_shifts) == 2 * (4 + 3 + 2 + 1)  # two heads' causal blocks (the batch is an axis of each)
    assert not any(new_shifts)  # with 64 keys a block, no later block's weights sum above 64


@pytest.mark.parametrize("causal", [False, True])
def test_scores_rising_far_above_the_first_blocks_maximum_take_a_new_shift(new_shifts, causal):
    queries, keys, values = problem()
    keys = keys * np.linspace(1, 60, keys.shape[-2])[:, None]  # later keys: scores up to ~60x, exp overflows
    expected = reference(queries, keys, values, causal=causal)
    actual = numpy_attn.blockwise_attention(queries, keys, values, causal=causal, block_size=16)
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
    assert any(new_shifts)


def test_a_query_that_saw_only_padding_is_shifted_by_the_scores_it_sees(new_shifts):
    queries, keys, values = problem()
    padding_mask = np.zeros((2, 64), bool)
    padding_mask[0, :20] = True  # sequence 0: its first key block (16 keys) is all padding
    queries[0, ..., 0], keys[0, ..., 0] = 1, -1e4  # its scores all near -3500: exp(score) = 0
    expected = reference(queries, keys, values, padding_mask=padding_mask)
    actual = numpy_attn.blockwise_attention(queries, keys, values, padding_mask=padding_mask, block_size=16)
    assert np.abs(expected[0]).max() > 0.1  # a real softmax, not the zeros of an underflow
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
    assert any(new_shifts)


def test_sums_stay_within_the_online_softmax_overflow_bound():
    queries, keys, values = problem()
    values = values * 1e36  # float32 overflows past ~3.4e38: 64 weights of 1 may not sum
    keys = keys * np.linspace(1, 3, 64)[:, None]  # later scores a little above the first block's
    queries32, keys32, values32 = (a.astype(np.float32) for a in (queries, keys, values))
    expected = reference(queries32, keys32, values32, causal=True)
    actual = numpy_attn.blockwise_attention(queries32, keys32, values32, causal=True, block_size=16)
    assert np.isfinite(expected).all() and np.isfinite(actual).all()
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(actual / 1e36, expected / 1e36, rtol=rtol, atol=atol)


def test_a_nan_score_stays_in_its_own_row(new_shifts):
    queries, keys, values = problem()
    queries[1, 0, 40, 3] = np.nan
    expected = reference(queries, keys, values, causal=True)
    actual = numpy_attn.blockwise_attention(queries, keys, values, causal=True, block_size=16)
    assert np.isnan(actual[1, 0, 40]).all() and np.isnan(actual).sum() == 8
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)  # NaN where expected is NaN


def test_exp_overflowing_above_a_stale_shift_warns_nothing(new_shifts):
    """float32's exp overflows 88 above the shift: the block's inf (and inf x 0 = NaN) weights
    only call for a new shift, so no RuntimeWarning (an error under this project's pytest
    settings, and under a caller's ``np.seterr(over="raise")``) escapes."""
    queries, keys, values = (a.astype(np.float32) for a in problem())
    keys = keys * np.linspace(1, 60, 64, dtype=np.float32)[:, None]
    expected = reference(queries, keys, values, causal=True)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        actual = numpy_attn.blockwise_attention(queries, keys, values, causal=True, block_size=16)
    row = compare_arrays("context_vec", expected, actual)  # float32's tolerance
    assert np.isfinite(expected).all() and row.ok, row
    assert any(new_shifts)
