"""Dependency boundaries: numpy_attn needs NumPy alone; only torch_ref/parity_tests use torch."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
STDLIB = {
    "__future__",
    "collections",
    "functools",
    "dataclasses",
    "typing",
    "math",
    "hashlib",
    "inspect",
    "json",
    "os",
    "re",
    "struct",
    "sys",
    "zipfile",
}
ALLOWED = {
    "numpy_attn": {"numpy", "numpy_attn", *STDLIB},
    "jax_attn": {"jax", "flax", "numpy", "numpy_attn", "jax_attn", *STDLIB},
    "torch_ref": {"torch", "numpy", "ml_dtypes", "numpy_attn", "torch_ref", *STDLIB},
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
    [("numpy_attn", ["jax", "flax", "torch"]), ("jax_attn", ["torch"]), ("parity_tests", ["jax", "torch"])],
)
def test_importing_a_package_loads_no_other_framework(package, absent):
    code = f"import sys, {package}; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
