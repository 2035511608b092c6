"""The attn-parity command line: output content, exit codes, JSON schema, PNG files."""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from parity_tests import frameworks
from parity_tests import report as report_module
from parity_tests.cli import build_parser, main
from parity_tests.walkthrough import STAGES

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
        steps = dict(frameworks.RUNNERS["numpy"](case, params, x))
        steps["attn_weights"] = steps["attn_weights"] + 1e-3
        return steps

    monkeypatch.setitem(frameworks.RUNNERS, "broken", broken)  # the CLI's choices read the same dict
    monkeypatch.setitem(frameworks.DTYPES, "broken", ("float32",))
    rows = report_module.parity_report(["broken"], ["float32"], ["SelfAttentionV2"])
    assert not rows[0].ok and rows[0].first_failure.endswith(": attn_weights")
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


def test_report_shows_a_line_per_stage_when_stderr_is_no_terminal(capsys):
    """make report printed nothing for minutes into a pipe: a line per class and dtype as it starts."""
    code = main(
        ["report", "--layer", "SelfAttentionV2", "--layer", "CausalAttention", "--framework", "numpy"]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 0 and err == [
        f"report: {layer} in {dtype} ..."
        for layer in ("SelfAttentionV2", "CausalAttention")
        for dtype in ("float32", "float64", "float16")
    ]


def test_trace_prints_every_step_side_by_side(capsys):
    code, out = run(capsys, "trace", "FusedCausalAttention", "--dtype", "float64")
    assert code == 0
    for step in ["queries", "attn_scores", "masked_scores", "attn_weights_dropped", "projected", "output"]:
        assert step in out
    for framework in ["numpy", "jax", "flax"]:
        assert f"{framework}: every step matches" in out


def test_trace_highlights_the_first_divergence(capsys, monkeypatch):
    real = frameworks.RUNNERS["numpy"]

    def inverted_mask(case, params, x):
        steps = real(case, params, x)
        return {**steps, "masked_scores": np.where(np.isinf(steps["masked_scores"]), 0, -np.inf)}

    monkeypatch.setitem(frameworks.RUNNERS, "numpy", inverted_mask)
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
    assert out.count("[[[0.3190 0.4858]") == 1  # the notes' row, shown once for the three frameworks
    assert "the notes print [[[0.3190, 0.4858], [0.2943, 0.3897]" not in out  # a table is named, not printed
    assert out.count("the notes print this 2x6x2 table ✓") == 1
    assert "keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)" in out  # torch_ref's own line
    assert "return x.swapaxes(1, 2)  # (B, N, T, H)" in out  # numpy_attn's and jax_attn's split_heads
    assert main(["walkthrough", "--stage", "nope"]) == 2


def test_walkthrough_exits_1_when_a_step_does_not_match(capsys, monkeypatch):
    """A step that no longer computes the notes' numbers (here: every step said not to) fails the
    command, for scripts that replay the lesson as a check."""
    from parity_tests import walkthrough

    monkeypatch.setattr(walkthrough.Shown, "ok", property(lambda shown: False))
    code, _ = run(capsys, "walkthrough", "--stage", "one-query")
    assert code == 1


@pytest.mark.parametrize("layer", ["MultiHeadAttention", "SelfAttentionV1", "FusedCausalAttention"])
def test_heatmap_writes_a_png(tmp_path, capsys, layer):
    """A row of panels per head (their content: tests/test_pictures.py)."""
    path = tmp_path / "weights.png"
    code, out = run(capsys, "heatmap", layer, "--out", str(path))
    heads = 1 if layer == "SelfAttentionV1" else 2
    assert code == 0 and out.startswith(f"wrote {path}: {layer}, {heads} head(s), max |difference| ")
    assert float(out.split("max |difference| ")[1].split()[0]) < 1  # within the tolerance
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[:2] == (420 * heads, 1400)


def test_heatmap_writes_where_it_says(tmp_path, capsys):
    """A folder gets heatmap.png inside it, a name without extension gets .png (as matplotlib adds
    it): the line printed names the file written."""
    for out, written in [(tmp_path, tmp_path / "heatmap.png"), (tmp_path / "map", tmp_path / "map.png")]:
        code, printed = run(capsys, "heatmap", "SelfAttentionV1", "--out", str(out))
        assert code == 0 and printed.startswith(f"wrote {written}: ")
        assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heatmap.png", "map.png"]


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "parity_tests", "walkthrough", "--list"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines()[0].startswith("one-query")


def test_trace_compares_every_framework_of_the_one_list(capsys):
    code, out = run(capsys, "trace", "SelfAttentionV2", "--shape", "one_token")
    assert code == 0
    for framework in frameworks.RUNNERS:
        assert f"{framework}: every step matches" in out


def usage_error(capsys, *argv):
    """Exit code and stderr of a bad command line (argparse's exit included)."""
    try:
        code = main(list(argv))
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["trace", "MultiHeadAttention", "--shape", "2,4,3,5,2"], "d_out=5 is not divisible by num_heads=2"),
        (["trace", "FusedCausalAttention", "--shape", "2,4,3,6,4"], "hidden_size=6 is not divisible by"),
        (["trace", "MultiHeadAttention", "--dtype", "float16"], "argument --dtype: invalid choice"),
        (["trace", "MultiHeadAttention", "--shape", "x"], "--shape must be one of"),
        *[(["trace", "MultiHeadAttention", "--shape", shape],
           f"--shape '{shape}': every size must be at least 1")
          for shape in ("0,4,8,8,2", "2,-1,8,8,2", "2,4,8,8,0")],
        (["trace", "MultiHeadAttention", "--shape", "1,100000000000,8,8,2"],
         "--shape '1,100000000000,8,8,2': an array of shape (1, 100000000000, 8) would hold "
         "800000000000 entries, more than the 134217728 a command line may ask for"),
        (["trace", "MultiHeadAttention", "--shape", "1,20000,8,8,2"],
         "array of shape (1, 2, 20000, 20000) would hold"),
        (["heatmap", "CausalAttention", "--out", "map.jpg"],
         "map.jpg: expected a .png file, a name without extension or a folder"),
        (["train-parity", "--steps", "1", "--out", "losses.jpg"],
         "losses.jpg: expected a .png file, a name without extension or a folder"),
        (["report", "--framework", "numpy", "--dtype", "bfloat16"], "numpy compute(s) in none of the dtypes"),
        (["report", "--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["report", "--layer", "Attention"], "argument --layer: invalid choice: 'Attention'"),
        (["heatmap", "CausalAttention", "--out", "no/such/folder/map.png"], "folder"),
        (["bench", "--shape", "B2_T6_d3to4", "--out", "no/such/folder"], "no/such/folder does not exist"),
        (["walkthrough", "--stage", "nope"], "unknown stage 'nope'"),
        (["trace", "GPTModel", "--shape", "1,4,8,8,2"], "GPTModel is traced as the book runs it"),
        (["trace", "GPTModel", "--dtype", "float64"], "GPTModel is traced as the book runs it"),
    ],
)  # fmt: skip
def test_bad_usage_is_one_line_and_exit_code_2(capsys, argv, message):
    code, err = usage_error(capsys, *argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err
    assert err.startswith(f"attn-parity {argv[0]}") and "Traceback" not in err


def without_torch(*argv, tmpdir=None, absent=("torch",)):
    """The CLI in a fresh process where ``import torch`` (each of ``absent``) fails, as on an install
    without [torch] (with ``TMPDIR`` set to ``tmpdir`` if given)."""
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({list(absent)!r})); "
        f"from parity_tests.cli import main; sys.exit(main({list(argv)!r}))"
    )
    env = None if tmpdir is None else os.environ | {"TMPDIR": str(tmpdir)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)


