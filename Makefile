# The developer interface. `make run` and `make test` set everything up on a
# fresh machine first.
VENV := .venv
BIN := $(VENV)/bin
export TIERTP_DATA ?= $(abspath ../shared/data)

.PHONY: help setup run demo test test-rust test-python bench paper robustness lint

help:  ## List targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

setup:  ## Create .venv with pinned deps and build the Rust extension (release)
	./scripts/setup.sh

run: setup  ## Serve the OpenAI API on embedded defaults (SmolLM2 on CPU, example tiers); Ctrl-C stops
	$(BIN)/tiertp serve

demo: setup  ## The control loop on embedded defaults, in the simulator
	$(BIN)/tiertp demo

test: setup lint test-rust test-python  ## Everything CI runs

test-rust:  ## Cargo tests (unit and property tests)
	cargo test --workspace

# In one process the suite leaves the cores partly idle while it waits on real
# servers and SGLang processes; two workers (whole modules each: a module's
# server starts once) keep a 2-core host busy and finish sooner, and more do
# not help there. tests/conftest.py starts the `slow` modules first.
PYTEST_WORKERS ?= 2

test-python:  ## Pytest suite against the built extension (PYTEST_WORKERS=0: in one process)
	$(BIN)/python -m pytest -q tests -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: setup  ## All benchmarks, one JSON object each on stdout
	$(BIN)/tiertp bench scheduler --json
	$(BIN)/tiertp bench replay --json
	$(BIN)/tiertp bench kv-migration --json
	$(BIN)/tiertp bench kv-kernels --json
	$(BIN)/tiertp bench gateway --json
	$(BIN)/tiertp bench switch --json
	$(BIN)/tiertp bench soak --json

# `make paper DURATION=60` replays 60 s per load instead of the presets' 600.
DURATION ?=

paper: setup  ## The paper's evaluation: every bench/ preset into bench/results/ (DURATION=S shortens), then the ablation and the verdict
	$(BIN)/tiertp replay --preset all $(if $(DURATION),--duration $(DURATION))
	$(BIN)/tiertp replay --preset 14b-h100x8 --ablation
	$(BIN)/tiertp replay --preset all --verdict

robustness: setup  ## Settings beyond the paper's (bench/robustness.toml) into bench/results/robustness/, then their verdict
	$(BIN)/tiertp replay --presets bench/robustness.toml --preset all --no-plots $(if $(DURATION),--duration $(DURATION))
	$(BIN)/tiertp replay --presets bench/robustness.toml --preset all --verdict

# Dead code: vulture at 80% confidence (unused imports, variables, unreachable
# code) must find nothing; tools/vulture_whitelist.py lists its false positives.
# `make lint VULTURE_CONFIDENCE=60` also lists unused functions, classes and
# attributes: suspects to look at, not all of them dead.
VULTURE_CONFIDENCE ?= 80

lint:  ## Clippy with warnings as errors, rustfmt, the import contracts (.importlinter), dead code (vulture)
	cargo clippy --workspace --all-targets --release -- -D warnings
	cargo fmt --all -- --check
	PYTHONPATH=python $(BIN)/lint-imports --no-logo --cache-dir target/import-linter
	$(BIN)/vulture python/tiertp tests tools/vulture_whitelist.py --min-confidence $(VULTURE_CONFIDENCE)
