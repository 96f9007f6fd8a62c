"""kill -9 a storage node in the middle of a batch put and of a batch get: the batch reports
per-key outcomes (or succeeds through another replica), and nothing visible is partial."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import cellar
from cellar.errors import Status

KIB = 1 << 10


def values_for(prefix: str, count: int, seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}/{i}": rng.integers(0, 256, int(rng.integers(64 * KIB, 512 * KIB)),
                                          dtype=np.uint8).tobytes() for i in range(count)}


@pytest.mark.timeout(90)
def test_kill_9_node_during_batch_put_and_batch_get(fault_cluster):
    cluster = fault_cluster(nodes=3, segment_size="128MiB")
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

        # batch puts while node-1 dies: per-key statuses; every OK key reads back exactly or
        # died with node-1 (a miss), and no failed key is visible
        written: dict[str, tuple[bytes, Status]] = {}
        stop.clear()

        def write_loop() -> None:
            round_ = 0
            while not stop.is_set():
                fresh = values_for(f"fresh{round_}", 40, 10 + round_)
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
        keys = list(written)
        survivors = 0
        for key, value in zip(keys, client.get_many(keys), strict=True):
            expected, status = written[key]
            if status == Status.OK:
                assert value is None or value == expected, key
                survivors += value is not None
            else:
                assert value is None, key
        assert survivors, "no acknowledged put survived on the remaining node"
