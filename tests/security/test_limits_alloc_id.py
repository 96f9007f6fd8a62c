"""Finding: ReportObjects with an alloc id of 2^64-1 made every later PutStart fail with INTERNAL
until the master restarted (the id counter moved past 64 bits; no grant could be packed).

Every value of a reported entry is off the wire and is range-checked before use: an alloc id
outside 1..2^63-1 or a range outside the segment is refused (sent back to the node), nothing of
it is adopted, and later PutStarts are served. Driven through the real MasterService with the
protobuf messages a node sends.
"""

from __future__ import annotations

import random

import pytest

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.requests import MAX_ID
from cellar.master.service import GrantedReplica, MasterService, PutItem
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.frame import OP_WRITE, RequestHeader

SECRET = bytes(range(32))
MiB = 1 << 20
SEGMENT_BYTES = 64 * MiB


def _service() -> MasterService:
    # no rebuild grace: the report below is the whole table, so puts follow it at once
    config = MasterConfig(new_node_ramp_s=0.0, rebuild_grace_s=0.0)
    config.validate()
    svc = MasterService(config, SECRET, rng=random.Random(0))
    info = pb.SegmentInfo(segment_id=7, size_bytes=SEGMENT_BYTES, host_id="h", node_id="n1",
                          endpoints=[pb.Endpoint(transport="tcp", address="127.0.0.1:1")])
    assert svc.mount_segment("n1", 1, [info], report_follows=True).results == [(Status.OK, "")]
    return svc


def _entry(alloc_id: int, offset: int = 0, length: int = 4096, key: str = "k") -> pb.ReportedObject:
    return pb.ReportedObject(tenant="default", key=key, alloc_id=alloc_id, offset=offset,
                             length=length, checksum=1, epoch=1)


def _packs(replica: GrantedReplica) -> None:
    grant = replica.grant()
    RequestHeader(OP_WRITE, 1, grant.segment_id, grant.offset, grant.length, grant=grant).pack()


def _state(svc: MasterService) -> tuple[int, int, int]:
    tenant = svc.tenant("")
    return tenant.used_bytes, tenant.object_count, svc.membership.segments[7].allocator.used_bytes


@pytest.mark.parametrize("entry", [
    _entry((1 << 64) - 1),            # the finding
    _entry(MAX_ID + 1),               # the first id a grant could not carry past a few puts
    _entry(0),                        # no id
    _entry(5, offset=SEGMENT_BYTES - 4096, length=8192),  # runs past the segment
    _entry(5, offset=(1 << 64) - 1),  # offset off the end
    _entry(5, length=(1 << 64) - 1),  # length larger than any segment
    _entry(5, length=0),
])
def test_out_of_range_report_is_refused_and_puts_still_work(entry: pb.ReportedObject) -> None:
    svc = _service()
    before = _state(svc)
    outcome = svc.report_objects("n1", 1, 7, [entry], last=True)
    assert outcome.status == Status.OK
    assert outcome.accepted == 0 and outcome.refused == [entry.alloc_id]
    assert _state(svc) == before  # nothing adopted, nothing reserved
    results = svc.put_start("", "w", [PutItem(f"after{i}", 4096) for i in range(3)]).results
    assert [r.status for r in results] == [Status.OK] * 3, [r.message for r in results]
    for r in results:
        assert 0 < r.replicas[0].alloc_id <= MAX_ID + (1 << 20)
        _packs(r.replicas[0])  # the grant fits its 64-bit wire fields


def test_a_valid_entry_beside_a_hostile_one_is_adopted() -> None:
    svc = _service()
    good = _entry(12345, offset=8192, key="good")
    outcome = svc.report_objects("n1", 1, 7, [_entry((1 << 64) - 1, key="bad"), good], last=True)
    assert outcome.accepted == 1 and outcome.refused == [(1 << 64) - 1]
    assert "good" in svc.tenant("").objects and "bad" not in svc.tenant("").objects
    assert svc.put_start("", "w", [PutItem("new", 4096)]).results[0].status == Status.OK


def test_the_highest_valid_id_keeps_later_ids_in_range() -> None:
    svc = _service()
    outcome = svc.report_objects("n1", 1, 7, [_entry(MAX_ID - 10)], last=True)
    assert outcome.accepted == 1
    result = svc.put_start("", "w", [PutItem("next", 4096)]).results[0]
    assert result.status == Status.OK
    assert MAX_ID - 10 < result.replicas[0].alloc_id < 1 << 64
    _packs(result.replicas[0])


def test_heartbeat_lost_ranges_with_hostile_ids_change_nothing() -> None:
    svc = _service()
    svc.report_objects("n1", 1, 7, [], last=True)
    result = svc.put_start("", "w", [PutItem("k", 4096)]).results[0]
    lost = [pb.FreedRange(segment_id=7, alloc_id=(1 << 64) - 1),
            pb.FreedRange(segment_id=(1 << 64) - 1, alloc_id=result.replicas[0].alloc_id)]
    before = _state(svc)
    svc.heartbeat("n1", 1, 0, lost)
    assert _state(svc) == before and svc.replicas_lost == 0
