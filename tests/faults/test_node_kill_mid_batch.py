"""kill -9 a storage node in the middle of a batch put and of a batch get: the batch reports
per-key outcomes (or succeeds through another replica), nothing visible is partial, and no
acknowledged write is lost unless every replica of it was on a killed node (the master keeps
the dead nodes' replicas listed, node_expire_after_s=60, so the test can tell where each lived)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from faultkit import TEST_ADMIN_TOKEN

import cellar
from cellar.errors import Status
from tests.support.placement import allowed_misses, evicted_keys, replica_nodes

KIB = 1 << 10


def values_for(prefix: str, count: int, seed: int, max_bytes: int = 512 * KIB) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}/{i}": rng.integers(0, 256, int(rng.integers(max_bytes // 8, max_bytes)),
                                          dtype=np.uint8).tobytes() for i in range(count)}


@pytest.mark.timeout(90)
def test_kill_9_node_during_batch_put_and_batch_get(fault_cluster):
    cluster = fault_cluster(nodes=3, segment_size="128MiB", node_expire_after_s=60)
    with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
        # batch get while node-0 dies: every replicas=2 object still reads back exactly
        stored = values_for("stored", 150, 1)
        assert client.put_many(stored, replicas=2) == [Status.OK] * len(stored)
        got: list[list[bytes | None]] = []
        stop = threading.Event()

        def read_loop() -> None:
            while not stop.is_set():
                got.append(client.get_many(list(stored)))

        reader = threading.Thread(target=read_loop)
        reader.start()
        time.sleep(0.3)
        cluster.kill_node(0)
        time.sleep(0.5)
        stop.set()
        reader.join(60)
        assert not reader.is_alive() and len(got) >= 2
        for batch in got:
            assert batch == list(stored.values())

        # batch puts while node-1 dies: per-key statuses; every OK key reads back exactly, or
        # (a miss) every replica of it was on a killed node; no failed key is visible
        written: dict[str, tuple[bytes, Status]] = {}
        stop.clear()

        def write_loop() -> None:
            round_ = 0
            while not stop.is_set():
                # small values: the rounds must fit on the one surviving node, nothing evicted
                fresh = values_for(f"fresh{round_}", 40, 10 + round_, max_bytes=32 * KIB)
                for (key, value), status in zip(fresh.items(), client.put_many(fresh, replicas=1),
                                                strict=True):
                    written[key] = (value, status)
                round_ += 1

        writer = threading.Thread(target=write_loop)
        writer.start()
        time.sleep(0.3)
        cluster.kill_node(1)
        time.sleep(0.5)
        stop.set()
        writer.join(60)
        assert not writer.is_alive() and len(written) >= 80
        assert evicted_keys(cluster.http_url) == 0, "evictions make misses legitimate"
        acked = [key for key, (_, status) in written.items() if status == Status.OK]
        placed = replica_nodes(cluster.address, TEST_ADMIN_TOKEN, acked)
        assert set(acked) <= set(placed), "an acknowledged key is no longer listed by the master"
        may_miss = allowed_misses(placed, {"node-0", "node-1"})
        on_survivor = [key for key in acked if key not in may_miss]
        assert on_survivor, "no acknowledged put lives on the surviving node: nothing is checked"
        keys = list(written)
        lost: list[str] = []
        for key, value in zip(keys, client.get_many(keys), strict=True):
            expected, status = written[key]
            if status != Status.OK:
                assert value is None, key
            elif value is None:
                if key not in may_miss:
                    lost.append(key)
            else:
                assert value == expected, key
        assert not lost, (f"{len(lost)} acknowledged keys with a replica on a surviving node "
                          f"read as a miss: {[(k, sorted(placed[k])) for k in lost[:5]]}")
