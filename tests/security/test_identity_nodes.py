"""Node RPCs need a node credential, and a node may act only as itself.

On a master without authentication one MountSegment with a real node's id, an
UnmountSegment, a Heartbeat listing its ranges as lost, or a ReportObjects of forged entries,
sent from the client port, dropped or poisoned that node's objects; and any process could
mount a segment and be handed later puts. Each test fails there.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import grpc
import pytest
from identity_kit import SecurityCluster, code_of

import cellar
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import node_credential
from tests.integration.node_harness import start_node

NODE_RPCS = ("MountSegment", "UnmountSegment", "Heartbeat", "ReportObjects")


def _segments(cluster: SecurityCluster, stub: Any) -> dict[str, list[Any]]:
    """node id -> its SegmentStatus entries (asked with the admin token)."""
    header = pb.RequestHeader(client_id="admin", token=cluster.admin_token)
    out: dict[str, list[Any]] = {}
    for s in stub.ClusterStatus(pb.ClusterStatusRequest(header=header)).segments:
        out.setdefault(s.info.node_id, []).append(s)
    return out


def _attack(rpc: str, header: pb.RequestHeader, victim: str, segment: Any, alloc_id: int) -> Any:
    """The request of `rpc` that would hurt node `victim` if the master accepted it."""
    sid = segment.info.segment_id
    if rpc == "MountSegment":  # a new incarnation: the master would expire the real node
        return pb.MountSegmentRequest(header=header, node_id=victim, incarnation=7,
                                      segments=[segment.info])
    if rpc == "UnmountSegment":
        return pb.UnmountSegmentRequest(header=header, node_id=victim, segment_ids=[sid])
    if rpc == "Heartbeat":  # every object of the segment "failed verification"
        return pb.HeartbeatRequest(header=header, node_id=victim, incarnation=1, lost=[
            pb.FreedRange(segment_id=sid, alloc_id=alloc_id, offset=0, length=1 << 20)])
    return pb.ReportObjectsRequest(header=header, node_id=victim, segment_id=sid, last=True,
                                   entries=[pb.ReportedObject(tenant="alice", key="forged",
                                                              alloc_id=2**64 - 1, length=4)])


def test_node_rpcs_refuse_clients_strangers_and_other_nodes(cluster: SecurityCluster, stub: Any) -> None:
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        for i in range(8):
            alice.put(f"nodes/{i}", b"v%d" % i, replicas=2)
        before = _segments(cluster, stub)
        assert set(before) == {"node-0", "node-1"}
        victim, segment = "node-1", before["node-1"][0]
        secret = bytes.fromhex(cluster.secret)
        wrong_secret = node_credential(secrets.token_bytes(32), victim)
        headers = {
            "a tenant token": (pb.RequestHeader(client_id="x", token=cluster.alice),
                               grpc.StatusCode.PERMISSION_DENIED),
            "the admin token": (pb.RequestHeader(client_id="x", token=cluster.admin_token),
                                grpc.StatusCode.PERMISSION_DENIED),
            "another node's credential": (
                pb.RequestHeader(client_id="x", token=node_credential(secret, "node-0")),
                grpc.StatusCode.PERMISSION_DENIED),
            "a credential of another secret": (pb.RequestHeader(client_id="x", token=wrong_secret),
                                               grpc.StatusCode.UNAUTHENTICATED),
            "no credential": (pb.RequestHeader(client_id="x"), grpc.StatusCode.UNAUTHENTICATED),
        }
        for rpc in NODE_RPCS:
            for what, (header, expected) in headers.items():
                request = _attack(rpc, header, victim, segment, alloc_id=1)
                assert code_of(lambda r=request, m=rpc: getattr(stub, m)(r)) == expected, (rpc, what)
        after = _segments(cluster, stub)
        assert {n: [(s.info.segment_id, s.state, s.object_count) for s in v] for n, v in after.items()} == \
               {n: [(s.info.segment_id, s.state, s.object_count) for s in v] for n, v in before.items()}
        for i in range(8):
            assert alice.get(f"nodes/{i}") == b"v%d" % i
        assert not alice.exists("forged")


def test_a_node_credential_cannot_call_client_rpcs(cluster: SecurityCluster, stub: Any) -> None:
    token = node_credential(bytes.fromhex(cluster.secret), "node-0")
    header = pb.RequestHeader(tenant="alice", client_id="node-0", token=token)
    assert code_of(lambda: stub.Exists(pb.KeysRequest(header=header, keys=["nodes/1"]))) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: stub.RemoveAll(pb.RemoveAllRequest(header=header))) == \
        grpc.StatusCode.PERMISSION_DENIED


def test_a_rogue_node_is_never_mounted_nor_given_puts(cluster: SecurityCluster, stub: Any) -> None:
    """A real `cellar node` process without the cluster secret (so without a node credential)
    asks to mount: refused, so it is never placed on and never serves anyone's bytes."""
    rogue = start_node(cluster.address, segment_size="64MiB", node_id="rogue", wait=False,
                       env={"CELLAR_CLUSTER_SECRET": secrets.token_hex(32)})
    try:
        deadline = time.monotonic() + 30  # until the master has answered its mount
        while "rejected MountSegment" not in rogue.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "rejected MountSegment" in rogue.output() and "node credential" not in rogue.output()
        assert "unknown or revoked token" in rogue.output()
        assert "rogue" not in _segments(cluster, stub)
        with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
            for i in range(10):
                alice.put(f"rogue/{i}", b"secret %d" % i)
        assert "rogue" not in _segments(cluster, stub)
    finally:
        rogue.close()


@pytest.mark.parametrize("rpc", NODE_RPCS)
def test_each_node_rpc_still_serves_its_own_node(cluster: SecurityCluster, stub: Any, rpc: str) -> None:
    """The credential check is not a blanket refusal: a node's own credential passes it (the
    service then answers: OK, or a per-request status for this made-up request)."""
    node_id = "node-1"
    header = pb.RequestHeader(client_id=node_id, token=node_credential(bytes.fromhex(cluster.secret), node_id))
    segment = _segments(cluster, stub)[node_id][0]
    if rpc == "Heartbeat":
        request: Any = pb.HeartbeatRequest(header=header, node_id=node_id, incarnation=0)
    elif rpc == "UnmountSegment":
        request = pb.UnmountSegmentRequest(header=header, node_id=node_id, segment_ids=[1])
    elif rpc == "MountSegment":  # an idempotent re-mount would need the incarnation: use no segments
        request = pb.MountSegmentRequest(header=header, node_id=node_id, incarnation=0)
    else:
        request = pb.ReportObjectsRequest(header=header, node_id=node_id, segment_id=1)
    try:
        getattr(stub, rpc)(request)
    except grpc.RpcError as exc:
        assert exc.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    assert _segments(cluster, stub)[node_id][0].info.segment_id == segment.info.segment_id
