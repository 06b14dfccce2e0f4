# Two commands for a fresh machine: `make demo` (lint a bundled example) and `make test`.
# Both create .venv on first use. torch is pinned here, not in pyproject (which keeps a
# range), because an unpinned install pulls a multi-GB CUDA build; 2.14.1 is the release
# that pairs with an importable torchvision (needed by timm for the model-zoo tests).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: demo test bench

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PINS)
	$(PY) -m pip install -q -e ".[test,zoo,verify,distributed]" $(PINS)
	touch $@

demo: $(VENV)/.installed
	@$(VENV)/bin/qlint fixtures/mamba.py:native; echo "qlint exited with $$? (0: certified, 1: findings, 2: could not run)"

test: $(VENV)/.installed
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) bench/bench_speed.py --repeat 3
