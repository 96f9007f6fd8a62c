"""Grants that prove the bytes are theirs, and put/pin ids bound to who received them.

Before: a read grant stayed valid for its TTL after the reader unpinned and the object was
removed, the master reused the range at once and the node did not look at its index on a
read, so 20 of 20 tries read the next tenant's object through an old grant; PutEnd,
PutRevoke and Unpin were accepted from anyone for any (sequential) id. Each test fails there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from identity_kit import SecurityCluster, code_of

import cellar
from cellar.client.connect_args import client_id
from cellar.client.session_state import grant_from_replica
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.proto.grant import GRANT_OP_READ
from cellar.transfer.base import SegmentRoute, TransferOp
from cellar.transfer.tcp import TcpTransport
from tests.support.receipts import receipts_for

TRIES = 20
VALUE_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def one_node() -> Iterator[LocalCluster]:
    """One node, so that the next object's range is the one just freed."""
    with LocalCluster(1, "64MiB") as cluster:
        yield cluster


def _route(segments: Any, segment_id: int) -> SegmentRoute:
    seg = next(s for s in segments if s.segment_id == segment_id)
    return SegmentRoute(seg.segment_id, seg.node_id, seg.host_id,
                        {e.transport: e.address for e in seg.endpoints if e.transport == "tcp"})


def _read_grant(stub: Any, header: Any, key: str) -> tuple[Any, Any, SegmentRoute, Any]:
    """GetReplicas of `key`: the reply, its first replica, that replica's tcp route and its
    read grant (the pin is the caller's to give back)."""
    got = stub.GetReplicas(pb.GetReplicasRequest(header=header, keys=[key]))
    old = got.results[0].replicas[0]
    return got, old, _route(got.segments, old.segment_id), grant_from_replica(old, GRANT_OP_READ)


