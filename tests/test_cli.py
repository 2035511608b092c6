"""The attn-parity command line: output content, exit codes, JSON schema, PNG files."""

import json
import subprocess
import sys

import numpy as np
import pytest

from parity_tests import report as report_module
from parity_tests import trace as trace_module
from parity_tests.cli import main
from parity_tests.walkthrough import STAGES


def run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_report_json_schema_and_exit_code(capsys):
    code, out = run(
        capsys,
        "report",
        "--json",
        "--layer",
        "CausalAttention",
        "--framework",
        "numpy",
        "--framework",
        "jax",
        "--dtype",
        "float64",
    )
    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True
    assert [(r["layer"], r["framework"], r["dtype"]) for r in data["rows"]] == [
        ("CausalAttention", "numpy", "float64"),
        ("CausalAttention", "jax", "float64"),
    ]
    keys = {
        "layer",
        "framework",
        "dtype",
        "cases",
        "max_abs_err",
        "max_rel_err",
        "rtol",
        "atol",
        "ok",
        "first_failure",
    }
    for row in data["rows"]:
        assert set(row) == keys
        assert row["cases"] == 10 and row["first_failure"] is None
        assert 0 <= row["max_abs_err"] <= row["atol"] + row["rtol"] * 10


def test_report_table_and_failure_exit_code(capsys, monkeypatch):
    code, out = run(
        capsys, "report", "--layer", "SelfAttentionV2", "--framework", "numpy", "--dtype", "float32"
    )
    assert code == 0 and "SelfAttentionV2" in out and "1 of 1 rows pass" in out

    def broken(case, params, x):
        steps = dict(report_module.RUNNERS["numpy"](case, params, x))
        steps["attn_weights"] = steps["attn_weights"] + 1e-3
        return steps

    monkeypatch.setitem(report_module.RUNNERS, "broken", broken)
    monkeypatch.setitem(report_module.DTYPES, "broken", ("float32",))
    rows = report_module.parity_report(["broken"], ["float32"], ["SelfAttentionV2"])
    assert not rows[0].ok and rows[0].first_failure.endswith(": attn_weights")
    monkeypatch.setattr("parity_tests.cli.RUNNERS", {**report_module.RUNNERS})
    code, out = run(
        capsys,
        "report",
        "--layer",
        "SelfAttentionV2",
        "--framework",
        "numpy",
        "--framework",
        "broken",
        "--dtype",
        "float32",
    )
    assert code == 1 and "FAIL" in out and "1 of 2 rows pass" in out


def test_trace_prints_every_step_side_by_side(capsys):
    code, out = run(capsys, "trace", "FusedCausalAttention", "--dtype", "float64")
    assert code == 0
    for step in ["queries", "attn_scores", "masked_scores", "attn_weights_dropped", "projected", "output"]:
        assert step in out
    for framework in ["numpy", "jax", "flax"]:
        assert f"{framework}: every step matches" in out


def test_trace_highlights_the_first_divergence(capsys, monkeypatch):
    real = trace_module.run_case

    def inverted_mask(framework, case, params, x, *args, **kwargs):
        output, steps = real(framework, case, params, x, *args, **kwargs)
        return output, {**steps, "masked_scores": np.where(np.isinf(steps["masked_scores"]), 0, -np.inf)}

    monkeypatch.setattr(trace_module, "run_case", inverted_mask)
    code, out = run(capsys, "trace", "MultiHeadAttention", "--framework", "numpy", "--shape", "2,4,3,4,2")
    assert code == 1
    assert "numpy: first divergence: masked_scores" in out


def test_trace_rejects_a_bad_shape(capsys):
    assert main(["trace", "MultiHeadAttention", "--shape", "2,4"]) == 2
    assert "--shape must be one of" in capsys.readouterr().err


def test_walkthrough_lists_and_replays_the_notes(capsys):
    code, out = run(capsys, "walkthrough", "--list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == [s.name for s in STAGES]
    code, out = run(capsys, "walkthrough", "--stage", "multi-head")
    assert code == 0
    assert out.count("[[[0.3190 0.4858]") == 3  # the notes' row, in torch_ref, numpy_attn, jax_attn
    assert "numpy_attn.multi_head_attention(params," in out
    assert main(["walkthrough", "--stage", "nope"]) == 2


def test_full_walkthrough_runs_every_stage_in_order(capsys):
    code, out = run(capsys, "walkthrough")
    assert code == 0
    positions = [out.index(f"{number}. {stage.title}") for number, stage in enumerate(STAGES, start=1)]
    assert positions == sorted(positions)
    assert "[0.4419 0.6515 0.5683]" in out  # z^2, the notes' first context vector
    assert "[-0.4519  0.2216  0.4772  0.1063]" in out  # the wrapper's first row


@pytest.mark.parametrize("layer", ["MultiHeadAttention", "SelfAttentionV1", "FusedCausalAttention"])
def test_heatmap_writes_a_png(tmp_path, capsys, layer):
    path = tmp_path / "weights.png"
    code, out = run(capsys, "heatmap", layer, "--out", str(path))
    assert code == 0 and f"wrote {path}" in out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image

    heads = 1 if layer == "SelfAttentionV1" else 2
    assert matplotlib.image.imread(path).shape[:2] == (380 * heads, 1600)


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "parity_tests", "walkthrough", "--list"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines()[0].startswith("one-query")
