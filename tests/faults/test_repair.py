"""Re-replication and drain with real processes (master/repair.py, storage_node/copier.py).

- kill -9 one of 3 nodes for good: every object written with replicas=2 gets its second copy
  back on another live node (node to node), while gets keep succeeding; the lost node comes
  back with its old replicas: the surplus copies are dropped, no object keeps more than 2.
- drain one of 3 nodes under a get loop: no get fails, the drain reports done, then the node
  stops and every object reads back byte-exact.
- the same re-replication when every data port speaks TLS: the copier verifies the source
  node's certificate against the cluster's CA.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import numpy as np
import pytest
from faultkit import FAST, TEST_ADMIN_TOKEN, FaultCluster, locations, raw_stub, wait_until

import cellar
from cellar.errors import Status
from cellar.proto import cellar_pb2_grpc as pb_grpc

KIB = 1 << 10
OBJECTS = 500


def values_for(prefix: str, count: int, seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}/{i}": rng.integers(0, 256, int(rng.integers(1, 32 * KIB)),
                                          dtype=np.uint8).tobytes() for i in range(count)}


class GetLoop:
    """Gets of random keys in a thread, each checked byte for byte, until stopped."""

    def __init__(self, address: str, values: dict[str, bytes]) -> None:
        self.address = address
        self.values = values
        self.gets = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GetLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        keys = list(self.values)
        rng = random.Random(7)
        with cellar.connect(self.address, timeout_s=20, transport="tcp") as client:
            while not self._stop.is_set():
                key = rng.choice(keys)
                try:
                    got = client.get(key)
                except cellar.CellarError as exc:
                    self.failures.append(f"{key}: {type(exc).__name__}: {exc}")
                    continue
                if got != self.values[key]:
                    self.failures.append(f"{key}: wrong bytes")
                self.gets += 1


def replica_nodes(stub: Any, keys: list[str]) -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for start in range(0, len(keys), 256):
        batch = keys[start:start + 256]
        found = locations(stub, batch)
        for key in batch:
            where[key] = [r.node_id for r in found.get(key, [])]
    return where


@pytest.mark.timeout(150)
def test_kill_9_a_node_for_good_replicas_come_back_and_a_returning_node_adds_none(fault_cluster):
    cluster = fault_cluster(nodes=3, segment_size="64MiB", rebuild_grace_s=1)
    channel, stub = raw_stub(cluster)
    values = values_for("r", OBJECTS, 11)
    keys = list(values)
    with channel, cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        assert client.put_many(values, replicas=2) == [Status.OK] * OBJECTS
        before = replica_nodes(stub, keys)
        assert all(len(set(n)) == 2 for n in before.values())
        victim = "node-1"
        on_victim = [k for k in keys if victim in before[k]]
        assert len(on_victim) > OBJECTS // 3
        with GetLoop(cluster.address, values) as loop:
            killed_at = time.monotonic()
            cluster.kill_node(1)

            def restored() -> bool:
                where = replica_nodes(stub, keys)
                return all(len(n) == 2 and len(set(n)) == 2 and victim not in n
                           for n in where.values())

            wait_until("every object to have 2 live replicas again", restored, timeout_s=30,
                       interval_s=0.25)
            took_s = time.monotonic() - killed_at
            loop_gets = loop.gets
        print(f"\nre-replication: {len(on_victim)} objects back to 2 replicas {took_s:.1f}s "
              f"after kill -9 (node expiry {cluster.master_flags['node_expire_after_s']}s "
              f"included); {loop_gets} gets meanwhile", file=sys.stderr)
        assert loop.failures == [] and loop_gets > 0
        # The lost node comes back with its old replicas (same id, journal, segment file).
        cluster.restart_node(1)
        wait_until("the returning node to report its objects",
                   lambda: "reported" in cluster.node_log(1))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            where = replica_nodes(stub, keys)
            counts = [len(n) for n in where.values()]
            assert max(counts) <= 3
            if max(counts) == 2 == min(counts):
                break
            time.sleep(0.25)
        where = replica_nodes(stub, keys)
        assert all(len(n) == 2 and len(set(n)) == 2 for n in where.values()), \
            {k: n for k, n in where.items() if len(n) != 2}
        assert client.get_many(keys) == [values[k] for k in keys]


@pytest.mark.timeout(150)
def test_drain_a_node_under_a_get_loop_then_stop_it_nothing_is_lost(fault_cluster):
    cluster = fault_cluster(nodes=3, segment_size="64MiB")
    channel, stub = raw_stub(cluster)
    ones = values_for("one", OBJECTS // 2, 21)
    twos = values_for("two", OBJECTS // 2, 22)
    values = {**ones, **twos}
    keys = list(values)
    with channel, cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        assert client.put_many(ones, replicas=1) == [Status.OK] * len(ones)
        assert client.put_many(twos, replicas=2) == [Status.OK] * len(twos)
        before = replica_nodes(stub, keys)
        on_node = [k for k in keys if "node-2" in before[k]]
        assert len(on_node) > OBJECTS // 5
        with GetLoop(cluster.address, values) as loop:
            drain = subprocess.run(
                [sys.executable, "-m", "cellar", "node", "drain", "node-2",
                 "--http", f"{cluster.host}:{cluster.http_port}", "--token", TEST_ADMIN_TOKEN,
                 "--timeout", "60s", "--interval", "0.2s"],
                capture_output=True, text=True, timeout=90)
            assert drain.returncode == 0, drain.stdout + drain.stderr
            assert "drained" in drain.stdout
            # placements avoid the draining node
            fresh = values_for("fresh", 20, 23)
            assert client.put_many(fresh, replicas=2) == [Status.OK] * len(fresh)
            assert all("node-2" not in n for n in replica_nodes(stub, list(fresh)).values())
        assert loop.failures == [] and loop.gets > 0
        where = replica_nodes(stub, keys)
        for key in keys:
            wanted = 1 if key in ones else 2
            assert len([n for n in where[key] if n != "node-2"]) == wanted, (key, where[key])
        cluster.kill_node(2, sig=15)  # a clean stop (SIGTERM: it unmounts)
        assert client.get_many(keys) == [values[k] for k in keys]
        assert client.get_many(list(fresh)) == list(fresh.values())


@pytest.mark.timeout(120)
def test_a_drain_goes_on_across_a_master_restart(fault_cluster):
    """`cellar node drain` is running (paced at 512 KiB/s, so it takes seconds) when the master
    is killed and restarted: the new master knows nothing of the drain, the command sees that
    and asks again, the drain finishes (exit 0), and with the node stopped every object reads
    back byte-exact. Before, the command polled a master that no longer drained the node until
    its timeout (exit 1)."""
    cluster = fault_cluster(nodes=3, segment_size="64MiB", repair_bytes_per_s="512KiB",
                            rebuild_grace_s=3)
    values = values_for("d", 300, 31)
    keys = list(values)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        assert client.put_many(values) == [Status.OK] * len(values)
        drain = subprocess.Popen(
            [sys.executable, "-m", "cellar", "node", "drain", "node-2",
             "--http", f"{cluster.host}:{cluster.http_port}", "--token", TEST_ADMIN_TOKEN,
             "--timeout", "90s", "--interval", "0.2s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert drain.stdout is not None
        first = drain.stdout.readline()
        assert "left to copy" in first, first
        cluster.restart_master()
        rest, _ = drain.communicate(timeout=100)
        out = first + rest
        print(out)
        assert drain.returncode == 0, out
        assert "asking again" in out and "drained" in out
        channel, stub = raw_stub(cluster)
        with channel:
            where = replica_nodes(stub, keys)
        assert all(any(n != "node-2" for n in where[k]) for k in keys)
        cluster.kill_node(2, sig=15)
        assert client.get_many(keys) == [values[k] for k in keys]


@pytest.mark.timeout(150)
def test_a_lost_nodes_disk_values_are_copied_to_another_disk(fault_cluster, tmp_path):
    """Three nodes whose DRAM (4 MiB each) is all held by soft-pinned fillers, each with a disk
    tier: values put with replicas=2 spill to two disks. kill -9 one node for good: every value
    it held gets its second copy on the third node's disk tier (node to node, the copier
    writing into the disk file), byte-exact, and no value gets a DRAM replica. Before, repair
    placed copies in DRAM only, which had no room and which it never evicts for: the values
    stayed a replica short."""
    disk = tmp_path / "disk"
    disk.mkdir()
    cluster = fault_cluster(nodes=3, segment_size="4MiB", rebuild_grace_s=1,
                            node_flags={"disk_dir": str(disk), "disk_size": 64 << 20})
    channel, stub = raw_stub(cluster)
    values = values_for("cold", 60, 31)
    keys = list(values)
    with channel, cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        for i in range(3):  # one node's whole DRAM each (the freest DRAM takes the next)
            client.put(f"filler/{i}", bytes(4 << 20), soft_pin=True)
        assert client.put_many(values, replicas=2) == [Status.OK] * len(values)
        assert client.lookup(keys).tiers["disk"].keys == len(keys)
        before = replica_nodes(stub, keys)
        victim = "node-1"
        on_victim = [k for k in keys if victim in before[k]]
        assert on_victim and all(len(set(n)) == 2 for n in before.values())
        cluster.kill_node(1)

        def restored() -> bool:
            return all(len(n) == 2 and len(set(n)) == 2 and victim not in n
                       for n in replica_nodes(stub, keys).values())

        wait_until("every value to have 2 live replicas again", restored, timeout_s=30,
                   interval_s=0.25)
        assert client.lookup(keys).tiers["disk"].keys == len(keys)  # no copy went to DRAM
        assert client.get_many(keys) == [values[k] for k in keys]


@pytest.mark.timeout(120)
def test_replicas_come_back_when_the_data_ports_speak_tls():
    # LocalCluster(tls=True): every node's data port is tls://, its certificate from the
    # cluster's CA. The copier must read the surviving replica over TLS, verified against that
    # CA: before it was given the CA, every copy failed its handshake
    # (CERTIFICATE_VERIFY_FAILED), and killed nodes' objects stayed short of a replica forever.
    with FaultCluster(3, "64MiB", tls=True, master_flags={**FAST, "rebuild_grace_s": 1}) as cluster:
        assert cluster.tls is not None
        channel = grpc.secure_channel(cluster.address, grpc.ssl_channel_credentials(
            cluster.tls.ca_file.read_bytes()))
        stub = pb_grpc.MasterStub(channel)
        values = values_for("tls", 200, 31)
        keys = list(values)
        with channel, cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
            assert client.put_many(values, replicas=2) == [Status.OK] * len(keys)
            before = replica_nodes(stub, keys)
            on_victim = [k for k in keys if "node-1" in before[k]]
            assert len(on_victim) > len(keys) // 4
            cluster.kill_node(1)

            def restored() -> bool:
                where = replica_nodes(stub, keys)
                return all(len(set(n)) == 2 and "node-1" not in n for n in where.values())

            wait_until("every object to have 2 live replicas again", restored, timeout_s=40,
                       interval_s=0.25)
            assert client.get_many(keys) == [values[k] for k in keys]
        for index in (0, 2):
            assert "CERTIFICATE_VERIFY_FAILED" not in cluster.node_log(index)
        cluster.check_master_invariants()
