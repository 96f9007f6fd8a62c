# Cellar: `make run` starts a local cluster, `make test` runs the whole suite.
# Both create or reuse .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv run test test-fast lint proto bench bench-quick soak clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=69" wheel
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

run: venv
	$(VENV)/bin/cellar up

test: venv
	$(PY) -m pytest tests -q

test-fast: venv
	$(PY) -m pytest tests/unit -q

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy cellar master storage_node client transfer proto

proto: venv
	$(PY) proto/_generate.py

bench: venv
	$(VENV)/bin/cellar bench

bench-quick: venv
	$(VENV)/bin/cellar bench --quick

# 10 minutes of random checksummed traffic while nodes and the master are killed, stopped
# and restarted; exits non-zero on a corrupt read or an unexplained loss.
soak: venv
	$(VENV)/bin/cellar soak --duration 600s --report .cellar/soak-report.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
