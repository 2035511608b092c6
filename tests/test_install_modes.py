"""The checker names the project's own lines whether the project is installed editable (this
checkout) or not (its packages copied into site-packages, as a wheel puts them)."""

import shutil
import subprocess
import sys
import sysconfig
import venv

import pytest

from tests.test_readme import ROOT

PACKAGES = ("numpy_attn", "jax_attn", "torch_ref", "parity_tests")
LOCATE = """
import numpy as np
import torch

import torch_ref
from parity_tests import locate
from examples.my_port import mha

torch.manual_seed(123)
reference = torch_ref.MultiHeadAttention(d_in=8, d_out=8, context_length=16, dropout=0.0, num_heads=2)
x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
report = locate(reference, mha, x, params=torch_ref.to_params(reference))
print(torch_ref.__file__)
print(report.reference_location)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A virtual environment holding a copy of the four packages in its site-packages, and this
    one's packages (torch, jax) behind them."""
    folder = tmp_path_factory.mktemp("venv")
    venv.create(folder, with_pip=False)
    site = next(folder.glob("lib/python*/site-packages"))
    for package in PACKAGES:
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return folder / "bin" / "python"


@pytest.mark.parametrize("mode", ["editable", "installed"])
def test_the_reference_line_is_the_oracles_in_every_install_mode(mode, installed, tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    python = sys.executable if mode == "editable" else str(installed)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if mode == "editable":
        env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([python, "-c", LOCATE], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    oracle, location = out.stdout.split()
    assert oracle.startswith(str(installed.parents[1]) if mode == "installed" else str(ROOT))
    path, line = location.rsplit(":", 1)
    assert path == oracle.replace("__init__.py", "multi_head.py") and int(line) > 0
