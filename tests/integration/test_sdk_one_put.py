"""A one-key put under a held put-ahead allocation made as one write and one PutEnd
(client/one_put.py), against real clusters.

- `put`, `upsert` and `put_from` of a size the client keeps putting never enter the general put
  flow: the master answers one PutEnd per put and no PutStart, and another client reads every
  value back byte-exact; the calls are counted as puts. Both faces, tcp and shm.
- A held allocation on a node that died: the write fails, the allocation is handed back, and
  the general flow puts the key on the live node (the call succeeds and reads back).
- A held allocation on a frozen node: the write waits its share of the call's timeout, and the
  general flow that follows keeps the call's deadline, so the call ends by its `timeout_s`.
(AlreadyExists, and the refusal of an allocation older than the key's last version or removal,
through this path: tests/integration/test_sdk_put_ahead.py.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

import cellar
from cellar.client import flows, metrics
from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import FACE_TRANSPORT_IDS, FACE_TRANSPORTS, open_pair
from tests.support.put_ahead import pool, rpc_count

SIZE = 64 << 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "128MiB", master_flags={"allow_unknown_tenants": "true"}) as c:
        yield c


def puts_counted() -> float:
    return metrics.REGISTRY.get_sample_value("cellar_client_requests_total", {"op": "put"}) or 0.0


@pytest.fixture
def general_puts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys that went through the general put flow (`flows.run_puts`)."""
    keys: list[str] = []
    real = flows.run_puts

    def spy(s: Any, entries: Any, **kw: Any) -> Any:
        keys.extend(e.key for e in entries)
        return real(s, entries, **kw)

    monkeypatch.setattr(flows, "run_puts", spy)
    return keys


@pytest.mark.parametrize("face_transport", FACE_TRANSPORTS, ids=FACE_TRANSPORT_IDS)
def test_single_puts_of_a_held_size_are_one_write_and_one_put_end(
        cluster: LocalCluster, face_transport: tuple[str, str], general_puts: list[str]) -> None:
    face, transport = face_transport
    writer, reader = open_pair(face, transport, cluster, f"one-put-{face}-{transport}")
    try:
        writer.put("warm0", os.urandom(SIZE))  # the first put of a size asks for nothing,
        writer.put("warm1", os.urandom(SIZE))  # the second asks: allocations held from here
        assert pool(writer).held((SIZE, 1)) >= 4
        general_puts.clear()
        values = {f"k{i}": os.urandom(SIZE) for i in range(12)}
        starts, ends, counted = (rpc_count(cluster, "PutStart"), rpc_count(cluster, "PutEnd"),
                                 puts_counted())
        memory = ctypes.create_string_buffer(SIZE)  # an engine's registered host memory
        writer.register_buffer(ctypes.addressof(memory), SIZE)
        for i, (key, value) in enumerate(values.items()):
            if i % 3 == 0:
                writer.put(key, value)
            elif i % 3 == 1:
                writer.upsert(key, value)
            else:
                ctypes.memmove(memory, value, SIZE)
                writer.put_from(key, ctypes.addressof(memory), SIZE)
        assert general_puts == [], "a put of a held size went through the general flow"
        assert rpc_count(cluster, "PutStart") == starts
        assert rpc_count(cluster, "PutEnd") - ends == len(values)
        assert puts_counted() - counted == len(values)
        assert reader.get_many(list(values)) == list(values.values())
        with pytest.raises(cellar.AlreadyExists):  # the one-step PutEnd's refusal, as a put's
            writer.put("k0", os.urandom(SIZE))
        assert reader.get("k0") == values["k0"]
    finally:
        writer.close()
        reader.close()


def test_a_held_allocation_on_a_dead_node_falls_back_to_the_live_one(
        general_puts: list[str]) -> None:
    with LocalCluster(2, "64MiB") as cluster, \
            cellar.connect(cluster.address, timeout_s=30.0, transport="tcp") as client:
        for i in range(8):  # allocations held on both nodes (placement spreads them)
            client.put(f"warm{i}", os.urandom(SIZE))
        held = list(pool(client)._held[SIZE, 1])
        assert held, "allocations are held"
        dead = held[0].targets[0][0].node_id  # the next put takes the oldest first
        index = next(i for i, node in enumerate(cluster.nodes) if node.node_id == dead)
        cluster.kill_node(index)
        general_puts.clear()
        value = os.urandom(SIZE)
        client.put("after", value)
        assert general_puts == ["after"], "the failed one-step write fell back to the flow"
        assert client.get("after") == value
        assert dead in client._s.health.unhealthy()


def test_a_held_allocation_on_a_frozen_node_ends_by_the_calls_timeout() -> None:
    # The one-step write may take half the call's time (checks.attempt_budget_s); a general
    # flow that started a deadline of its own then would spend half of a whole timeout more on
    # its first write alone, ending past `timeout_s` (6.16 s, measured); keeping the call's,
    # it writes 1.5 s of the 3 s left, and ends before (4.56 s). The master must not see the
    # frozen node as dead meanwhile, or the flow would end at once either way.
    timeout_s = 6.0
    with LocalCluster(1, "16MiB", master_flags={"node_suspect_after_s": 30,
                                                "node_expire_after_s": 60}) as cluster, \
            cellar.connect(cluster.address, timeout_s=timeout_s, transport="tcp") as client:
        client.put("warm0", os.urandom(SIZE))
        client.put("warm1", os.urandom(SIZE))
        used = pool(client).used
        cluster.signal_node(0, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(cellar.CellarError):
                client.put("frozen", os.urandom(SIZE))
            took = time.monotonic() - started
        finally:
            cluster.signal_node(0, signal.SIGCONT)
        assert pool(client).used == used + 1  # the one-step write was made, and failed
        assert took < timeout_s, f"the call took {took:.2f} s with a {timeout_s} s timeout"
