"""ControlLoop's side of the rebuild protocol, against an in-process fake master: a new master
epoch gets the SEALED entries reported (every segment ends with `last`, WRITING entries are
dropped, refused entries leave the index); the same master forgetting the node gets a clean
index and no report; the mount reply's time becomes the write floor."""

from __future__ import annotations

from typing import Any

import pytest
from test_node_master_link import FakeMaster, run, until

from cellar.proto import cellar_pb2 as pb
from cellar.storage_node.clock import wall_ms
from cellar.storage_node.index import ObjectIndex, WriteRefused
from cellar.storage_node.master_link import ControlLoop

pytestmark = pytest.mark.timeout(60)


def seal(index: ObjectIndex, alloc: int, offset: int, *, complete: bool = True) -> None:
    index.admit_write(alloc_id=alloc, segment_id=11, object_offset=offset, object_size=10,
                      tenant="default", key=f"k{alloc}", checksum=alloc, epoch=3,
                      grant_expiry_ms=wall_ms() + 60_000)
    index.record_written(alloc, 0, 10 if complete else 5)


REPORTS: list[pb.ReportObjectsRequest] = []


async def _report_objects(self: FakeMaster, request: Any, context: Any) -> pb.ReportObjectsReply:
    REPORTS.append(request)
    refused = [e.alloc_id for e in request.entries if e.alloc_id == 2]
    return pb.ReportObjectsReply(header=self.header(), status=pb.OK, refused_alloc_ids=refused)


@pytest.fixture(autouse=True)
def reporting_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """FakeMaster with ReportObjects (handlers are bound when the server starts)."""
    REPORTS.clear()
    monkeypatch.setattr(FakeMaster, "ReportObjects", _report_objects, raising=False)


def test_new_master_epoch_gets_the_index_reported() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, server: Any, port: int) -> None:
        assert fake.mounts[0].report_follows is False and fake.mounts[0].previous_epoch == 0
        reports = REPORTS
        seal(loop.index, 1, 0)
        seal(loop.index, 2, 100)
        seal(loop.index, 3, 200, complete=False)  # WRITING: not reported, dropped
        fake.epoch = 4
        await until(lambda: len(fake.mounts) == 2 and loop.mounted)
        mount = fake.mounts[1]
        assert mount.report_follows is True and mount.previous_epoch == 3
        assert sorted((r.segment_id, r.last) for r in reports) == [(11, True), (12, True)]
        sent = [e for r in reports for e in r.entries]
        assert sorted((e.alloc_id, e.key, e.checksum, e.tenant) for e in sent) == [
            (1, "k1", 1, "default"), (2, "k2", 2, "default")]
        assert loop.index.get(1) is not None
        assert loop.index.get(2) is None  # refused by the master
        assert loop.index.get(3) is None and loop.index.is_tombstoned(3)
        assert loop.reported == 2 and loop.report_refused == 1

    run(body)


def test_same_master_forgetting_the_node_clears_instead_of_reporting() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        reports = REPORTS
        seal(loop.index, 1, 0)
        fake.known = False  # expired by the same master (same epoch)
        await until(lambda: len(fake.mounts) == 2 and loop.mounted)
        assert fake.mounts[1].report_follows is False
        assert reports == [] and len(loop.index) == 0

    run(body)


def test_mount_time_is_the_write_floor() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        # the fake master's clock runs 5 s ahead; its mount reply said write_grant_ttl_ms=0, so
        # a grant is "issued" at its expiry: one expiring before the mount time is refused
        with pytest.raises(WriteRefused, match="before this node's current mount"):
            loop.index.admit_write(alloc_id=9, segment_id=11, object_offset=0, object_size=10,
                                   tenant="default", key="k", checksum=0, epoch=3,
                                   grant_expiry_ms=wall_ms())
        loop.index.admit_write(alloc_id=10, segment_id=11, object_offset=0, object_size=10,
                               tenant="default", key="k", checksum=0, epoch=3,
                               grant_expiry_ms=wall_ms() + 60_000)

    run(body)


def test_report_batches_are_bounded_and_every_segment_ends_with_last() -> None:
    """The rebuild report (storage_node/mount_report.py): at most REPORT_BATCH_ENTRIES per
    batch, every mounted segment reported (an empty one too), one `last` per segment."""
    from types import SimpleNamespace

    from cellar.storage_node import mount_report

    entries = [SimpleNamespace(segment_id=1, tenant="t", key=f"k{i}", alloc_id=i, offset=i,
                               length=1, checksum=0, epoch=1, engine_hash=b"", value_id=0,
                               soft_pin_until_ms=0)
               for i in range(mount_report.REPORT_BATCH_ENTRIES + 5)]
    batches = list(mount_report.report_batches(entries, [1, 2]))
    assert [(s, len(b), last) for s, b, last in batches] == [
        (1, mount_report.REPORT_BATCH_ENTRIES, False), (1, 5, True), (2, 0, True)]
    assert [e.alloc_id for _, b, _ in batches for e in b] == list(range(len(entries)))
