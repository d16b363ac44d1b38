# One-command set-up: `make run` (the main job) and `make test` (the whole suite).
# Both are idempotent; a second call only checks stamps.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch: the exact CPU build (an unpinned torch pulls a multi-GB CUDA build).
TORCH  := torch==2.13.0

.PHONY: setup system-deps test test-quick run lint bench clean

setup: system-deps $(STAMP)

system-deps:
	@scripts/install-system-deps.sh

$(STAMP): setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev,train]'
	@touch $@

# Everything, slow tests included (what CI runs).
test: setup
	@scripts/run-tests.sh $(BIN)/python

# The quick default selection (skips tests marked slow).
test-quick: setup
	$(BIN)/python -m pytest -q

run: setup
	@echo "parsl-bf: the main job (HPO sweep on the local backfill emulation) needs the executor,"
	@echo "which is not built yet. Meanwhile, the allocator on an example event:"
	$(BIN)/parsl-bf solve examples/instance.json

lint: setup
	$(BIN)/ruff check parsl_bf tests benchmarks

bench: setup
	$(BIN)/python benchmarks/allocator.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
