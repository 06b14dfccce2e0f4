# Two commands for a fresh machine: `make demo` (lint a bundled example) and `make test`.
# Both create .venv on first use. torch is pinned here, not in pyproject (which keeps a
# range): 2.14.1 is the release that pairs with an importable torchvision (needed by timm for
# the model-zoo tests). The pin does not choose the build: torch==2.14.1 from PyPI is the
# CUDA build on Linux (it pulls the nvidia-* wheels: .venv is about 5.4 GB after `make demo`
# and about 6.1 GB once `make test` has added the test extras). Where the PyTorch CPU wheel
# index is reachable, install the CPU build instead (a few hundred MB; qlint needs no GPU):
#     make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#
# Two stamps: $(VENV)/.demo (the pinned torch and `pip install -e .`: what the demo needs, no
# extra) and $(VENV)/.test (on top of it: torchvision and the test, zoo, verify, distributed and
# fix extras). `make demo` then `make test` adds the extras; `make test` alone makes both.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.14.1
PINS := $(TORCH_PIN) torchvision==0.29.1
# The zoo tests pin exact per-block results of transformers' models: the suite is run against the
# release it was written for (pyproject.toml keeps a range for users; 5.25 changed what the
# layer-reuse tests measure).
ZOO_PINS := transformers==5.24.0
TORCH_INDEX_URL ?=
TORCH_INDEX := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)

.PHONY: demo test test-fast bench bench-phases

$(VENV)/.demo: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_INDEX) $(TORCH_PIN)
	$(PY) -m pip install -q -e . $(TORCH_PIN)
	touch $@

$(VENV)/.test: $(VENV)/.demo
	$(PY) -m pip install -q $(TORCH_INDEX) $(PINS)
	$(PY) -m pip install -q -e ".[test,zoo,verify,distributed,fix]" $(PINS) $(ZOO_PINS)
	touch $@

demo: $(VENV)/.demo
	@$(VENV)/bin/qlint fixtures/mamba.py:native; echo "qlint exited with $$? (0: certified, 1: findings, 2: could not run)"

# The suite runs on every core (pytest-xdist, at most 4 workers: each holds its own torch and models), a
# test file per worker so that a file's shared fixtures are built once.
XDIST := -n auto --maxprocesses 4 --dist loadfile

test: $(VENV)/.test
	$(PY) -m pytest $(XDIST) --durations=60

# Before each commit (about 3 minutes): the algebra, the rules, the block finder, the command line and the
# certificate mechanisms, without the model zoos, corpora, patch re-checks and training runs.
FAST := tests/registry tests/remedies tests/cli tests/zoo tests/test_layering.py \
	tests/ci/test_baseline.py tests/ci/test_config.py tests/ci/test_files.py tests/ci/test_formats.py \
	tests/ci/test_suppress.py tests/ci/test_source_paths.py \
	tests/lint/test_rule_examples.py tests/lint/test_attention.py tests/lint/test_post_ln.py \
	tests/lint/test_placement.py tests/lint/test_rules_doc.py \
	tests/core/test_algebra.py tests/core/test_domain.py tests/growth/test_propagate.py tests/growth/test_blocks.py \
	tests/growth/test_engine.py tests/growth/test_relations.py tests/growth/test_fixed_values.py \
	tests/e2e/test_certificate_dataflow.py tests/e2e/test_soundness_mechanisms.py tests/e2e/test_readme.py
test-fast: $(VENV)/.test
	$(PY) -m pytest $(XDIST) $(FAST)

bench: $(VENV)/.test
	$(PY) bench/bench_speed.py --repeat 3
bench-phases: $(VENV)/.test  # where the time goes, phase by phase, on three 2-layer HF decoders (slow: about 20 min)
	$(PY) bench/bench_phases.py --repeat 3
