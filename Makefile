# The two commands of the README. Both set up everything they need from scratch (a venv in .venv).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test check lint docs docs-serve bench bench-cli check-wheel ts-sdk

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,otel]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/agenthost demo

# The whole suite, slow end-to-end tests included (what CI runs), two workers per core: a worker waits for much
# of its time (process starts, sandboxes, the timeouts and restarts the tests exercise), and a second one per core
# runs meanwhile (docs/development.md has the measurements). `make test TEST_WORKERS=2` for one per core.
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(2 * (os.cpu_count() or 1))')
test: $(VENV)/.installed ts-sdk
	bash scripts/install_harness_clis.sh
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The TypeScript runner SDK's npm workspace, installed into the repo (no root) and built; without Node.js 18+ it
# says what is missing and its tests skip.
ts-sdk:
	bash scripts/build_typescript_sdk.sh

# The everyday loop: lint, format, the public surfaces' types (mypy is incremental: its cache in .mypy_cache), and
# the unit and contract tests: every test that starts no process (no host or CLI process, plugin, sandbox, harness,
# browser, PostgreSQL) and is not marked slow. tests/process_guard.py marks the others `e2e` and fails an unmarked
# test that starts a process, so the split cannot drift. `make test` runs everything.
check: lint
	$(PY) -m pytest -q -n auto --dist worksteal -m "not slow and not e2e"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/source_tree.py
	$(VENV)/bin/mypy

$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $@

# The documentation site, built with --strict (mkdocs.yml): a broken link, anchor or reference fails the build.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_host.py

bench-cli: $(VENV)/.installed
	$(PY) benchmarks/bench_cli.py

# Builds the wheel and runs the new-user path from it in fresh venvs outside the checkout (3.11 and 3.13).
check-wheel: $(VENV)/.installed
	bash scripts/check_wheel.sh
