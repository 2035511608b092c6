# make test   : create .venv if missing, install everything the tests need, run ruff and pytest.
# make report : the same setup, then the parity table (class x framework x dtype vs torch_ref).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d" " -f1)

.PHONY: test test-slow report lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned, with pip (whose configuration finds the CPU build of 2.13.0; an unpinned
	# torch pulls a CUDA build); then uv, which installs the rest in seconds where pip takes minutes
	# and keeps the torch it finds installed.
	$(BIN)/python -m pip install --quiet "torch==2.13.0" "uv>=0.5"
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[all]"
	# the book's own code, an outside oracle in the tests: its ch03/ch04 modules need torch alone
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps "llms-from-scratch==1.0.19"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint
	$(BIN)/python -m pytest -q -m "not slow" -n auto --dist loadgroup

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow -n auto --dist loadgroup

report: $(STAMP)
	$(BIN)/python -m parity_tests report

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
