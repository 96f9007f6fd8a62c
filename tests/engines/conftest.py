"""Engine tests: Cellar's adapters inside the engines' own code, against a real local cluster.

They run from the engine venvs that `tests/engines/engine_venv.py` builds outside the clone
(`make test-engines`); in any other interpreter (the project's .venv) the engine is missing
and this folder is skipped at collection, so `pytest tests` stays engine-free.

Fixtures
    `cluster`       a `LocalCluster` (master + 2 nodes, 128 MiB segments) for one module
    `fresh_cluster` a factory of clusters owned by one test (for tests that kill processes):
                    `fresh_cluster(nodes=2, **master_flags)`
    `tier_cluster`  a factory of one test's master + 1 node with 1 MiB of DRAM, and with
                    `disk=True` a 64 MiB disk tier under it (docs/disk-tier.md):
                    `tier_cluster(disk=False)`
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


def _owned(start: Callable[..., LocalCluster]) -> Iterator[Callable[..., LocalCluster]]:
    """A factory of clusters started by `start`, every one stopped when the test ends."""
    made: list[LocalCluster] = []

    def make(*args: Any, **kwargs: Any) -> LocalCluster:
        c = start(*args, **kwargs)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.stop()


@pytest.fixture
def fresh_cluster() -> Iterator[Callable[..., LocalCluster]]:
    yield from _owned(lambda nodes=2, **master_flags: _start(nodes, master_flags))


TIER_DRAM = "1MiB"
TIER_DISK_BYTES = 64 << 20
TIER_FLAGS = {"heartbeat_interval_s": 0.1, "tick_interval_s": 0.05}


@pytest.fixture
def tier_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalCluster]]:
    def start(*, disk: bool) -> LocalCluster:
        flags: dict[str, Any] = {}
        if disk:
            flags = {"disk_dir": str(tmp_path_factory.mktemp("disk")), "disk_size": TIER_DISK_BYTES}
        return LocalCluster(1, TIER_DRAM, node_flags=flags, master_flags=TIER_FLAGS).start()

    yield from _owned(start)


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
