# make test   : create .venv if missing, install everything the tests need, run ruff and pytest.
# make report : the same setup, then the parity table (class x framework x dtype vs torch_ref).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d" " -f1)
# the folders of wheels pip's configuration finds packages in (where the CPU build of torch is)
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))

.PHONY: test test-slow report lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv installs in seconds where pip takes minutes. torch first, pinned, from the CPU build that
	# pip's configuration points at (an unpinned torch, or PyPI's, pulls a CUDA build): with uv
	# where that configuration names a wheel folder, else with pip itself; then the rest, keeping
	# the torch installed.
	$(BIN)/python -m pip install --quiet "uv>=0.5"
ifneq ($(strip $(FIND_LINKS)),)
	$(BIN)/uv pip install --quiet --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS)) "torch==2.13.0"
else
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
endif
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[all]"
	# the book's own code, an outside oracle in the tests: its ch03/ch04 modules need torch alone
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps "llms-from-scratch==1.0.19"
	# uv writes no .pyc: an import of the heavy packages writes theirs, or every process the tests
	# start would compile their sources on import (6.4 s against 3.0 s for this import); torch's
	# side and JAX's side in two processes at once (11.5 s against 15.0 s in one)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "import torch; from transformers import GPT2LMHeadModel" & torch=$$!; \
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "import jax, flax.nnx, optax, hypothesis, matplotlib.pyplot" && wait $$torch
	# the notebooks' kernel (tests/test_notebooks.py) is this Python's own (ipykernel's python3 spec)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "import nbclient, ipykernel.kernelapp, rich.console"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# one xdist worker per core, each with one BLAS/OpenMP thread: two workers that each start a
# thread per core oversubscribe the machine (one run each on 2 cores: 217 s against 241 s); .pyc
# written, so that the tests' many processes compile each module once
PYTEST := OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE= \
	$(BIN)/python -m pytest -q -n auto --dist loadgroup

test: $(STAMP) lint
	$(PYTEST) -m "not slow"

test-slow: $(STAMP)
	$(PYTEST) -m slow

report: $(STAMP)
	$(BIN)/python -m parity_tests report

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
