# The two commands of the README. Both set up everything they need from scratch (a venv in .venv).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test bench bench-cli check-wheel

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,otel]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/agenthost demo

test: $(VENV)/.installed
	bash scripts/install_harness_clis.sh
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_host.py

bench-cli: $(VENV)/.installed
	$(PY) benchmarks/bench_cli.py

# Builds the wheel and runs the new-user path from it in fresh venvs outside the checkout (3.11 and 3.13).
check-wheel: $(VENV)/.installed
	bash scripts/check_wheel.sh
