# One-command set-up: `make run` (the main job) and `make test` (the whole suite).
# Both are idempotent; a second call only checks stamps.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch: the exact CPU build (an unpinned torch pulls a multi-GB CUDA build).
TORCH  := torch==2.13.0

.PHONY: setup system-deps test test-quick test-parsl-suite run lint bench bench-quick evaluation slurm-up slurm-down clean

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

# Parsl's own test suite against a stock HTEX on our local and Slurm (root) providers, and
# against the BackfillExecutor.
test-parsl-suite: setup
	scripts/parsl-suite.sh $(BIN)/python local
	scripts/parsl-suite.sh $(BIN)/python backfill
	scripts/parsl-suite.sh $(BIN)/python slurm
	scripts/parsl-suite.sh $(BIN)/python backfill-slurm
	HOSTS=netns scripts/parsl-suite.sh $(BIN)/python slurm
	HOSTS=netns scripts/parsl-suite.sh $(BIN)/python backfill-slurm

# The quick default selection (skips tests marked slow).
test-quick: setup
	$(BIN)/python -m pytest -q

# The main job: an HPO sweep (successive halving) of elastic training tasks on the
# BackfillExecutor over the local backfill emulation (configs/local.yaml: a window of a real
# idle-node trace, with preemptions). Its last line is the summary JSON.
run: setup
	$(BIN)/parsl-bf run workflows/hpo_sweep.py --config configs/local.yaml --out runs/hpo

lint: setup
	$(BIN)/ruff check parsl_bf tests benchmarks

bench: setup
	$(BIN)/python benchmarks/allocator.py
	$(BIN)/python benchmarks/formulations.py

# Every benchmark in its --quick mode: each must run, end with its JSON line and flag nothing
# (what CI checks; never a speed). The Slurm one needs root, else it is reported skipped.
bench-quick: setup
	$(BIN)/python scripts/bench-quick.py --python $(BIN)/python

# Regenerates docs/evaluation.md from real replays (about 10 minutes).
evaluation: setup
	$(BIN)/python benchmarks/evaluation.py

# A real multi-node Slurm cluster on this machine (root): see scripts/slurm-loopback.sh.
# `make slurm-up HOSTS=netns`: each node a host of its own (network namespaces).
slurm-up:
	scripts/slurm-loopback.sh up

slurm-down:
	scripts/slurm-loopback.sh down

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
