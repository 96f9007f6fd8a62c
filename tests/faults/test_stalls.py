"""Stopped processes (SIGSTOP, then SIGCONT).

- The master stopped for twice the node expiry time expires nobody for its own stall.
- A node stopped past its expiry loses its objects from the table; the grants issued for it
  before the expiry no longer work once it re-registers; it re-registers cleanly and takes
  new puts.
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
import xxhash
from faultkit import header, locations, node_states, raw_stub, wait_until, write_with

import cellar
from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb

KIB = 1 << 10


def values_for(prefix: str, count: int, seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}/{i}": rng.integers(0, 256, int(rng.integers(1, 64 * KIB)),
                                          dtype=np.uint8).tobytes() for i in range(count)}


@pytest.mark.timeout(60)
def test_stopped_master_expires_nobody(fault_cluster):
    cluster = fault_cluster(nodes=2, node_suspect_after_s=1, node_expire_after_s=3)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        values = values_for("k", 60, 1)
        assert client.put_many(values, replicas=1) == [Status.OK] * len(values)
        epoch = client.status()["epoch"]
        cluster.signal_master(signal.SIGSTOP)
        time.sleep(6.0)  # the stall under test: 2 x node_expire_after_s
        cluster.signal_master(signal.SIGCONT)
        status = client.status()
        assert status["epoch"] == epoch
        assert {n["node_id"]: n["state"] for n in status["nodes"]} == {
            "node-0": "ACTIVE", "node-1": "ACTIVE"}
        assert status["object_count"] == len(values)
        assert client.get_many(list(values)) == list(values.values())
        for i in range(2):
            assert "mounting again" not in cluster.node_log(i)


@pytest.mark.timeout(60)
def test_stopped_node_is_expired_its_grants_die_and_it_rejoins(fault_cluster):
    cluster = fault_cluster(nodes=2, node_suspect_after_s=1, node_expire_after_s=3,
                            write_grant_ttl_s=60)
    channel, stub = raw_stub(cluster)
    with channel, cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        values = values_for("k", 60, 2)
        assert client.put_many(values, replicas=1) == [Status.OK] * len(values)
        where = locations(stub, list(values))
        on_node0 = [k for k in values if where[k][0].node_id == "node-0"]
        assert on_node0
        # A write grant into node-0, issued before the stall and valid for a minute.
        data = b"stale grant bytes" * 100
        started = stub.PutStart(pb.PutStartRequest(header=header(), items=[
            pb.PutItem(key="stale", size_bytes=len(data), avoid_node_ids=["node-1"])]))
        stale = started.results[0]
        assert stale.status == pb.OK and stale.replicas[0].node_id == "node-0"

        cluster.signal_node(0, signal.SIGSTOP)
        wait_until("node-0 to expire", lambda: "node-0" not in node_states(client))
        cluster.signal_node(0, signal.SIGCONT)
        wait_until("node-0 to re-register", lambda: node_states(client).get("node-0") == "ACTIVE")

        # Its objects were dropped from the table and stay dropped.
        assert client.get_many(on_node0) == [None] * len(on_node0)
        # The grant from before the expiry is refused and writes nothing.
        rep = stale.replicas[0]
        seg_file = cluster.segment_file(0)
        before = seg_file.read_bytes()[rep.offset:rep.offset + len(data)]
        result = write_with(rep, started.segments, "stale", data, xxhash.xxh3_64_intdigest(data))
        assert not result.ok and "before this node's current mount" in result.message, result
        assert seg_file.read_bytes()[rep.offset:rep.offset + len(data)] == before
        ended = stub.PutEnd(pb.PutEndRequest(header=header(), items=[
            pb.PutEndItem(key="stale", put_id=stale.put_id)]))
        assert ended.results[0].status != pb.OK
        # It takes new puts again.
        fresh = stub.PutStart(pb.PutStartRequest(header=header(), items=[
            pb.PutItem(key="fresh", size_bytes=len(data), avoid_node_ids=["node-1"])]))
        assert fresh.results[0].status == pb.OK
        wrote = write_with(fresh.results[0].replicas[0], fresh.segments, "fresh", data,
                           xxhash.xxh3_64_intdigest(data))
        assert wrote.ok and wrote.receipt  # the node's receipt for the whole object
        assert stub.PutEnd(pb.PutEndRequest(header=header(), items=[pb.PutEndItem(
            key="fresh", put_id=fresh.results[0].put_id, checksum=xxhash.xxh3_64_intdigest(data),
            receipts=[wrote.receipt])])).results[0].status == pb.OK
        assert client.get("fresh") == data
        rest = [k for k in values if k not in on_node0]
        assert client.get_many(rest) == [values[k] for k in rest]


@pytest.mark.timeout(60)
def test_a_get_whose_grants_expired_while_its_node_stalled_asks_again(fault_cluster):
    """A node stopped under a read past the read grant's life (pin TTL 1 s, the node's skew
    allowance 1 s) answers it, once continued, with "grant expired": the get asks the master
    for new grants and reads, within its timeout, instead of failing the key (get_many said
    None for every key before: flows.get_batch asked again only after a leader change)."""
    cluster = fault_cluster(nodes=1, pin_ttl_s=1, read_trust_s=0, node_suspect_after_s=30,
                            node_expire_after_s=60)
    values = values_for("k", 8, 4)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as writer:
        assert writer.put_many(values, replicas=1) == [Status.OK] * len(values)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as reader:
        keys = list(values)
        assert reader.get(keys[0]) == values[keys[0]]  # the data connection is open
        cluster.signal_node(0, signal.SIGSTOP)
        resume = threading.Timer(3.5, cluster.signal_node, (0, signal.SIGCONT))
        resume.start()
        try:
            started = time.monotonic()
            got = reader.get_many(keys[1:])
            waited_s = time.monotonic() - started
        finally:
            resume.join()
        assert waited_s >= 3.0, waited_s  # the read did wait for the stalled node
        assert got == [values[k] for k in keys[1:]]


@pytest.mark.timeout(60)
def test_a_put_revoked_while_its_writer_stalled_is_placed_again(fault_cluster):
    """A writer that stalls between its write and its PutEnd past the write grant's life
    (write_grant_ttl_s 1 s; here the client's transport sleeps 3 s after the first write
    returns, as a paused process would) finds its put revoked (EXPIRED at PutEnd): the put
    places the key again and succeeds within its timeout, instead of failing it; the value
    read back is the one put, and the first allocation was freed (one object, its size)."""
    cluster = fault_cluster(nodes=1, write_grant_ttl_s=1)
    value = values_for("v", 1, 5)["v/0"]
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        (tcp,) = [t for t in client._s.transports.transports if t.name == "tcp"]  # noqa: SLF001
        real_write = tcp.write
        stalls: list[float] = []

        def stalling_write(ops, budget_s):
            results = real_write(ops, budget_s)
            if not stalls:
                stalls.append(time.monotonic())
                time.sleep(3.0)
            return results

        tcp.write = stalling_write
        started = time.monotonic()
        client.put("revoked-then-placed", value)
        assert stalls and time.monotonic() - started >= 3.0
        assert client.get("revoked-then-placed") == value
        status = client.status()
        assert status["object_count"] == 1