NEEDS_TORCH = 'error: this command needs torch, which is not installed: pip install ".[all]"'


PORTS = ROOT / "tests" / "ports"
WITHOUT_TORCH_EXIT_2 = [
    ["report", "--layer", "CausalAttention", "--framework", "numpy"],
    ["trace", "CausalAttention", "--framework", "numpy"],
    ["walkthrough", "--stage", "softmax"],
    ["heatmap", "CausalAttention", "--out", "never-written.png"],
    ["bench", "--shape", "B2_T6_d3to4", "--implementation", "numpy_reference", "--no-memory"],
    ["diff", f"{PORTS}/torch_user_block.py:Attention", f"{PORTS}/numpy_fused.py:attention",
     "--init", "d_model=8", "--init", "n_head=2", "--shape", "2,5,8"],
    ["train-parity", "--steps", "1"],
]  # fmt: skip


@pytest.mark.parametrize("argv", WITHOUT_TORCH_EXIT_2, ids=lambda argv: argv[0])
def test_without_torch_the_commands_that_need_it_exit_2_with_one_line(argv, tmp_path):
    """... and leave nothing behind (bench made its temporary results folder before it failed)."""
    out = without_torch(*argv, tmpdir=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == f"attn-parity {argv[0]}: {NEEDS_TORCH}"
    assert list(tmp_path.iterdir()) == []


def test_without_torch_the_parser_runs():
    out = without_torch("--help")
    assert out.returncode == 0 and "report" in out.stdout and out.stderr == ""


def test_every_missing_package_is_named_at_once_with_the_line_that_installs_them():
    out = without_torch("train-parity", "--steps", "1", absent=("torch", "jax", "optax", "rich"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (
        "attn-parity train-parity: error: this command needs torch, jax, optax and rich, which are not "
        'installed: pip install ".[all]"'
    )


def test_a_report_of_numpy_alone_does_not_need_jax():
    out = without_torch("report", "--framework", "numpy", absent=("torch", "jax"))
    assert out.stderr.strip() == f"attn-parity report: {NEEDS_TORCH}"


def test_version_and_a_bare_call():
    version = subprocess.run(
        [sys.executable, "-m", "parity_tests", "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.strip() == "attn-parity 0.2.0"
    bare = subprocess.run([sys.executable, "-m", "parity_tests"], capture_output=True, text=True, cwd=ROOT)
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr.startswith("usage: attn-parity") and "walkthrough" in bare.stderr


def test_the_help_of_a_command_lists_the_classes_and_the_named_shapes(capsys):
    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "one of SelfAttentionV1, SelfAttentionV2," in shown and "GPTModel" in shown
    assert "full_context (3,6,5,6,3)" in shown


def test_width_is_the_same_option_before_and_after_the_command():
    parser = build_parser()
    diff = ["diff", "a.py:f", "b.py:g", "--shape", "2,3,4"]
    for command in (["walkthrough"], ["trace", "CausalAttention"], diff):
        assert parser.parse_args(["--width", "60", *command]).width == 60
        assert parser.parse_args([*command, "--width", "70"]).width == 70
        assert parser.parse_args(command).width is None


def test_with_numpy_alone_the_walkthrough_lists_its_stages():
    out = without_torch("walkthrough", "--list", absent=("torch", "jax", "flax", "rich", "matplotlib"))
    assert out.returncode == 0 and out.stderr == ""
    assert [line.split()[0] for line in out.stdout.splitlines()] == [s.name for s in STAGES]


def test_without_torch_the_walkthrough_lists_its_stages():
    out = without_torch("walkthrough", "--list")
    assert out.returncode == 0 and out.stderr == ""
    assert [line.split()[0] for line in out.stdout.splitlines()] == [s.name for s in STAGES]


def test_every_command_is_tried_without_torch():
    """A new subcommand must join one of the tests above."""
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    tried = {"walkthrough"} | {argv[0] for argv in WITHOUT_TORCH_EXIT_2}
    assert set(subcommands.choices) == tried


def test_bench_writes_the_committed_results_only_when_out_names_them(tmp_path, monkeypatch, capsys):
    """Without --out, into a new folder under the temporary folder (here tmp_path: the test left
    a /tmp/attn-parity-bench-* folder behind on every run)."""
    monkeypatch.chdir(tmp_path)  # a checkout whose benchmarks/ folder holds committed results
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("parity_tests.bench.run.gemm_peak", lambda: 100.0)  # skip the 4096^3 GEMMs
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "results.json").write_text("committed")
    argv = ["bench", "--shape", "B2_T6_d3to4", "--implementation", "torch_sdpa", "numpy_reference",
            "--rounds", "1", "--no-memory", "--no-decode"]  # fmt: skip
    assert main(argv) == 0
    assert (tmp_path / "benchmarks" / "results.json").read_text() == "committed"
    written = pathlib.Path(capsys.readouterr().out.splitlines()[-1].split()[1])
    assert written.parent.parent == tmp_path / "tmp" and written.parent.name.startswith("attn-parity-bench-")
    assert sorted(p.name for p in written.parent.iterdir()) == ["results.json", "results.png"]
    assert json.loads(written.read_text())
    assert main([*argv, "--out", "benchmarks"]) == 0
    assert (tmp_path / "benchmarks" / "results.json").read_text() != "committed"


QUICK_BENCH = ["bench", "--shape", "B2_T6_d3to4", "--rounds", "1", "--no-memory", "--no-decode"]


def test_bench_times_torch_sdpa_when_the_implementations_leave_it_out(tmp_path, monkeypatch, capsys):
    """torch SDPA is the baseline of the table's ratios and of the chart: without it the whole run
    ended in write_chart's ZeroDivisionError (a traceback, exit 1) and wrote no chart."""
    monkeypatch.setattr("parity_tests.bench.run.gemm_peak", lambda: 100.0)  # skip the 4096^3 GEMMs
    assert main([*QUICK_BENCH, "--implementation", "numpy_reference", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [row["implementation"] for row in rows] == ["torch_sdpa", "numpy_reference"]
    assert rows[0]["ratio_to_torch_sdpa"] == 1.0 and rows[1]["ratio_to_torch_sdpa"] > 0
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
    assert "| B2_T6_d3to4 | numpy_reference |" in capsys.readouterr().out


def test_bench_out_that_is_not_a_folder_is_named_so(tmp_path, monkeypatch, capsys):
    """It said "the folder ... does not exist" of a file or a FIFO; png_path's folder too."""
    monkeypatch.setattr("parity_tests.bench.run.run_benchmark", None)  # refused before the run
    file, fifo = tmp_path / "results.txt", tmp_path / "fifo"
    file.write_text("")
    os.mkfifo(fifo)
    for out in (file, fifo):
        assert usage_error(capsys, *QUICK_BENCH, "--out", str(out)) == (
            2,
            f"attn-parity bench: error: {out} is not a folder\n",
        )
    assert usage_error(capsys, "heatmap", "CausalAttention", "--out", str(file / "map.png")) == (
        2,
        f"attn-parity heatmap: error: {file} is not a folder\n",
    )
    missing = tmp_path / "missing"
    assert usage_error(capsys, *QUICK_BENCH, "--out", str(missing)) == (
        2,
        f"attn-parity bench: error: the folder {missing} does not exist\n",
    )


@pytest.mark.parametrize("name", ["results.json", "results.png"])
def test_bench_out_holding_a_fifo_for_a_result_is_refused_before_the_run(tmp_path, monkeypatch, capsys, name):
    """--out's results.json a FIFO: write_json's open blocked after the whole run until a reader
    came; results.png a FIFO: save_png's traceback after the run. Now one line, exit 2, before it."""
    monkeypatch.setattr("parity_tests.bench.run.run_benchmark", None)  # refused before the run
    os.mkfifo(tmp_path / name)
    why = "is not a regular file (a FIFO, device, directory or a link to one)"
    assert usage_error(capsys, *QUICK_BENCH, "--out", str(tmp_path)) == (
        2,
        f"attn-parity bench: error: {tmp_path / name} {why}\n",
    )


def test_bench_readme_is_checked_before_the_run(tmp_path, monkeypatch, capsys):
    """A missing file or one without the markers (in order) was a traceback (exit 1) after the
    whole benchmark; now one line, exit 2, before it."""
    monkeypatch.setattr("parity_tests.bench.run.run_benchmark", None)  # refused before the run
    no_table = "no <!-- bench:start --> marker followed by <!-- bench:end --> to hold the table"
    fifo, missing = tmp_path / "fifo.md", tmp_path / "missing.md"
    os.mkfifo(fifo)
    cases = [(missing, f"{missing} does not exist")]
    cases.append((fifo, f"{fifo} is not a regular file (a FIFO, device, directory or a link to one)"))
    for name, text in [
        ("none.md", "no markers\n"),
        ("start.md", "<!-- bench:start -->\n"),
        ("end.md", "<!-- bench:end -->\n"),
        ("reversed.md", "<!-- bench:end -->\n<!-- bench:start -->\n"),
    ]:
        (tmp_path / name).write_text(text)
        cases.append((tmp_path / name, f"{tmp_path / name}: {no_table}"))
    for readme, message in cases:
        assert usage_error(capsys, *QUICK_BENCH, "--readme", str(readme)) == (
            2,
            f"attn-parity bench: error: {message}\n",
        )
    binary = tmp_path / "binary.md"
    binary.write_bytes(b"\xff\xfe\x00")  # not text in UTF-8 (nor in ASCII)
    code, err = usage_error(capsys, *QUICK_BENCH, "--readme", str(binary))
    assert code == 2 and err.startswith(f"attn-parity bench: error: {binary}: ") and err.count("\n") == 1


def test_bench_readme_replaced_during_the_run_is_one_line(tmp_path, monkeypatch, capsys):
    """The markers checked before the run but gone at the update: one line, exit 2, the README
    untouched (and the results written)."""
    from parity_tests.bench import run

    readme, run_benchmark = tmp_path / "README.md", run.run_benchmark

    def edited_during_the_run(*args, **kwargs):
        readme.write_text("markers gone\n")
        return run_benchmark(*args, **kwargs)

    monkeypatch.setattr(run, "run_benchmark", edited_during_the_run)
    monkeypatch.setattr(run, "gemm_peak", lambda: 100.0)
    readme.write_text("<!-- bench:start -->\n<!-- bench:end -->\n")
    argv = [*QUICK_BENCH, "--implementation", "torch_sdpa", "--out", str(tmp_path), "--readme", str(readme)]
    why = "no <!-- bench:start --> marker followed by <!-- bench:end --> to hold the table"
    code, err = usage_error(capsys, *argv)  # after the run's progress lines (stderr is no terminal here)
    assert (code, err.splitlines()[-1]) == (2, f"attn-parity bench: error: cannot write {readme}: {why}")
    assert err.splitlines()[:-1] == ["bench: B2_T6_d3to4 ..."]
    assert readme.read_text() == "markers gone\n"
    assert (tmp_path / "results.json").exists()


DIFF = [
    "diff",
    f"{PORTS}/torch_user_block.py:Attention",
    f"{PORTS}/numpy_fused.py:attention",
    "--shape",
    "2,5,8",
]


@pytest.mark.parametrize(
    "argv, line",
    [
        ([*DIFF, "--seeds", "0", "-1"], "attn-parity diff: error: argument --seeds: --seeds '-1': "
         "expected an integer from 0 to 4294967295"),
        ([*DIFF, "--seeds", str(2**32)], f"attn-parity diff: error: argument --seeds: --seeds '{2**32}': "
         "expected an integer from 0 to 4294967295"),
        ([*DIFF, "--seed", "-3"], "attn-parity diff: error: argument --seed: --seed '-3': "
         "expected an integer from 0 to 4294967295"),
        ([*DIFF, "--width", "0"], "attn-parity diff: error: argument --width: --width '0': "
         "expected an integer from 40 to 1000"),
        (["--width", "10**9", "walkthrough"], "attn-parity: error: argument --width: --width '10**9': "
         "expected an integer from 40 to 1000"),
        (["bench", "--rounds", "0"], "attn-parity bench: error: argument --rounds: --rounds '0': "
         "expected an integer from 1 to 1000"),
        (["train-parity", "--steps", "-2"], "attn-parity train-parity: error: argument --steps: "
         "--steps '-2': expected an integer from 1 to 10000"),
        (["train-parity", "--steps", "1000000000"], "attn-parity train-parity: error: argument --steps: "
         "--steps '1000000000': expected an integer from 1 to 10000"),
        (["train-parity", "--seed", "-1"], "attn-parity train-parity: error: argument --seed: "
         "--seed '-1': expected an integer from 0 to 4294967295"),
    ],
)  # fmt: skip
def test_integer_options_out_of_range_are_one_line_and_exit_code_2(capsys, argv, line):
    assert usage_error(capsys, *argv) == (2, f"{line}\n")


NO_FILE_NAME = "no file name: expected a .png file, a name without extension or a folder"


@pytest.mark.parametrize(
    "argv, line",
    [
        (["train-parity", "--learning-rate", "nan"], "attn-parity train-parity: error: argument "
         "--learning-rate: --learning-rate 'nan': expected a number above 0, at most 1"),
        (["train-parity", "--learning-rate", "1e400"], "attn-parity train-parity: error: argument "
         "--learning-rate: --learning-rate '1e400': expected a number above 0, at most 1"),
        (["train-parity", "--learning-rate", "0"], "attn-parity train-parity: error: argument "
         "--learning-rate: --learning-rate '0': expected a number above 0, at most 1"),
        (["train-parity", "--learning-rate", "x"], "attn-parity train-parity: error: argument "
         "--learning-rate: --learning-rate 'x': expected a number above 0, at most 1"),
        (["train-parity", "--weight-decay", "-1"], "attn-parity train-parity: error: argument "
         "--weight-decay: --weight-decay '-1': expected a number from 0 to 1"),
        (["train-parity", "--weight-decay", "inf"], "attn-parity train-parity: error: argument "
         "--weight-decay: --weight-decay 'inf': expected a number from 0 to 1"),
        (["heatmap", "CausalAttention", "--out", ""], f"attn-parity heatmap: error: '': {NO_FILE_NAME}"),
        (["heatmap", "CausalAttention", "--out", ".PNG"],
         f"attn-parity heatmap: error: '.PNG': {NO_FILE_NAME}"),
        (["train-parity", "--steps", "1", "--out", ""],
         f"attn-parity train-parity: error: '': {NO_FILE_NAME}"),
        ([*DIFF, "--heatmap", ""], f"attn-parity diff: error: '': {NO_FILE_NAME}"),
    ],
)  # fmt: skip
def test_real_options_out_of_range_and_empty_png_names_are_one_line_and_exit_code_2(
    tmp_path, monkeypatch, capsys, argv, line
):
    """NaN, an infinity (1e400 overflows to one), a negative weight decay made torch's traceback or
    a run with lr=inf; an empty --out wrote ./.png.png and printed ``wrote .png``."""
    monkeypatch.chdir(tmp_path)
    assert usage_error(capsys, *argv) == (2, f"{line}\n")
    assert list(tmp_path.iterdir()) == []


UNWRITABLE = [
    ("heatmap", ["heatmap", "CausalAttention", "--out"]),
    ("train-parity", ["train-parity", "--steps", "1", "--out"]),
    ("diff", [*DIFF, "--heatmap"]),
]


@pytest.mark.parametrize("command, argv", UNWRITABLE)
def test_a_png_that_cannot_be_written_is_one_line_and_exit_code_2_before_any_work(
    tmp_path, monkeypatch, capsys, command, argv
):
    """A FIFO, a link to a device and a folder that takes no file (/proc): train-parity trained
    for the whole run, then died with matplotlib's traceback (exit 1, read as "parity failed")."""
    monkeypatch.setattr("parity_tests.training.train_parity", None)  # refused before training
    fifo, device = tmp_path / "fifo.png", tmp_path / "null.png"
    os.mkfifo(fifo)
    device.symlink_to(os.devnull)
    not_regular = "is not a regular file (a FIFO, device, directory or a link to one)"
    for out, message in [
        (fifo, f"{fifo} {not_regular}"),
        (device, f"{device} {not_regular}"),
        ("/proc/x.png", "the folder /proc cannot hold a new file: No such file or directory"),
    ]:
        assert usage_error(capsys, *argv, str(out)) == (2, f"attn-parity {command}: error: {message}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.png", "null.png"]


@pytest.mark.parametrize("command, argv", UNWRITABLE)
def test_a_png_link_into_a_missing_folder_is_one_line_and_exit_code_2_before_any_work(
    tmp_path, monkeypatch, capsys, command, argv
):
    """A dangling link whose target's folder does not exist passed the check (the link was missing
    to os.stat, and the probe wrote beside the link): the command did all its work (train-parity a
    whole run), then failed to open the file, naming the link as missing."""
    monkeypatch.setattr("parity_tests.training.train_parity", None)  # refused before training
    link = tmp_path / "out.png"
    target = pathlib.Path(os.path.realpath(tmp_path)) / "no-such-folder" / "x.png"
    for pointed in [target, pathlib.Path("no-such-folder", "x.png")]:  # absolute, relative to the link
        link.symlink_to(pointed)
        message = f"{link} is a link to {target}: the folder {target.parent} does not exist"
        assert usage_error(capsys, *argv, str(link)) == (2, f"attn-parity {command}: error: {message}\n")
        link.unlink()
    assert list(tmp_path.iterdir()) == []


def test_heatmap_writes_through_a_link_to_a_missing_file_in_an_existing_folder(tmp_path, capsys):
    """The write follows the link and creates its target (atomic_write replaces a link's target),
    as for the weights files: such a link is accepted."""
    (tmp_path / "maps").mkdir()
    link, target = tmp_path / "out.png", tmp_path / "maps" / "x.png"
    link.symlink_to(target)
    code, printed = run(capsys, "heatmap", "SelfAttentionV1", "--out", str(link))
    assert code == 0 and printed.startswith(f"wrote {link}: ")
    assert link.is_symlink() and target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_heatmap_turns_a_file_replaced_by_a_fifo_after_the_check_into_one_line(tmp_path, monkeypatch, capsys):
    """The --out file became a FIFO between png_path's check and the save: savefig opened it and
    blocked until a reader came; now the save refuses it, one line, exit code 2."""
    from parity_tests import usage

    out, check_writable = tmp_path / "maps.png", usage.check_writable
    monkeypatch.setattr(usage, "check_writable", lambda path: (check_writable(path), os.mkfifo(path)))
    why = f"{out} is not a regular file (a FIFO, device, directory or a link to one)"
    assert usage_error(capsys, "heatmap", "CausalAttention", "--out", str(out)) == (
        2,
        f"attn-parity heatmap: error: cannot write {out}: {why}\n",
    )


@pytest.mark.parametrize("text", ["0", "nan", "65"])
def test_the_weights_io_bench_refuses_a_size_out_of_range(capsys, text):
    from parity_tests.bench.weights_io import main as weights_io

    with pytest.raises(SystemExit) as exit_info:
        weights_io(["--gib", text])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(f"error: argument --gib: --gib {text!r}: expected a number from 0.001 to 64")
    )


def test_the_weights_io_bench_never_touches_a_users_file(tmp_path):
    """It wrote D/weights_io.safetensors and D/weights_io.npz over a user's files, then removed them."""
    from parity_tests.bench.weights_io import measure_weights_io

    mine = {tmp_path / "weights_io.safetensors": b"mine", tmp_path / "weights_io.npz": b"mine too"}
    for path, data in mine.items():
        path.write_bytes(data)
    assert len(measure_weights_io(1 / 512, (".safetensors", ".npz"), str(tmp_path))) == 4
    assert {path: path.read_bytes() for path in mine} == mine and sorted(tmp_path.iterdir()) == sorted(mine)


@pytest.mark.parametrize("case", ["missing_folder", "more_than_the_memory"])
def test_the_weights_io_bench_refuses_what_it_cannot_do_before_starting(tmp_path, monkeypatch, capsys, case):
    """A missing --dir, or weights the memory cannot hold (64 GiB on a 23 GiB machine), ended in a
    child's CalledProcessError traceback, after the save had started."""
    from parity_tests.bench import weights_io

    monkeypatch.setattr(weights_io, "measure_weights_io", None)  # never reached
    monkeypatch.setattr(weights_io, "available_memory", lambda: 2**30)
    folder = tmp_path / "nowhere" if case == "missing_folder" else tmp_path
    with pytest.raises(SystemExit) as exit_info:
        weights_io.main(["--gib", "2", "--dir", str(folder)])
    expected = (
        f"--dir {folder}: no such folder"
        if case == "missing_folder"
        else f"--gib 2.0: {2 * 2**30} bytes of weights, more than the {2**30} bytes of memory available"
    )
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"python -m parity_tests.bench.weights_io: error: {expected}\n"


@pytest.mark.parametrize("module", ["floor", "dot_bound", "small", "profile", "gpt"])
def test_a_benchmark_script_says_what_it_does_in_a_few_lines(module):
    out = subprocess.run(
        [sys.executable, "-m", f"parity_tests.bench.{module}", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0 and out.stdout.startswith(f"usage: python -m parity_tests.bench.{module}")
    assert len(out.stdout.splitlines()) < 25 and f"python -m pydoc parity_tests.bench.{module}" in out.stdout


def test_an_output_that_cannot_be_written_is_one_line():
    with open("/dev/full", "w") as full:
        out = subprocess.run(
            [sys.executable, "-m", "parity_tests", "walkthrough", "--list"],
            stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr == "attn-parity walkthrough: error: [Errno 28] No space left on device\n"
