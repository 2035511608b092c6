"""Shared test set-up."""

import os
import shutil
import tempfile

# XLA:CPU settings that make compiling fast, set before JAX starts its backend (it reads XLA_FLAGS
# then; the subprocesses the tests start inherit them). The suite compiles thousands of small
# programs and runs each a few times, so LLVM's optimisation of the machine code (level 0 for
# XLA's default 3), XLA's MLIR fusion emitters (its elemental emitter instead) and the split of a
# program's LLVM module into up to 32 parts compiled on threads (one part: a worker per core
# already keeps every core busy) cost more compile time than they save (the measurements:
# benchmarks/README.md, "Test-suite time"). A flag the run names itself is kept:
#   XLA_FLAGS="--xla_backend_optimization_level=3 --xla_cpu_use_fusion_emitters=true
#   --xla_cpu_parallel_codegen_split_count=32" make test
# runs the tests on the code users' programs get (XLA's defaults).
FAST_COMPILE = {
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
    "--xla_cpu_parallel_codegen_split_count": "1",
}
flags = os.environ.get("XLA_FLAGS", "").split()
named = {flag.split("=")[0] for flag in flags}
os.environ["XLA_FLAGS"] = " ".join(flags + [f"{k}={v}" for k, v in FAST_COMPILE.items() if k not in named])

import jax  # noqa: E402 (XLA_FLAGS is set above, before JAX starts)
import pytest  # noqa: E402

# One compilation cache per pytest run, shared by its xdist workers: the suite compiles the same
# small programs in several test modules (jax.clear_caches below empties the in-memory cache) and
# in both workers; a hit loads the program XLA compiled before instead of compiling it again.
# The run that starts the workers makes the folder and removes it at the end; the variable keeps
# subprocesses that tests start (they do not load this file) out of it.
CACHE_VARIABLE = "ATTN_PARITY_TEST_JAX_CACHE"
cache_owner = pytest.StashKey[str]()  # the folder, in the run that made it


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "subprocess: starts a subprocess of tens of seconds; collected first (see below)"
    )
    if CACHE_VARIABLE not in os.environ:
        os.environ[CACHE_VARIABLE] = tempfile.mkdtemp(prefix="attn-parity-jax-cache-")
        config.stash[cache_owner] = os.environ[CACHE_VARIABLE]
    jax.config.update("jax_compilation_cache_dir", os.environ[CACHE_VARIABLE])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # JAX writes an entry in place, without a lock unless the cache has a size limit (whose
    # eviction then scans the folder on every write): a worker may read an entry the other is
    # still writing. JAX detects the truncated entry, warns and compiles the program itself.
    config.addinivalue_line(
        "filterwarnings", "ignore:Error reading persistent compilation cache entry:UserWarning"
    )


def pytest_collection_modifyitems(items):
    """The tests that start long subprocesses first, each on a worker of its own: xdist hands the
    tests out one by one in collection order (the first two to the two workers), and one of them
    collected last would end the run on one worker while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("subprocess") is None)  # stable


def pytest_unconfigure(config):
    folder = config.stash.get(cache_owner, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        del os.environ[CACHE_VARIABLE]


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Free JAX's compiled programs after each test module: the suite compiles thousands of
    shapes, and each program holds memory mappings that Linux caps per process."""
    yield
    jax.clear_caches()
