"""shm only for identities trusted on the host: the mapping exposes the whole segment.

Before: every client was shown every segment's shm file in PutStart, GetReplicas and
ClusterStatus (and on the status page), so any same-user process could map it and read every
tenant's bytes. Now a token without the shm right sees tcp endpoints only and the SDK uses
TCP for it; a token with the right (`cellar token create --shm`, cellar up's default) sees shm."""

from __future__ import annotations

from typing import Any

from identity_kit import SecurityCluster

import cellar
from cellar.proto import cellar_pb2 as pb


def _transports(segments: Any) -> set[str]:
    return {e.transport for s in segments for e in s.endpoints}


def test_shm_endpoints_only_for_tokens_with_the_shm_right(cluster: SecurityCluster, stub: Any) -> None:
    trusted = cluster.token_for("alice", shm=True)
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        alice.put("shm/1", b"x" * 4096)
        assert alice.get("shm/1") == b"x" * 4096  # over TCP: no shm endpoint to choose
    for token, want_shm in ((cluster.alice, False), (trusted, True)):
        header = pb.RequestHeader(tenant="alice", client_id="t", token=token)
        got = stub.GetReplicas(pb.GetReplicasRequest(header=header, keys=["shm/1"]))
        stub.Unpin(pb.UnpinRequest(header=header, pin_ids=[got.results[0].pin_id]))
        started = stub.PutStart(pb.PutStartRequest(header=header, items=[
            pb.PutItem(key=f"shm/new-{want_shm}", size_bytes=10)]))
        stub.PutRevoke(pb.PutRevokeRequest(header=header, items=[
            pb.PutRef(key=f"shm/new-{want_shm}", put_id=started.results[0].put_id)]))
        status = stub.ClusterStatus(pb.ClusterStatusRequest(header=header))
        for segments in (got.segments, started.segments, [s.info for s in status.segments]):
            assert "tcp" in _transports(segments)
            assert ("shm" in _transports(segments)) is want_shm
