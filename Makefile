# The two commands of the README. Both set up everything they need from scratch (a venv in .venv).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/agenthost demo

test: $(VENV)/.installed
	bash scripts/install_harness_clis.sh
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_host.py
