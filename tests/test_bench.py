"""The benchmark suite's machinery on its tiny shape (no timing is asserted: timings are noisy)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from parity_tests.bench.implementations import IMPLEMENTATIONS, SHAPES, layer_flops, make_call, make_inputs
from parity_tests.bench.output import README_END, README_START, markdown_table, update_readme, write_chart
from parity_tests.bench.run import run_benchmark
from parity_tests.compare import compare_arrays


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_every_implementation_computes_the_same_layer(name):
    shape = SHAPES["B2_T6_d3to4"]
    params, x = make_inputs(shape)
    expected = make_call("torch_ref", shape, params, x)()
    row = compare_arrays("output", expected, make_call(name, shape, params, x)())
    assert row.ok, row


def test_flop_count_by_hand():
    # B=2, T=6, D=E=4: projections 2*2*6*4*12 + 2*2*6*4*4 = 1152 + 384; attention 2*2*36*4 = 576
    assert layer_flops(SHAPES["B2_T6_d3to4"].__class__("s", 2, 6, 4, 4, 2)) == 1152 + 384 + 576


def test_benchmark_results_table_chart_and_readme(tmp_path):
    results = run_benchmark(["B2_T6_d3to4"], ["torch_sdpa", "numpy_reference", "jax_blockwise"], rounds=2,
                            memory=False, decode=False)  # fmt: skip
    json.dumps(results)  # JSON-ready
    rows = results["results"]
    assert [r["implementation"] for r in rows] == ["torch_sdpa", "numpy_reference", "jax_blockwise"]
    for row in rows:
        assert len(row["samples_s"]) == 2 and row["median_s"] > 0
        assert row["gflops"] == pytest.approx(layer_flops(SHAPES["B2_T6_d3to4"]) / row["median_s"] / 1e9)
    assert rows[0]["ratio_to_torch_sdpa"] == 1.0
    assert results["gemm_peak_gflops"] > 0
    table = markdown_table(results)
    assert table.count("| B2_T6_d3to4 |") == 3 and "1.00x" in table
    write_chart(results, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{README_START}\nold table\n{README_END}\nafter\n")
    update_readme(results, readme)
    text = readme.read_text()
    assert (
        "old table" not in text and table in text and text.startswith("before") and text.endswith("after\n")
    )


def test_too_big_and_repeated_implementations_are_skipped_not_run():
    from parity_tests.bench.run import skip_reason

    assert "24 GiB" in skip_reason("numpy_reference", SHAPES["B1_T16384"])
    assert skip_reason("numpy_blockwise", SHAPES["B1_T16384"]) is None
    assert skip_reason("torch_ref", SHAPES["B8_T1024"]) is None
    assert "blockwise path from 512" in skip_reason("jax_auto", SHAPES["B8_T1024"])  # same as jax_blockwise
    assert skip_reason("jax_auto", SHAPES["B2_T6_d3to4"]) is None
    assert skip_reason("numpy_auto", SHAPES["B2_T6_d3to4"]) is None


def test_memory_is_measured_in_a_fresh_process():
    command = [sys.executable, "-m", "parity_tests.bench.memory", "numpy_blockwise", "B2_T6_d3to4"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["implementation"] == "numpy_blockwise" and isinstance(result["extra_bytes"], int)
    assert 0 <= result["extra_bytes"] < 50 * 2**20  # a tiny call allocates next to nothing


def test_decode_speed_reports_both_paths():
    from parity_tests.bench.run import decode_speed

    result = decode_speed("numpy", tokens=32, steps=2, rounds=1)
    assert result["cached_tokens_per_s"] > 0 and result["recompute_tokens_per_s"] > 0
    assert np.isclose(result["speedup"], result["cached_tokens_per_s"] / result["recompute_tokens_per_s"])


def test_profile_times_every_stage_of_every_framework(monkeypatch):
    from parity_tests.bench import profile

    monkeypatch.setattr(profile, "gemm_peak", lambda: 100.0)  # skip the 4096^3 GEMMs
    rows = profile.profile_stages("B2_T6_d3to4", rounds=2)
    assert [(r["framework"], r["stage"]) for r in rows] == [
        (framework, stage) for framework in ("torch", "numpy", "jax") for stage in profile.STAGES
    ]
    # B=2, T=6, D=3, E=4: QKV 2*2*6*3*12 = 864 FLOP, the core 2*2*36*4 = 576, the output 2*2*6*4*4 = 384
    expected_flops = {
        "QKV projection": 864,
        "attention core": 576,
        "output projection": 384,
        "whole layer": 1824,
    }
    for row in rows:
        assert row["median_s"] > 0 and row["cores_used"] >= 0
        assert row["gflops"] == pytest.approx(expected_flops[row["stage"]] / row["median_s"] / 1e9)
        assert row["pct_of_gemm_peak"] == pytest.approx(row["gflops"])  # a peak of 100 GFLOP/s
    table = profile.markdown_profile(rows)
    assert table.count("\n| B2_T6_d3to4 |") == 12 and "| numpy | attention core |" in table
