"""Which endpoints a client not trusted on the node's host is shown (master/state/records.py):
tcp only. A shm endpoint names the segment's file, an rdma endpoint carries the segment's
remote key and address; either reaches every tenant's bytes without the node's per-op checks.
(Before 2026-12-06 rdma endpoints went to every tenant and to the public status page.)"""

from __future__ import annotations

from test_master_support import FakeClock, make_service

from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb


def test_untrusted_clients_see_neither_shm_nor_rdma_endpoints() -> None:
    svc = make_service(FakeClock())
    info = pb.SegmentInfo(segment_id=1, size_bytes=64 << 20, host_id="h", endpoints=[
        pb.Endpoint(transport="tcp", address="127.0.0.1:7001"),
        pb.Endpoint(transport="shm", address="/dev/shm/cellar-seg-1"),
        pb.Endpoint(transport="rdma", address="rdma://10.0.0.1:7002/0a0b0c0d"),
    ])
    assert svc.mount_segment("n1", 1, [info]).results == [(Status.OK, "")]
    segment = svc.membership.segments[1]
    assert [e.transport for e in segment.info.endpoints] == ["tcp", "shm", "rdma"]
    assert [e.transport for e in segment.untrusted_info().endpoints] == ["tcp"]
    assert [e.transport for e in segment.info.endpoints] == ["tcp", "shm", "rdma"]  # untouched
