"""Shared test set-up."""

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Free JAX's compiled programs after each test module: the suite compiles thousands of
    shapes, and each program holds memory mappings that Linux caps per process."""
    yield
    jax.clear_caches()