def test_stale_read_grant_never_reads_the_next_tenants_object(
        one_node: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # Bob's next put must take the range Alice's remove just freed: not one held ahead
    monkeypatch.setenv("CELLAR_PUT_AHEAD", "0")
    alice_token, bob_token = one_node.token_for("alice"), one_node.token_for("bob")
    # this process's client id, as Alice's SDK client: her remove right after her read is not
    # held for her own read trust (master/state/read_trust.py)
    alice_h = pb.RequestHeader(tenant="alice", client_id=client_id(), token=alice_token)
    bob_h = pb.RequestHeader(tenant="bob", client_id="bob", token=bob_token)
    transport = TcpTransport(connections_per_node=1)
    reused = leaked = own_reads = 0
    with grpc.insecure_channel(one_node.address) as channel, \
            cellar.connect(one_node.address, tenant="alice", token=alice_token) as alice, \
            cellar.connect(one_node.address, tenant="bob", token=bob_token) as bob:
        stub = pb_grpc.MasterStub(channel)
        try:
            for i in range(TRIES):
                mine, theirs = os.urandom(VALUE_BYTES), os.urandom(VALUE_BYTES)
                alice.put(f"stale/{i}", mine)
                got, old, route, grant = _read_grant(stub, alice_h, f"stale/{i}")
                buf = bytearray(VALUE_BYTES)
                (first,) = transport.read([TransferOp(route, grant, old.offset, memoryview(buf))], 10)
                own_reads += first.ok and bytes(buf) == mine  # the grant works while it is hers
                stub.Unpin(pb.UnpinRequest(header=alice_h, pin_ids=[got.results[0].pin_id]))
                alice.remove(f"stale/{i}")
                bob.put(f"next/{i}", theirs)
                now = stub.GetReplicas(pb.GetReplicasRequest(header=bob_h, keys=[f"next/{i}"]))
                new = now.results[0].replicas[0]
                stub.Unpin(pb.UnpinRequest(header=bob_h, pin_ids=[now.results[0].pin_id]))
                here = (new.segment_id, new.offset) == (old.segment_id, old.offset)
                reused += here
                buf = bytearray(VALUE_BYTES)
                (late,) = transport.read([TransferOp(route, grant, old.offset, memoryview(buf))], 10)
                # Bob's bytes never; over a reused range, nothing. Where Bob's put went elsewhere,
                # a node that has not yet heard of the remove may still serve Alice her own
                # removed value under her own grant (docs/security.md), and only that.
                leaked += bytes(buf) == theirs or (late.ok and (here or bytes(buf) != mine))
        finally:
            transport.close()
    assert own_reads == TRIES
    assert reused >= TRIES // 2, "the ranges were not reused: the test proves nothing"
    assert leaked == 0


def test_put_ids_are_unguessable_and_bound_to_the_tenant(cluster: SecurityCluster, stub: Any) -> None:
    alice = pb.RequestHeader(tenant="alice", client_id="a", token=cluster.alice)
    bob = pb.RequestHeader(tenant="bob", client_id="b", token=cluster.bob)
    started = stub.PutStart(pb.PutStartRequest(header=alice, items=[
        pb.PutItem(key=f"bind/{i}", size_bytes=10) for i in range(50)]))
    ids = [r.put_id for r in started.results]
    assert all(ids) and len(set(ids)) == len(ids)
    gaps = [abs(b - a) for a, b in zip(ids, ids[1:], strict=False)]
    assert min(gaps) > 1 << 32  # random 64-bit ids, not a counter
    ref = started.results[0].put_id
    # bob: naming alice's tenant is refused; under his own tenant the id names nothing
    for rpc, request in (
        ("PutEnd", pb.PutEndRequest(header=pb.RequestHeader(tenant="alice", client_id="b", token=cluster.bob),
                                    items=[pb.PutEndItem(key="bind/0", put_id=ref)])),
        ("PutRevoke", pb.PutRevokeRequest(header=pb.RequestHeader(tenant="alice", client_id="b", token=cluster.bob),
                                          items=[pb.PutRef(key="bind/0", put_id=ref)])),
    ):
        assert code_of(lambda r=request, m=rpc: getattr(stub, m)(r)) == grpc.StatusCode.PERMISSION_DENIED
    end = stub.PutEnd(pb.PutEndRequest(header=bob, items=[pb.PutEndItem(key="bind/0", put_id=ref)]))
    assert end.results[0].status != pb.OK
    revoke = stub.PutRevoke(pb.PutRevokeRequest(header=bob, items=[pb.PutRef(key="bind/0", put_id=ref)]))
    assert revoke.results[0].status != pb.OK
    # alice's put is still hers to finish
    assert list(stub.Exists(pb.KeysRequest(header=alice, keys=["bind/0"])).statuses) == [pb.NOT_READY]
    ended = stub.PutEnd(pb.PutEndRequest(header=alice, items=[pb.PutEndItem(
        key="bind/0", put_id=ref,
        receipts=receipts_for(bytes.fromhex(cluster.secret), started.results[0], 0))]))
    assert ended.results[0].status == pb.OK
    stub.PutRevoke(pb.PutRevokeRequest(header=alice, items=[
        pb.PutRef(key=f"bind/{i}", put_id=ids[i]) for i in range(1, 50)]))


def test_pins_are_unguessable_and_only_their_tenant_unpins(cluster: SecurityCluster, stub: Any) -> None:
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as client:
        client.put("pin/1", b"pinned")
    alice = pb.RequestHeader(tenant="alice", client_id="a", token=cluster.alice)
    bob = pb.RequestHeader(tenant="bob", client_id="b", token=cluster.bob)
    pins = [stub.GetReplicas(pb.GetReplicasRequest(header=alice, keys=["pin/1"])).results[0].pin_id
            for _ in range(20)]
    assert min(abs(b - a) for a, b in zip(pins, pins[1:], strict=False)) > 1 << 32
    claims_alice = pb.RequestHeader(tenant="alice", client_id="b", token=cluster.bob)
    assert code_of(lambda: stub.Unpin(pb.UnpinRequest(header=claims_alice, pin_ids=pins))) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert stub.Unpin(pb.UnpinRequest(header=bob, pin_ids=pins)).released == 0
    assert stub.GetReplicas(pb.GetReplicasRequest(header=bob, keys=["x"], unpin_ids=pins)).results
    assert stub.Unpin(pb.UnpinRequest(header=alice, pin_ids=pins)).released == len(pins)


SHM_TRIES = 10


def test_stale_read_grant_never_reads_a_shm_writers_bytes_before_its_commit(
        one_node: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the test above, with Bob writing over shm: his bytes land in the mapping before the
    node hears his COMMIT, and the node's index still lists Alice's freed allocation until its
    heartbeat brings the notice. Alice's old grant reads the range right after Bob's copy.
    The master flags Bob's replica (`Replica.claim`: the range was read within `pin_ttl_s`
    and the node has not acknowledged its freed notice), so Bob's transport CLAIMs it before
    copying (transfer/shm_commits.py `WritePlan`). Without the claim, 10 of 10 tries read Bob's
    bytes."""
    import xxhash

    from cellar.proto.grant import GRANT_OP_WRITE
    from cellar.transfer.frame import WriteMeta
    from cellar.transfer.shm import ShmTransport

    monkeypatch.setenv("CELLAR_PUT_AHEAD", "0")
    alice_token = one_node.token_for("alice")
    bob_token = one_node.token_for("bob", shm=True)
    # this process's client id, as Alice's SDK client: her remove right after her read is not
    # held for her own read trust (master/state/read_trust.py)
    alice_h = pb.RequestHeader(tenant="alice", client_id=client_id(), token=alice_token)
    bob_h = pb.RequestHeader(tenant="bob", client_id="bob", token=bob_token)
    transport = TcpTransport(connections_per_node=1)
    reused = leaked = served = flagged = 0
    late_reads: list[tuple[TransferOp, bytes]] = []  # Alice's read to make once Bob copied

    class CopyThenRead(ShmTransport):
        def copy_write(self, ops, plan, deadline, on_done=None):  # type: ignore[no-untyped-def]
            out = super().copy_write(ops, plan, deadline, on_done)  # Bob's bytes are there now
            nonlocal leaked, served
            for op, theirs in late_reads:
                (late,) = transport.read([op], 10)
                served += late.ok
                leaked += bytes(op.buffer) == theirs
            return out

    bob_shm = CopyThenRead()
    with grpc.insecure_channel(one_node.address) as channel, \
            cellar.connect(one_node.address, tenant="alice", token=alice_token) as alice:
        stub = pb_grpc.MasterStub(channel)
        try:
            for i in range(SHM_TRIES):
                mine, theirs = os.urandom(VALUE_BYTES), os.urandom(VALUE_BYTES)
                alice.put(f"shm-stale/{i}", mine)
                got, old, route, grant = _read_grant(stub, alice_h, f"shm-stale/{i}")
                stub.Unpin(pb.UnpinRequest(header=alice_h, pin_ids=[got.results[0].pin_id]))
                alice.remove(f"shm-stale/{i}")
                started = stub.PutStart(pb.PutStartRequest(header=bob_h, items=[
                    pb.PutItem(key=f"shm-next/{i}", size_bytes=VALUE_BYTES)]))
                new = started.results[0].replicas[0]
                seg = next(s for s in started.segments if s.segment_id == new.segment_id)
                bob_route = SegmentRoute(seg.segment_id, seg.node_id, seg.host_id,
                                         {e.transport: e.address for e in seg.endpoints})
                assert bob_shm.can_reach(bob_route), "Bob writes over shm"
                late_reads[:] = []
                if (new.segment_id, new.offset) == (old.segment_id, old.offset):
                    reused += 1
                    late_reads.append((TransferOp(route, grant, old.offset,
                                                  memoryview(bytearray(VALUE_BYTES))), theirs))
                meta = WriteMeta(xxhash.xxh3_64_intdigest(theirs), VALUE_BYTES, "bob",
                                 f"shm-next/{i}")
                flagged += new.claim  # the master asks Bob to claim the range first
                (wrote,) = bob_shm.write([TransferOp(
                    bob_route, grant_from_replica(new, GRANT_OP_WRITE), new.offset,
                    memoryview(theirs), meta, claim=new.claim)], 10)
                assert wrote.ok, wrote  # Bob's own put is unharmed
                stub.PutRevoke(pb.PutRevokeRequest(header=bob_h, items=[
                    pb.PutRef(key=f"shm-next/{i}", put_id=started.results[0].put_id)]))
        finally:
            transport.close()
            bob_shm.close()
    assert reused >= SHM_TRIES // 2, "the ranges were not reused: the test proves nothing"
    assert flagged >= reused  # every reuse of a range read moments ago is flagged
    assert (leaked, served) == (0, 0)
