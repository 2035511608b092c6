"""Dependency boundaries: numpy_attn needs NumPy (and safetensors for its weight files) alone; only
torch_ref/parity_tests use torch."""

import ast
import pathlib
import subprocess
import sys
import tomllib
from fnmatch import fnmatch

import numpy as np
import pytest

from parity_tests.arrays import erf

ROOT = pathlib.Path(__file__).resolve().parents[1]
STDLIB = {
    "__future__",
    "collections",
    "concurrent",
    "contextlib",
    "contextvars",
    "functools",
    "dataclasses",
    "errno",
    "fcntl",
    "itertools",
    "shutil",
    "typing",
    "math",
    "hashlib",
    "inspect",
    "json",
    "importlib",
    "os",
    "resource",
    "operator",
    "re",
    "struct",
    "sys",
    "zipfile",
    "io",
    "reprlib",
    "secrets",
    "stat",
    "weakref",
    "zlib",
}
ALLOWED = {
    "numpy_attn": {"numpy", "safetensors", "numpy_attn", *STDLIB},  # safetensors: the weight files
    "jax_attn": {"jax", "flax", "numpy", "numpy_attn", "jax_attn", *STDLIB},
    "torch_ref": {"torch", "numpy", "ml_dtypes", "torch_ref", *STDLIB},
}


def imported_top_level_modules(package: str) -> set[str]:
    names = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package):
    assert imported_top_level_modules(package) <= ALLOWED[package]


@pytest.mark.parametrize(
    "package, absent",
    [
        ("numpy_attn", ["jax", "flax", "torch"]),
        ("jax_attn", ["torch"]),
        ("torch_ref", ["numpy_attn", "jax_attn", "parity_tests", "jax"]),  # the oracle stands alone
        ("parity_tests", ["jax", "torch"]),
        ("parity_tests.cli", ["jax", "torch"]),  # commands import their framework when they run
    ],
)
def test_importing_a_package_loads_no_other_framework(package, absent):
    code = f"import sys, {package}; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "package, framework, extra", [("jax_attn", "jax", "jax"), ("torch_ref", "torch", "torch")]
)
def test_a_missing_framework_names_the_extra_to_install(package, framework, extra):
    code = f"import sys; sys.modules[{framework!r}] = None; import {package}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1
    last_line = out.stderr.strip().splitlines()[-1]
    assert last_line == (
        f"ModuleNotFoundError: {package} needs {framework}, which is not installed: "
        f'pip install ".[{extra}]" (from the clone\'s folder)'
    )


def test_the_wheel_ships_the_four_packages_and_not_the_tests():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}  # tests/ has one too
    shipped = {name for name in packages if any(fnmatch(name, pattern) for pattern in include)}
    assert shipped == {"numpy_attn", "jax_attn", "torch_ref", "parity_tests"}
    assert all((ROOT / package / "py.typed").exists() for package in shipped)
    assert config["tool"]["setuptools"]["package-data"]["*"] == ["py.typed"]


def test_the_command_line_and_the_checker_import_with_numpy_alone():
    """No undeclared dependency (scipy came with JAX): `python -m parity_tests walkthrough --list`
    and `from parity_tests import locate` run where only NumPy and safetensors are installed."""
    absent = ["torch", "jax", "flax", "scipy", "rich", "matplotlib", "optax", "threadpoolctl", "ml_dtypes"]
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({absent!r})); "
        "from parity_tests import locate, compare_steps; from parity_tests.cli import main; "
        "sys.exit(main(['walkthrough', '--list']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("one-query")


def test_erf_is_scipys():
    scipy = pytest.importorskip("scipy.special")
    x = np.linspace(-6, 6, 1001)
    np.testing.assert_array_max_ulp(erf(x), scipy.erf(x), maxulp=2)
