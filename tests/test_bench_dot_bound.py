"""The dot bound (parity_tests.bench.dot_bound): its FLOP count, its products and its arithmetic."""

import numpy as np

from parity_tests.bench import dot_bound
from parity_tests.bench.implementations import SHAPES, Shape
from parity_tests.tolerances import TOLERANCES

TINY = Shape("B2_T64_tiny", 2, 64, 16, 16, 2)


def test_causal_product_flops_count_the_triangle_with_its_diagonal():
    shape = Shape("s", 2, 3, 8, 8, 2)  # H = 4; per sequence and head 1 + 2 + 3 = 6 (query, key) pairs
    assert dot_bound.causal_product_flops(shape) == 2 * 2 * 2 * 4 * 6


def test_the_timed_products_compute_qk_and_weights_v():
    calls = dot_bound.dot_bound_calls(TINY, [(16, 32), (32, 16)])
    rtol, atol = TOLERANCES["float32"]
    for block in ((16, 32), (32, 16)):
        queries, keys, values, weights = dot_bound._operands(TINY, block)  # (N, bq, H), (N, bq, bk)
        assert queries.shape == (2, block[0], 8) and keys.shape == (2, block[1], 8)
        assert weights.shape == (2, *block)
        for framework in dot_bound.FRAMEWORKS:
            actual_scores = np.asarray(calls[framework, "QK^T", block]())
            actual_context = np.asarray(calls[framework, "weights @ V", block]())
            np.testing.assert_allclose(actual_scores, queries @ keys.swapaxes(-1, -2), rtol=rtol, atol=atol)
            np.testing.assert_allclose(actual_context, weights @ values, rtol=rtol, atol=atol)


def test_the_bound_is_the_projections_plus_both_products_at_their_best_throughput(monkeypatch):
    monkeypatch.setitem(SHAPES, TINY.name, TINY)
    rows = dot_bound.measure_dot_bound(TINY.name, [16, 128], [32, 64], rounds=1)  # 128 > T: left out
    assert {row["blocks"] for row in rows if any(row["blocks"])} == {(16, 32), (16, 64)}
    sdpa = next(row["median_s"] for row in rows if row["framework"] == "torch")
    for framework in dot_bound.FRAMEWORKS:
        mine = [row for row in rows if row["framework"] == framework]
        best = [max(row["gflops"] for row in mine if row["what"] == what) for what in ("QK^T", "weights @ V")]
        projections = min(row["median_s"] for row in mine if row["what"].startswith("projections"))
        expected = projections + sum(dot_bound.causal_product_flops(TINY) / (gflops * 1e9) for gflops in best)
        bound = next(row for row in mine if row["what"] == "bound")
        assert np.isclose(bound["median_s"], expected) and np.isclose(bound["ratio"], expected / sdpa)
    table = dot_bound.markdown_dot_bound(rows)
    assert "| B2_T64_tiny | jax | QK^T | 16 x 64 |" in table and "| B2_T64_tiny | jax | bound |" in table
    assert "<= 0.9x" in table and "<= 1.3x" in table
