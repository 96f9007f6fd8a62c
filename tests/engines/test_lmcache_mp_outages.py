"""Outages under LMCache 0.5.6's MP-mode StorageManager with Cellar as its L2: the master or a
node is stopped while a load task is under way and then killed (kill -9). Every L2 task
completes, with what landed (the keys it could not read LATE or a failure result; the prefetch
never hangs), the
storage manager keeps serving (L1 writes and reads, new prefetches) and loads everything from
Cellar again once the cluster is whole.

The adapter talks TCP here (`transport: tcp`) so that a dead node really stands between LMCache
and its bytes (on one host the shm transport reads the segment file without the node). Runs
from the LMCache engine venv; skipped where LMCache is not installed."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("lmcache")

import lmcache_mp_kit as kit  # noqa: E402

import cellar  # noqa: E402
from cellar.devtools.local_cluster import LocalCluster  # noqa: E402

CHUNKS = 48


@pytest.fixture
def cluster(outage_cluster: LocalCluster) -> LocalCluster:
    return outage_cluster  # conftest: fast liveness, nothing left stopped


class LoadGate:
    """Holds the adapter's next load task at its start until the test has stalled the
    cluster, so the outage lands mid-load (after LMCache's lookup found the chunks)."""

    def __init__(self, adapter: Any) -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        real = adapter._load

        async def gated(*args: Any) -> Any:
            self.entered.set()
            await asyncio.get_running_loop().run_in_executor(None, self.go.wait, kit.WAIT_S)
            return await real(*args)

        adapter._load = gated


def _stored_node(cluster: LocalCluster) -> tuple[kit.Node, list[Any]]:
    # timeout_s bounds every Cellar call, hence every task's wait on a dead master or node.
    node = kit.Node(cluster.address, transport="tcp", timeout_s=4.0)
    keys = kit.keys_for(CHUNKS, seed=11)
    node.store(keys)
    node.wait_l2_stored(CHUNKS, kit.chunk_bytes())
    node.drop_l1(keys)
    return node, keys


def _prefetch_through(node: kit.Node, keys: list[Any], stall: Callable[[], None],
                      kill: Callable[[], None]) -> tuple[kit.Prefetched, int]:
    """A prefetch whose load meets the outage: the load starts, `stall`, let it run into the
    stalled process, `kill`; the prefetch must then finish (bounded) with what landed. Returns
    it and how many adapter tasks completed as failures meanwhile."""
    gate = LoadGate(node.adapter)
    failed_before = node.adapter.failed_tasks
    out: list[kit.Prefetched] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(node.prefetch(keys))
        except BaseException as e:  # reported below: nothing may escape the storage manager
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    assert gate.entered.wait(kit.WAIT_S), "no load task reached the adapter"
    stall()
    gate.go.set()
    kill()
    worker.join(kit.WAIT_S)
    assert not worker.is_alive(), "the prefetch hung"
    assert not errors, errors
    return out[0], node.adapter.failed_tasks - failed_before


def _keeps_serving(node: kit.Node) -> None:
    """L1 keeps working while Cellar is down: a write, a prefetch (L1 hits) and its read."""
    keys = kit.keys_for(4, seed=12)
    node.store(keys)
    got = node.prefetch(keys)
    assert got.hits == 4 and node.read(keys, got) == 4


def _recovers(node: kit.Node, keys: list[Any]) -> None:
    def whole() -> bool:
        node.drop_l1(keys)
        got = node.prefetch(keys)
        exact = node.read(keys, got) if got.hits else 0
        return got.l2_hits == len(keys) and exact == len(keys)

    kit.wait_until(whole, "every chunk loaded from Cellar again")


def _busiest_node(cluster: LocalCluster) -> int:
    """The index of the node holding the most objects (so killing it loses some chunks)."""
    with cellar.connect(cluster.address) as client:
        counts = {n["node_id"]: int(n["object_count"]) for n in client.status()["nodes"]}
    names = [child.name for child in cluster.nodes]
    return names.index(max(counts, key=lambda node_id: counts[node_id]))


def test_node_killed_mid_load(cluster: LocalCluster) -> None:
    node, keys = _stored_node(cluster)
    try:
        victim = _busiest_node(cluster)
        got, _ = _prefetch_through(node, keys,
                                   stall=lambda: cluster.signal_node(victim, signal.SIGSTOP),
                                   kill=lambda: cluster.kill_node(victim))
        assert got.hits < len(keys)  # the victim's chunks did not load (no second replica)
        assert node.read(keys, got) == got.hits  # what did land is exact
        _keeps_serving(node)
        cluster.restart_node(victim)  # same identity and segment file: it re-attaches its chunks
        _recovers(node, keys)
    finally:
        node.close()


def test_master_killed_mid_load(cluster: LocalCluster) -> None:
    node, keys = _stored_node(cluster)
    try:
        got, _ = _prefetch_through(node, keys,
                                   stall=lambda: cluster.signal_master(signal.SIGSTOP),
                                   kill=lambda: cluster.kill_master())
        # no master: nothing loads; the load task ends within its budget with every key LATE
        # (the SDK's contract for a deadline-bounded get; it raised Unavailable before
        # 2026-12-06, when the task failed as a whole)
        assert got.hits == 0
        _keeps_serving(node)
        cluster.start_master()  # rebuilds its table from the nodes' own indexes
        _recovers(node, keys)
    finally:
        node.close()
