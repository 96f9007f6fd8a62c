"""Engine tests: Cellar's adapters inside the engines' own code, against a real local cluster.

They run from the engine venvs that `tests/engines/engine_venv.py` builds outside the clone
(`make test-engines`); in any other interpreter (the project's .venv) the engine is missing
and this folder is skipped at collection, so `pytest tests` stays engine-free.

Fixtures
    `cluster`       a `LocalCluster` (master + 2 nodes, 128 MiB segments) for one module
    `fresh_cluster` a factory of clusters owned by one test (for tests that kill processes):
                    `fresh_cluster(nodes=2, **master_flags)`
    `outage_cluster` one test's master + 2 nodes (64 MiB) with fast liveness (`OUTAGE_FLAGS`:
                    a killed node's replicas drop and a restarted one re-attaches quickly),
                    every stopped (SIGSTOP) process resumed before it is stopped
"""

from __future__ import annotations

import importlib.util
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob.append("test_sglang_*.py")
if importlib.util.find_spec("lmcache") is None:
    collect_ignore_glob.append("test_lmcache_*.py")

from cellar.devtools.local_cluster import LocalCluster  # noqa: E402

SEGMENT = "128MiB"
OUTAGE_FLAGS = {"node_suspect_after_s": 1, "node_expire_after_s": 3, "pin_ttl_s": 2,
                "write_grant_ttl_s": 3, "heartbeat_interval_s": 0.3, "new_node_ramp_s": 0}


def _start(nodes: int, master_flags: dict[str, Any] | None = None) -> LocalCluster:
    cluster = LocalCluster(nodes, SEGMENT, master_flags=master_flags)
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = _start(2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def fresh_cluster() -> Iterator[Callable[..., LocalCluster]]:
    made: list[LocalCluster] = []

    def make(nodes: int = 2, **master_flags: Any) -> LocalCluster:
        c = _start(nodes, master_flags)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.stop()


@pytest.fixture
def outage_cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(2, "64MiB", master_flags=OUTAGE_FLAGS)
    try:
        c.start()
        yield c
    finally:
        for child in [*c.masters, *c.nodes]:  # never leave a stopped process behind
            if child.alive() and child.proc is not None:
                child.proc.send_signal(signal.SIGCONT)
        c.stop()
