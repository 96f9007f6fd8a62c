"""Deadline-bounded batched gets (`get_many_into(..., timeout_s=, prefix=)`) end to end, over
both faces, with one storage node frozen on purpose (SIGSTOP) while the call runs.

What is checked: keys on the live node are read exactly; keys on the frozen node report
`cellar.LATE` (not an exception); their buffers are untouched when the call returns *and stay
untouched after the node resumes and sends what it was asked for* (no byte of a cancelled read
lands later); pins of the cancelled reads are released; `prefix=True` cuts at the first key
not read; a budget of 0 reads nothing; a negative one is refused.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

import cellar
from cellar.client.rpc import MasterChannel
from cellar.devtools.local_cluster import fetch_status
from cellar.proto import cellar_pb2 as pb
from tests.support.faces import FACES, open_face
from tests.support.pins import pins_after_release

OBJECT_BYTES = 4 << 20   # large enough that a resumed node has megabytes in flight
SENTINEL = 0xA5
KEYS = 24


@pytest.fixture(scope="module")
def cluster(module_cluster):
    # node http on: the test asks a resumed node how many reads it has served
    return module_cluster(nodes=2, segment_size="160MiB", allow_unknown_tenants="true",
                          node_flags={"http": "127.0.0.1:0"})


@pytest.fixture(params=FACES)
def client(request, cluster):
    c = open_face(request.param, "tcp", cluster.address, timeout_s=30.0,
                  tenant=f"deadline-{request.param}",
                  token=cluster.token_for(f"deadline-{request.param}", shm=True))
    yield c
    c.close()


def value(i: int) -> bytes:
    return bytes([i % 251]) * OBJECT_BYTES


def node_of_keys(cluster, tenant: str, keys: list[str]) -> list[str]:
    """Which node holds each key (replicas=1), asked straight from the master."""
    header = pb.RequestHeader(tenant=tenant, client_id="deadline-test", token=cluster.admin_token)
    channel = MasterChannel(cluster.address, fast=False)
    try:
        reply = channel.call("GetReplicas", pb.GetReplicasRequest(header=header, keys=keys),
                             time.monotonic() + 10)
        channel.call("Unpin", pb.UnpinRequest(header=header,
                                              pin_ids=[r.pin_id for r in reply.results]),
                     time.monotonic() + 10)
    finally:
        channel.close()
    return [r.replicas[0].node_id for r in reply.results]


def node_data_plane(cluster, index: int) -> dict:
    """Node `index`'s data-server counters (its /api/v1/status `data_plane`)."""
    log = cluster.nodes[index].log_path.read_text(errors="replace")
    found = re.search(r"serving tcp \S+ \(http (\S+?),", log)
    assert found and found.group(1) != "off", "the node serves no status page"
    status = fetch_status(found.group(1), 5.0)
    assert status is not None, "the node's status page did not answer"
    return status["data_plane"]


def test_a_frozen_node_makes_its_keys_late_and_nothing_lands_afterwards(cluster, client):
    keys = [f"dl/{i:02d}" for i in range(KEYS)]
    assert client.put_many([(k, value(i)) for i, k in enumerate(keys)]) == [cellar.Status.OK] * KEYS
    holders = node_of_keys(cluster, client.tenant, keys)
    frozen_id = holders[0]
    assert len(set(holders)) == 2, holders  # both nodes hold some keys
    frozen = next(i for i, n in enumerate(cluster.nodes) if n.node_id == frozen_id)
    buffers = [bytearray([SENTINEL]) * OBJECT_BYTES for _ in keys]
    served_before = node_data_plane(cluster, frozen)["requests"]["read"]
    cluster.signal_node(frozen, signal.SIGSTOP)
    try:
        results = client.get_many_into(keys, buffers, timeout_s=1.0)
        late = [i for i, n in enumerate(holders) if n == frozen_id]
        after_return = [bytes(buffers[i][:64]) + bytes(buffers[i][-64:]) for i in late]
    finally:
        cluster.signal_node(frozen, signal.SIGCONT)
    for i, (key, holder) in enumerate(zip(keys, holders, strict=True)):
        if holder == frozen_id:
            assert results[i] == cellar.LATE, key
        else:
            assert results[i] == OBJECT_BYTES and buffers[i] == value(i), key
    untouched = bytes([SENTINEL]) * 128
    assert after_return == [untouched] * len(late)
    # The node resumes and answers the reads it was sent; none of it may reach the buffers.
    # Wait until it has answered what it was sent (its read count grew, and it has closed
    # the connections the client gave up on), not a fixed sleep: a slow resumed node would
    # otherwise leave this check with nothing to check.
    deadline = time.monotonic() + 30
    while True:
        plane = node_data_plane(cluster, frozen)
        if plane["requests"]["read"] > served_before and not plane["active_connections"]:
            break
        assert time.monotonic() < deadline, f"the resumed node did not answer: {plane}"
        time.sleep(0.1)
    for i in late:
        assert buffers[i].count(SENTINEL) == OBJECT_BYTES, keys[i]
    assert pins_after_release(cluster) == 0
    # The store is intact: the same keys read fine once the node answers again.
    again = client.get_many_into(keys, buffers, timeout_s=20.0)
    assert again == [OBJECT_BYTES] * KEYS
    assert all(buffers[i] == value(i) for i in range(KEYS))
    client.remove_prefix("dl/")


def test_prefix_mode_stops_at_the_first_late_or_missing_key(cluster, client):
    keys = [f"px/{i:02d}" for i in range(8)]
    assert client.put_many([(k, value(i)[:1024]) for i, k in enumerate(keys)]) == \
        [cellar.Status.OK] * 8
    bufs = [bytearray(1024) for _ in range(9)]
    probe = keys[:3] + ["px/missing"] + keys[3:]
    got = client.get_many_into(probe, bufs, timeout_s=10.0, prefix=True)
    assert got == [1024, 1024, 1024]
    assert bytes(bufs[4]) == bytes(1024), "keys after the miss are not read"
    assert client.get_many_into(keys, bufs[:8], timeout_s=10.0, prefix=True) == [1024] * 8
    holders = node_of_keys(cluster, client.tenant, keys)
    first_frozen = holders[3]
    frozen = next(i for i, n in enumerate(cluster.nodes) if n.node_id == first_frozen)
    cut = next(i for i, n in enumerate(holders) if n == first_frozen)
    cluster.signal_node(frozen, signal.SIGSTOP)
    try:
        got = client.get_many_into(keys, [bytearray(1024) for _ in keys], timeout_s=0.5,
                                   prefix=True)
    finally:
        cluster.signal_node(frozen, signal.SIGCONT)
    assert got == [1024] * cut
    assert pins_after_release(cluster) == 0
    client.remove_prefix("px/")


def test_budget_zero_and_negative(client):
    client.upsert("b0/k", b"abc")
    buf = bytearray(b"zzz")
    assert client.get_many_into(["b0/k", "b0/none"], [buf, bytearray(3)], timeout_s=0) == \
        [cellar.LATE, cellar.LATE]
    assert buf == b"zzz"
    assert client.get_many_into(["b0/k"], [buf], timeout_s=0, prefix=True) == []
    for bad in (-0.001, float("nan"), "1", True):
        with pytest.raises(cellar.InvalidArgument, match="timeout_s"):
            client.get_many_into(["b0/k"], [buf], timeout_s=bad)
    assert buf == b"zzz"
    assert client.get_many_into(["b0/k"], [buf], timeout_s=5) == [3] and buf == b"abc"
