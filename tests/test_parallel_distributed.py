"""examples/distributed_train.py: a data-parallel GPT step over 2 ``jax.distributed`` processes
on localhost (CPU collectives) equals the same step in one process."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from parity_tests.tolerances import tolerance_for

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
