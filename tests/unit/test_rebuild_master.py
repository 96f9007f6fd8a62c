"""Master rebuild from node reports: adoption, merge of replicas, newest version wins, refusals,
allocator and tenant accounting, no placements before `last`, the recovering window."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from test_master_support import EPOCH, Entry, FakeClock, MiB, make_service, mount, put, segment_info

from cellar.errors import Status
from cellar.master.service import PutItem, RequestRejected
from cellar.master.state.allocator import SegmentAllocator
from cellar.master.state.ids import ID_EPOCH_SHIFT
from cellar.proto.grant import key_tag

OLD = (EPOCH - 60_000) << ID_EPOCH_SHIFT  # alloc ids of an earlier master


def get(svc, key: str):
    """GetReplicas of one key, unpinned at once (a pinned object's ranges are not freed)."""
    result = svc.get_replicas("", "reader", [key]).results[0]
    if result.pin_id:
        svc.unpin("", "reader", [result.pin_id])
    return result


def rebuilding_mount(svc, node_id: str, segment_id: int, size: int = 64 * MiB, incarnation: int = 1):
    outcome = svc.mount_segment(node_id, incarnation, [segment_info(segment_id, size)],
                                report_follows=True)
    assert outcome.results == [(Status.OK, "")]
    assert outcome.write_grant_ttl_ms == int(svc.config.write_grant_ttl_s * 1000)


def test_adopts_reported_objects_and_accounts_them() -> None:
    svc = make_service(FakeClock(), rebuild_grace_s=0)
    rebuilding_mount(svc, "n1", 1)
    # nothing is placeable until the report ends (the key may be in it: the whole call waits)
    with pytest.raises(RequestRejected) as refused:
        svc.put_start("", "c", [PutItem("new", MiB)])
    assert refused.value.code == "UNAVAILABLE"
    assert svc.put_start("", "c", [PutItem("new", MiB, upsert=True)]).results[0].status == \
        Status.UNAVAILABLE  # an upsert goes on, to find no segment it could use yet
    entries = [Entry(f"k{i}", OLD + i, i * MiB, 1000 + i) for i in range(10)]
    out = svc.report_objects("n1", 1, 1, entries[:5], last=False)
    assert (out.status, out.accepted, out.refused) == (Status.OK, 5, [])
    assert svc.recovering()  # a segment is still rebuilding: misses are UNAVAILABLE
    with pytest.raises(RequestRejected) as info:
        svc.get_replicas("", "c", ["k0", "k9"])
    assert info.value.code == "UNAVAILABLE"
    assert svc.pins.expired_total == 0 and len(svc.pins) == 0  # no pin leaked by the abort
    out = svc.report_objects("n1", 1, 1, entries[5:], last=True)
    assert out.accepted == 5
    assert not svc.recovering()
    for e in entries:
        got = get(svc, e.key)
        assert got.status == Status.OK and got.size_bytes == e.length and got.checksum == 7
        assert [(r.offset, r.alloc_id) for r in got.replicas] == [(e.offset, e.alloc_id)]
    tenant = svc.tenant("")
    assert tenant.object_count == 10
    assert tenant.used_bytes == sum(SegmentAllocator.rounded_size(e.length) for e in entries)
    assert svc.objects.complete_count == 10
    segment = svc.membership.segments[1]
    assert segment.allocator.used_bytes == tenant.used_bytes
    # new placements avoid the adopted ranges, and new alloc ids are above the adopted ones
    started = svc.put_start("", "c", [PutItem(f"new{i}", MiB) for i in range(20)])
    for r in started.results:
        assert r.status == Status.OK
        rep = r.replicas[0]
        assert rep.alloc_id > OLD + 9
        for e in entries:
            assert rep.offset >= e.offset + e.length or rep.offset + MiB <= e.offset


def test_replicas_merge_and_newest_version_wins() -> None:
    svc = make_service(FakeClock(), rebuild_grace_s=0)
    rebuilding_mount(svc, "n1", 1)
    rebuilding_mount(svc, "n2", 2)
    same = Entry("same", OLD + 1, 0, 5000)
    svc.report_objects("n1", 1, 1, [same], last=True)
    out = svc.report_objects("n2", 1, 2, [Entry("same", OLD + 2, 4096 * 4, 5000)], last=True)
    assert out.accepted == 1
    assert sorted(r.node_id for r in get(svc, "same").replicas) == ["n1", "n2"]
    assert svc.tenant("").used_bytes == 2 * SegmentAllocator.rounded_size(5000)
    # the same replica reported again (a retried batch) is accepted, not duplicated
    assert svc.report_objects("n1", 1, 1, [same], last=True).accepted == 1
    assert len(get(svc, "same").replicas) == 2
    # another value of the key: older loses, newer replaces (and frees the old ranges)
    rebuilding_mount(svc, "n3", 3)  # (reads wait while it reports: no hit from a partial table)
    older = Entry("same", OLD, 0, 5000, checksum=99)
    assert svc.report_objects("n3", 1, 3, [older], last=False).refused == [OLD]
    newer = Entry("same", OLD + 50, 0, 6000, checksum=42)
    out = svc.report_objects("n3", 1, 3, [newer], last=True)
    assert out.accepted == 1
    got = get(svc, "same")
    assert (got.checksum, got.size_bytes, [r.node_id for r in got.replicas]) == (42, 6000, ["n3"])
    freed = [(f[1], f[2]) for f in svc.membership.nodes["n1"].outbox]
    assert (1, OLD + 1) in freed  # n1 is told to drop its stale copy
    assert svc.tenant("").object_count == 1


def test_refusals() -> None:
    svc = make_service(FakeClock(), rebuild_grace_s=0, max_key_bytes=16)
    rebuilding_mount(svc, "n1", 1, size=4 * MiB)
    out = svc.report_objects("n1", 1, 1, [
        Entry("ok", OLD + 1, 0, 1000),
        Entry("overlap", OLD + 2, 512, 1000),            # inside "ok"'s range
        Entry("outside", OLD + 3, 4 * MiB - 10, 100),     # past the segment's end
        Entry("unaligned", OLD + 4, 1 * MiB + 1, 100),
        Entry("x" * 40, OLD + 5, 2 * MiB, 100),           # key too long
        Entry("empty", OLD + 6, 3 * MiB, 0),
        Entry("t", OLD + 7, 3 * MiB, 100, tenant="nobody"),  # unknown tenant
    ], last=True)
    assert out.accepted == 1 and sorted(out.refused) == [OLD + i for i in range(2, 8)]
    # unknown node or segment: mount again
    assert svc.report_objects("n1", 2, 1, [], last=True).status == Status.NOT_FOUND
    assert svc.report_objects("n1", 1, 77, [], last=True).status == Status.NOT_FOUND


def test_restarted_node_does_not_resurrect_what_was_freed_while_it_was_down() -> None:
    clock = FakeClock()
    svc = make_service(clock, rebuild_grace_s=0)
    mount(svc, "n1", 1)
    put(svc, "keep", 1000)
    put(svc, "gone", 1000)
    keep, gone = get(svc, "keep").replicas[0], get(svc, "gone").replicas[0]
    svc.remove("", ["gone"])  # the node never acknowledged this notice: it died
    rebuilding_mount(svc, "n1", 1, incarnation=2)  # restarted: new incarnation
    out = svc.report_objects("n1", 2, 1, [
        Entry("keep", keep.alloc_id, keep.offset, 1000, epoch=EPOCH),
        Entry("gone", gone.alloc_id, gone.offset, 1000, epoch=EPOCH),
    ], last=True)
    assert out.refused == [gone.alloc_id]
    assert get(svc, "keep").status == Status.OK
    assert get(svc, "gone").status == Status.NOT_FOUND


def test_lost_replicas_from_verification_are_dropped() -> None:
    svc = make_service(FakeClock(), rebuild_grace_s=0)
    rebuilding_mount(svc, "n1", 1)
    svc.report_objects("n1", 1, 1, [Entry("a", OLD + 1, 0, 1000), Entry("b", OLD + 2, 4096, 1000)],
                       last=True)

    @dataclass
    class Lost:
        segment_id: int
        alloc_id: int
        offset: int = 0
        length: int = 0

    svc.heartbeat("n1", 1, 0, [Lost(1, OLD + 1)])
    assert get(svc, "a").status == Status.NOT_FOUND
    assert get(svc, "b").status == Status.OK
    assert svc.membership.segments[1].allocator.used_bytes == SegmentAllocator.rounded_size(1000)
    assert svc.nodes.replicas_lost == 1


def test_recovering_window() -> None:
    clock = FakeClock()
    svc = make_service(clock, rebuild_grace_s=5)
    # no node yet: a miss may be an object not reported yet
    assert svc.recovering()
    with pytest.raises(RequestRejected):
        svc.exists("", ["k"])
    # a fresh node (never mounted before, nothing to report) proves a new cluster
    mount(svc, "n1", 1)
    assert not svc.recovering()
    assert svc.exists("", ["k"]) == [Status.NOT_FOUND]
    # a node that was mounted on an earlier master re-opens the window until the grace ends
    svc.mount_segment("n2", 1, [segment_info(2, 64 * MiB)], previous_epoch=EPOCH - 1)
    assert svc.recovering()
    for call in (lambda: svc.get_replicas("", "c", ["k"]), lambda: svc.prefix_len("", ["k"]),
                 lambda: svc.remove("", ["k"]), lambda: svc.remove_all(""),
                 lambda: svc.list_keys("", "", "", 10)):
        with pytest.raises(RequestRejected) as info:
            call()
        assert info.value.code == "UNAVAILABLE"
    clock.advance(5)
    assert not svc.recovering()
    assert get(svc, "k").status == Status.NOT_FOUND


def test_no_hit_is_served_from_a_half_built_table() -> None:
    # n1 still holds an old value (its freed notice died with the old master); n2, reporting
    # later, holds the newer acknowledged one. A read in between must not see the old value.
    svc = make_service(FakeClock(), rebuild_grace_s=5)
    rebuilding_mount(svc, "n1", 1)
    rebuilding_mount(svc, "n2", 2)
    svc.report_objects("n1", 1, 1, [Entry("k", OLD + 1, 0, 5000, checksum=111)], last=True)
    with pytest.raises(RequestRejected) as info:
        svc.get_replicas("", "reader", ["k"])
    assert info.value.code == "UNAVAILABLE"
    assert len(svc.pins) == 0
    svc.report_objects("n2", 1, 2, [Entry("k", OLD + 9, 0, 6000, checksum=222)], last=True)
    svc.clock.advance(5.1)
    result = get(svc, "k")
    assert (result.status, result.checksum, result.size_bytes) == (Status.OK, 222, 6000)


@pytest.mark.parametrize("when", ["during_rebuild", "while_node_away"])
def test_a_removed_key_is_not_revived_by_a_late_report(when: str) -> None:
    svc = make_service(FakeClock(), rebuild_grace_s=0)
    rebuilding_mount(svc, "n1", 1)
    rebuilding_mount(svc, "n2", 2)
    # one value, two replicas: each replica has its own alloc id
    svc.report_objects("n1", 1, 1, [Entry("k", OLD + 1, 0, 5000)], last=True)
    if when == "while_node_away":
        svc.report_objects("n2", 1, 2, [Entry("k", OLD + 2, 0, 5000)], last=True)
        assert len(get(svc, "k").replicas) == 2
        svc.unmount_segment("n2", [2])  # n2 goes away holding its replica
        assert svc.remove("", ["k"]) == [(Status.OK, "")]
        rebuilding_mount(svc, "n2", 2, incarnation=2)  # restarted n2 reports it again
    else:
        assert svc.remove("", ["k"]) == [(Status.OK, "")]
    out = svc.report_objects("n2", 2 if when == "while_node_away" else 1, 2,
                             [Entry("k", OLD + 2, 0, 5000)], last=True)
    assert out.accepted == 0 and out.refused == [OLD + 2]
    assert get(svc, "k").status == Status.NOT_FOUND
    # a value written after the remove is a new value, not a revival
    put(svc, "k", 100)  # asserts PutStart and PutEnd succeed
    assert get(svc, "k").status == Status.OK


def test_puts_of_keys_missing_from_a_table_still_rebuilding_wait_for_it() -> None:
    """A key missing while a node's report is still to come may be a value in that report: a
    put of it now (PutStart, or a put-ahead PutEnd binding it) would make a newer version and
    the report would be refused as older, an acknowledged value replaced by a put that should
    have been ALREADY_EXISTS. Such puts are refused UNAVAILABLE (retried, as GetReplicas is)
    until the table is whole; upserts, which replace anyway, go ahead."""
    from test_master_support import SECRET

    from cellar.master.requests import PutAheadAsk
    from cellar.master.service import PutEndItem
    from tests.support.receipts import receipts_for

    svc = make_service(FakeClock(), rebuild_grace_s=0)
    rebuilding_mount(svc, "n1", 1)
    rebuilding_mount(svc, "n2", 2)
    assert svc.report_objects("n1", 1, 1, [Entry("other", OLD + 1, 0, 1000)], last=True).accepted == 1
    assert svc.recovering()  # n2's report, which holds "k", is still to come
    before = svc.tenant("").writing_bytes
    with pytest.raises(RequestRejected) as info:
        svc.put_start("", "c", [PutItem("k", 1000)])
    assert info.value.code == "UNAVAILABLE" and svc.tenant("").writing_bytes == before
    upsert = svc.put_start("", "c", [PutItem("u", 1000, upsert=True)]).results[0]
    assert upsert.status == Status.OK
    # a put-ahead allocation reserved now cannot bind the missing key either (nothing changes)
    granted = svc.put_ahead("", PutAheadAsk(1, 1000)).ahead[0]
    item = PutEndItem("k", granted.put_id, 7, receipts_for(SECRET, granted, 7, key_tag("default", "k")),
                      bind=PutItem(key="", size_bytes=1000))
    with pytest.raises(RequestRejected):
        svc.put_end("", "c", [item])
    assert granted.put_id in svc.objects.puts
    # the report arrives: "k" is its value, and a put of it is ALREADY_EXISTS as it always was
    assert svc.report_objects("n2", 1, 2, [Entry("k", OLD + 2, 0, 1000, checksum=55)], last=True).accepted == 1
    assert not svc.recovering()
    assert svc.put_start("", "c", [PutItem("k", 1000)]).results[0].status == Status.ALREADY_EXISTS
    assert svc.put_end("", "c", [item])[0][0] == Status.ALREADY_EXISTS
    assert get(svc, "k").checksum == 55


def test_a_rebuilt_table_over_its_watermark_evicts_its_oldest_puts_first() -> None:
    """Reported objects take their last access from their put's place in the id order, behind
    anything read or put since the rebuild. Before, every adopted object looked read at the
    same moment, and evicting a rebuilt table down to its watermark (a node reports ranges the
    old master evicted while their freed notices were unsent) took any of them: a put
    acknowledged just before the restart, in about one run of six
    (tests/integration/test_sdk_put_ahead.py)."""
    svc = make_service(FakeClock(), rebuild_grace_s=0, eviction_high_watermark=0.8,
                       eviction_low_watermark=0.5)
    rebuilding_mount(svc, "n1", 1, size=10 * MiB)
    older_master = (EPOCH - 120_000) << ID_EPOCH_SHIFT
    entries = [Entry(f"k{i}", OLD + i, i * MiB, MiB) for i in range(1, 10)]
    entries.append(Entry("k0", older_master + 50, 0, MiB))  # put under the master before
    order = [8, 2, 9, 6, 0, 4, 1, 7, 5, 3]  # reported in no order of their puts
    out = svc.report_objects("n1", 1, 1, [entries[i] for i in order], last=True)
    assert out.accepted == 10
    assert get(svc, "k2").status == Status.OK  # read since: the most recent of all
    assert svc.evict_to_watermark() == 5
    assert sorted(svc.tenant("").objects) == ["k2", "k6", "k7", "k8", "k9"]
