"""A deposed leader cannot complete a put. The leader hands out write grants (PutStart), then is
frozen (SIGSTOP) past its lease; the standby takes over under a newer epoch and the nodes mount
on it. From then on the nodes refuse the old leader's grants, and once thawed the old leader
refuses PutStart and PutEnd itself (its own clock says its lease ran out), redirects to the new
leader, and reports itself a standby. The put it never saw written stays invisible; the one
written before the freeze is at most adopted, byte-exact, by the new leader's rebuild."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
import xxhash
from faultkit import header, write_with
from hakit import ha_cluster, master_stub, status, takeover_complete, wait_until

import cellar
from cellar.coord.redirect import LEADER_METADATA, leader_from_details
from cellar.proto import cellar_pb2 as pb

NODES = 2
LEASE_TTL_S = 3


def put_start(stub, key: str, size: int) -> pb.PutStartReply:
    reply = stub.PutStart(pb.PutStartRequest(header=header(), items=[
        pb.PutItem(key=key, size_bytes=size)]), timeout=5)
    assert reply.results[0].status == pb.OK, reply.results[0].message
    return reply


def refused_with_redirect(call, expect_leader: str) -> str:
    """Run `call`; it must fail UNAVAILABLE with a redirect. Returns the leader it names ("" if
    it named none yet); the trailing metadata must agree with the details."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    assert err.code() == grpc.StatusCode.UNAVAILABLE, (err.code(), err.details())
    assert "not the leader" in err.details(), err.details()
    named = leader_from_details(err.details())
    assert named in ("", expect_leader), err.details()
    metadata = dict(err.trailing_metadata() or ())
    if named:
        assert metadata.get(LEADER_METADATA) == expect_leader, metadata
    return named


@pytest.mark.timeout(120)
def test_frozen_leader_cannot_complete_a_put_after_the_new_epoch():
    with ha_cluster(nodes=NODES, lease_ttl_s=LEASE_TTL_S, write_grant_ttl_s=60) as cluster:
        old = cluster.leader()
        new = 1 - old
        first = wait_until("the first takeover", lambda: takeover_complete(cluster, old, NODES))
        channel, stub = master_stub(cluster, old)
        written = bytes(range(256)) * 32
        late = bytes(reversed(range(256))) * 32
        with channel:
            # Two puts granted by the leader: one written to its node before the freeze (only
            # PutEnd is missing), one never written.
            a = put_start(stub, "fenced/written", len(written))
            a_rep = a.results[0].replicas[0]
            assert write_with(a_rep, a.segments, "fenced/written", written,
                              xxhash.xxh3_64_intdigest(written)).ok
            b = put_start(stub, "fenced/late", len(late))
            b_rep = b.results[0].replicas[0]
            assert a_rep.grant.epoch == b_rep.grant.epoch == first["epoch"]

            cluster.signal_master(signal.SIGSTOP, old)
            frozen_at = time.monotonic()
            try:
                now = wait_until("the standby to take over with every node",
                                 lambda: takeover_complete(cluster, new, NODES), timeout_s=30)
                print(f"master-{new} took over {time.monotonic() - frozen_at:.2f}s after the "
                      f"freeze, epoch {first['epoch']} -> {now['epoch']}")
                assert now["epoch"] > first["epoch"]

                # The nodes mounted on the new epoch: the old leader's grant writes nothing.
                result = write_with(b_rep, b.segments, "fenced/late", late,
                                    xxhash.xxh3_64_intdigest(late))
                assert not result.ok, result
                print(f"node refused the old grant: {result.message}")
            finally:
                cluster.signal_master(signal.SIGCONT, old)

            # Thawed: its lease ran out on its own clock, so it refuses at once ...
            new_address = cluster.masters[new].address
            refused_with_redirect(lambda: stub.PutEnd(pb.PutEndRequest(header=header(), items=[
                pb.PutEndItem(key="fenced/written", put_id=a.results[0].put_id,
                              checksum=xxhash.xxh3_64_intdigest(written))]), timeout=5),
                new_address)
            refused_with_redirect(lambda: put_start(stub, "fenced/again", 100), new_address)
            # ... and soon names the new leader in its redirects and its status.
            wait_until("the old leader to redirect to the new one", lambda: refused_with_redirect(
                lambda: put_start(stub, "fenced/again", 100), new_address) == new_address)
            st = wait_until("the old leader to report standby", lambda: (
                status(cluster, old).get("role") == "standby" and status(cluster, old)))
            assert (st.get("leader") or {}).get("address") == new_address
            assert (st.get("leader") or {}).get("epoch") == now["epoch"]
            assert cluster.roles()[new] == "leader"
            reply = stub.ClusterStatus(pb.ClusterStatusRequest(header=header()), timeout=5)
            assert reply.role == "standby" and reply.leader_address == new_address

        # The never-written put and the refused one are nowhere. The put written under the old
        # epoch (sealed on its node, PutEnd refused) may be adopted by the new leader's rebuild,
        # as any sealed allocation is after a master change (master/node_rpcs.py), but only with
        # exactly the bytes written; the old leader itself completed nothing.
        with cellar.connect(cluster.address, timeout_s=20) as client:
            got = client.get_many(["fenced/written", "fenced/late", "fenced/again"])
            assert got[1:] == [None, None]
            assert got[0] in (None, written)
            print(f"sealed-before-the-freeze put adopted by the new leader: {got[0] is not None}")
            client.put("fenced/late", late)
            assert client.get("fenced/late") == late
