"""examples/distributed_train.py: a data-parallel GPT step over 2 ``jax.distributed`` processes
on localhost (CPU collectives) equals the same step in one process."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from parity_tests.tolerances import tolerance_for

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "distributed_train.py"


@pytest.fixture(scope="module")
def example():
    """The example as a module (its main and check_same_step), no process started."""
    spec = importlib.util.spec_from_file_location("distributed_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.subprocess
def test_two_processes_take_the_one_process_step(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "examples" / "distributed_train.py"), "--out", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, env=env, check=True, timeout=600, capture_output=True)
    expected, actual = np.load(tmp_path / "single.npz"), np.load(tmp_path / "distributed.npz")
    assert sorted(actual.files) == sorted(expected.files)
    assert "trf_blocks.1.att.W_query.weight" in expected.files
    for name in expected.files:
        rtol, atol = tolerance_for(expected[name].dtype, actual[name].dtype)
        np.testing.assert_allclose(actual[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("count", ["3", "0", "-2", "16", "two"])
def test_a_process_count_that_does_not_divide_the_batch_is_refused(example, tmp_path, capsys, count):
    """--num-processes 3 fed 6 of the 8 rows (BATCH // 3 each) and exited 0 on two different losses."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--out", str(out), "--num-processes", count])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "python examples/distributed_train.py: error: argument --num-processes: "
        f"--num-processes {count!r}: expected a divisor of the batch of 8 rows: 1, 2, 4, 8\n"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--process-id", "0"], "--process-id needs --port, the coordinator's port"),
        (["--port", "1234"], "--port needs --process-id: both are a worker's options, set by the launcher"),
        (["--process-id", "2", "--port", "1234"], "--process-id 2: expected 0 to 1 (--num-processes 2)"),
        (["--process-id", "-1", "--port", "1234"], "--process-id -1: expected 0 to 1 (--num-processes 2)"),
        (
            ["--num-processes", "4", "--process-id", "4", "--port", "1234"],
            "--process-id 4: expected 0 to 3 (--num-processes 4)",
        ),
        (
            ["--process-id", "0", "--port", "0"],
            "argument --port: --port '0': expected an integer from 1 to 65535",
        ),
        (
            ["--process-id", "0", "--port", "65536"],
            "argument --port: --port '65536': expected an integer from 1 to 65535",
        ),
    ],
)
def test_bad_worker_options_are_one_line_and_exit_code_2(example, tmp_path, capsys, argv, line):
    """--process-id 0 without --port passed "localhost:None" to jax.distributed.initialize, which
    killed the process with SIGSEGV (exit 139); the launcher passes both, in range."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--out", str(out), *argv])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"python examples/distributed_train.py: error: {line}\n"
    assert not out.exists()


def test_the_launcher_fails_naming_the_first_weight_that_differs(example, tmp_path):
    """It printed both losses and exited 0 whatever they were."""
    rng = np.random.default_rng(0)
    single = {"loss": np.float32(4.6), "tok_emb.weight": rng.standard_normal((4, 3), dtype=np.float32)}
    single["pos_emb.weight"] = rng.standard_normal((2, 3), dtype=np.float32)
    np.savez(tmp_path / "single.npz", **single)
    np.savez(tmp_path / "distributed.npz", **single)
    example.check_same_step(tmp_path)  # the same step: no exit
    moved = {**single, "tok_emb.weight": single["tok_emb.weight"] + 1e-3}
    np.savez(tmp_path / "distributed.npz", **moved)
    with pytest.raises(SystemExit) as exit_info:
        example.check_same_step(tmp_path)
    assert exit_info.value.code.startswith(
        "the distributed step differs from the one-process step, first at tok_emb.weight:\n"
    )
