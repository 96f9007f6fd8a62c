"""The disk tier's policy (master/state/tiers.py), on a master with a fake clock and no node.

One node: 16 MiB of DRAM (segment 1) and a disk segment (2). The node's side of a move is
played by `_report` (MoveDone for every move the master asks for). Each test names what a
wrong policy would do differently: demote below the watermark, demote a pinned or recent
object, wait on a reader before switching, free an old range under a reader's grant, evict a
recent disk object first, promote on one read or on reads further apart than the window.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_master_support import (
    EPOCH,
    SECRET,
    Entry,
    FakeClock,
    MiB,
    get,
    make_service,
    put,
    put_start,
    segment_info,
)

from cellar.errors import Status
from cellar.master.requests import RequestRejected
from cellar.master.service import PutEndItem, PutItem
from cellar.master.serving.servicer import tier_move
from cellar.master.state.records import TIER_DISK, TIER_DRAM
from cellar.proto import cellar_pb2 as pb
from cellar.proto import tiers
from cellar.proto.grant import key_tag
from tests.support.receipts import receipts_for

DRAM = 16 * MiB


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _disk(segment_id: int = 2, size: int = 64 * MiB) -> pb.SegmentInfo:
    """A node's disk-tier segment, as it mounts it."""
    info = segment_info(segment_id, size)
    info.tier = TIER_DISK
    return info


def _service(clock: FakeClock, disk: int = 64 * MiB, **settings: Any):  # type: ignore[no-untyped-def]
    svc = make_service(clock, node_suspect_after_s=1000, node_expire_after_s=2000, **settings)
    outcome = svc.mount_segment("n1", 1, [segment_info(1, DRAM), _disk(size=disk)])
    assert outcome.results == [(Status.OK, "")] * 2, outcome.results
    return svc


def _fill(svc, clock: FakeClock, count: int, prefix: str = "k") -> list[str]:  # type: ignore[no-untyped-def]
    keys = []
    for i in range(count):
        key = f"{prefix}{i:03d}"
        put(svc, key, MiB)
        clock.advance(1)  # distinct last-access times, oldest first
        keys.append(key)
    return keys


def _obj(svc, key: str):  # type: ignore[no-untyped-def]
    return svc.tenant("").objects[key]


def _tier(svc, key: str) -> int:  # type: ignore[no-untyped-def]
    (replica,) = _obj(svc, key).replicas
    return int(replica.segment.tier)


def _segment(svc, segment_id: int):  # type: ignore[no-untyped-def]
    return svc.membership.nodes["n1"].segments[segment_id]


def _moving_keys(svc) -> set[str]:  # type: ignore[no-untyped-def]
    return {move.obj.key for move in svc.tiers.moves_for("n1")}


def _check_outgoing(svc) -> None:  # type: ignore[no-untyped-def]
    """The bytes the tiers keep as leaving each segment are those of its moves in flight."""
    for segment in svc.membership.nodes["n1"].segments.values():
        want = sum(m.obj.reserved for m in svc.tiers.moving.values() if m.src.segment is segment)
        assert svc.tiers.outgoing_bytes(segment) == want, (segment.segment_id, want)


def _report(svc, clock: FakeClock, ok: bool = True) -> int:  # type: ignore[no-untyped-def]
    _check_outgoing(svc)
    moves = svc.tiers.moves_for("n1")
    svc.tiers.moved("n1", [pb.MoveDone(dst_segment_id=m.dst.segment.segment_id,
                                       dst_alloc_id=m.dst.alloc_id, ok=ok) for m in moves],
                    clock.monotonic())
    _check_outgoing(svc)
    return len(moves)


def _read(svc, key: str, client: str = "reader") -> int:  # type: ignore[no-untyped-def]
    """GetReplicas then Unpin (a read that ends); returns the tier it was served from."""
    got = get(svc, key, client=client)
    assert got.status == Status.OK
    tier = _tier(svc, key)
    svc.unpin("", client, [got.pin_id])
    return tier


def test_the_master_tiers_are_the_wire_tiers() -> None:
    assert (TIER_DRAM, TIER_DISK) == (tiers.TIER_DRAM, tiers.TIER_DISK)


def test_nothing_moves_below_the_high_watermark(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock)
    _fill(svc, clock, 12)  # 12/16 = 0.75 < 0.80
    svc.tick()
    assert _moving_keys(svc) == set()
    assert svc.tiers.counters()["moves_pending"] == 0


def test_above_the_high_watermark_the_oldest_move_down_to_the_low(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock)
    keys = _fill(svc, clock, 14)  # 14/16 = 0.875 > 0.80; the low mark 0.65 is 10.4 MiB
    _read(svc, keys[0])  # the oldest put, read since: now the most recent
    clock.advance(1)
    svc.tick()
    # 14 - 10.4 = 3.6 MiB: four objects, the least recently accessed, not the one just read
    assert _moving_keys(svc) == set(keys[1:5])
    svc.tick()  # the outgoing bytes count: the next tick asks for nothing more
    assert len(svc.tiers.moves_for("n1")) == 4
    assert _report(svc, clock) == 4
    assert [_tier(svc, k) for k in keys[1:5]] == [TIER_DISK] * 4
    assert _tier(svc, keys[0]) == TIER_DRAM
    assert _segment(svc, 1).allocator.used_bytes == 10 * MiB  # the DRAM ranges were freed
    assert svc.tiers.counters()["demotions"] == 4


def test_demotion_takes_a_scan_before_objects_read_twice_lru2(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock)
    keys = _fill(svc, clock, 14)
    for _ in range(2):  # the hot four: read twice, early
        for key in keys[:4]:
            _read(svc, key)
        clock.advance(1)
    for key in keys[4:]:  # a scan: every other key read once, later than the hot reads
        _read(svc, key)
        clock.advance(1)
    svc.tick()
    # by last access the hot four would go (their reads are the oldest); LRU-2 takes the scan's
    # oldest (their access before the scan's read is their put)
    assert _moving_keys(svc) == set(keys[4:8])


def test_soft_hard_and_read_pinned_objects_stay_in_dram(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock, pin_ttl_s=100.0)
    put(svc, "soft", MiB, soft_pin=True)
    put(svc, "hard", MiB, hard_pin=True)
    clock.advance(1)
    put(svc, "read-pinned", MiB)
    held = get(svc, "read-pinned", client="r")  # a pin never released in this test
    clock.advance(1)
    _fill(svc, clock, 13)  # 16/16: far above the watermark
    svc.tick()
    moving = _moving_keys(svc)
    assert moving and not moving & {"soft", "hard", "read-pinned"}
    assert held.status == Status.OK


def test_the_switch_happens_at_once_under_a_reader_and_the_old_range_waits(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock)
    keys = _fill(svc, clock, 14)
    svc.tick()
    victim = keys[0]
    assert victim in _moving_keys(svc)
    held = get(svc, victim, client="slow")  # a reader holds the DRAM replica's grant
    (old,) = _obj(svc, victim).replicas
    used = _segment(svc, 1).allocator.used_bytes
    _report(svc, clock)
    assert _tier(svc, victim) == TIER_DISK, "the switch waited for the reader"
    # the old range is still allocated and the node not told: the held grant reads valid bytes
    assert _segment(svc, 1).allocator.used_bytes == used - 3 * MiB  # the three unpinned ones
    node = svc.membership.nodes["n1"]
    assert old.alloc_id not in {f[2] for f in svc.membership.take_freed(node, 0, 1000)}
    clock.advance(1)
    svc.tick()
    assert _segment(svc, 1).allocator.used_bytes == used - 3 * MiB
    svc.unpin("", "slow", [held.pin_id])  # the reader is done: the next tick frees it
    svc.tick()
    assert _segment(svc, 1).allocator.used_bytes <= used - 4 * MiB
    assert old.alloc_id in {f[2] for f in svc.membership.take_freed(node, 0, 1000)}
    assert not svc.tiers.retired


def test_a_retired_range_is_freed_after_the_grant_ttl_even_if_pins_continue(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock, pin_ttl_s=10.0, grant_skew_s=1.0)
    keys = _fill(svc, clock, 14)
    svc.tick()
    get(svc, keys[0], client="slow")
    _report(svc, clock)
    assert len(svc.tiers.retired) == 1
    for _ in range(12):  # a key read continuously: a new pin each second, always one held
        clock.advance(1)
        get(svc, keys[0], client="busy")
        svc.tiers.tick(clock.monotonic())
    assert _obj(svc, keys[0]).pins > 0
    assert not svc.tiers.retired, "a retired range outlived every grant that could name it"


def test_a_failed_move_changes_nothing_and_frees_its_target(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock)
    keys = _fill(svc, clock, 14)
    svc.tick()
    assert _report(svc, clock, ok=False) == 4
    assert [_tier(svc, k) for k in keys] == [TIER_DRAM] * 14
    assert _segment(svc, 2).allocator.used_bytes == 0
    assert svc.tiers.counters()["moves_failed"] == 4


def test_the_bytes_leaving_dram_follow_moves_that_start_switch_fail_and_time_out(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock)
    _fill(svc, clock, 14)
    svc.tick()
    dram = _segment(svc, 1)
    assert svc.tiers.outgoing_bytes(dram) == 4 * MiB  # four moves out of DRAM in flight
    first, *rest = svc.tiers.moves_for("n1")
    svc.tiers.moved("n1", [pb.MoveDone(dst_segment_id=first.dst.segment.segment_id,
                                       dst_alloc_id=first.dst.alloc_id, ok=True)],
                    clock.monotonic())
    assert svc.tiers.outgoing_bytes(dram) == 3 * MiB
    svc.tiers.moved("n1", [pb.MoveDone(dst_segment_id=rest[0].dst.segment.segment_id,
                                       dst_alloc_id=rest[0].dst.alloc_id, ok=False)],
                    clock.monotonic())
    assert svc.tiers.outgoing_bytes(dram) == 2 * MiB
    clock.advance(svc.tiers.settings.move_timeout_s + 1)
    svc.tick()  # the last two time out; DRAM is still above its mark: new moves start
    assert svc.tiers.counters()["moves_timed_out"] == 2
    _check_outgoing(svc)
    assert _report(svc, clock) >= 0
    assert svc.tiers.outgoing_bytes(dram) == 0


def test_disk_evicts_its_least_recently_accessed_first_skipping_pins(clock) -> None:  # type: ignore[no-untyped-def]
    # 16 MiB disk: above 0.95 (15.2 MiB) it evicts down to 0.90 (14.4 MiB): two objects
    svc = _service(clock, disk=16 * MiB, demote_high_watermark=0.5, demote_low_watermark=0.01)
    keys = _fill(svc, clock, 16)  # DRAM full; every one goes down
    svc.tick()
    assert _report(svc, clock) == 16
    assert _segment(svc, 2).allocator.used_bytes == 16 * MiB
    _read(svc, keys[1])  # recent again
    held = get(svc, keys[2], client="r")  # pinned: skipped
    clock.advance(1)
    svc.tick()
    tenant_objects = svc.tenant("").objects
    gone = [k for k in keys if k not in tenant_objects]
    assert gone == [keys[0], keys[3]], gone
    assert svc.tiers.counters()["disk_evictions"] == 2
    assert held.status == Status.OK


def test_promotion_needs_a_second_read_within_the_window(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock, promote_window_s=5.0)
    keys = _fill(svc, clock, 14)
    svc.tick()
    _report(svc, clock)
    cold, warm = keys[0], keys[1]
    assert _read(svc, cold) == TIER_DISK  # a one-pass scan reads once: nothing moves
    assert _moving_keys(svc) == set()
    clock.advance(6)
    assert _read(svc, cold) == TIER_DISK  # again, but outside the window
    assert _moving_keys(svc) == set()
    _read(svc, warm)
    clock.advance(4)
    _read(svc, warm)  # the second read within 5 s
    assert _moving_keys(svc) == {warm}
    _report(svc, clock)
    assert _tier(svc, warm) == TIER_DRAM
    assert _tier(svc, cold) == TIER_DISK
    counters = svc.tiers.counters()
    assert (counters["promotions"], counters["disk_hits"]) == (1, 4)


def test_a_put_with_no_dram_room_spills_to_disk(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock)
    keys = _fill(svc, clock, 17)  # no tick in between: the 17th finds DRAM full
    assert _tier(svc, keys[-1]) == TIER_DISK
    assert [_tier(svc, k) for k in keys[:16]] == [TIER_DRAM] * 16
    assert svc.tiers.counters()["spills"] == 1


def test_a_two_replica_put_spills_the_replicas_dram_cannot_take_and_evicts_nothing(clock) -> None:  # type: ignore[no-untyped-def]
    """Two nodes, each 16 MiB of DRAM and a disk: with n1's DRAM full, a 2-replica put keeps
    one replica in n2's DRAM and spills the other to n1's disk (a node of its own); with both
    full, both replicas spill, one to each disk. Nothing is evicted: before, only a 1-replica
    put spilled and a 2-replica one evicted DRAM objects, although both disks had room."""
    svc = _service(clock)
    assert svc.mount_segment("n2", 3, [segment_info(3, DRAM), _disk(4)]).results == \
        [(Status.OK, "")] * 2
    for i in range(16):  # n1's DRAM, full
        put(svc, f"n1/{i}", MiB, avoid_node_ids=["n2"])
    mixed = put_start(svc, "mixed", MiB, replicas=2)
    assert mixed.status == Status.OK
    assert {(r.node_id, int(r.segment_id)) for r in mixed.replicas} == {("n2", 3), ("n1", 2)}
    for i in range(15):  # the rest of n2's DRAM
        put(svc, f"n2/{i}", MiB, avoid_node_ids=["n1"])
    both = put_start(svc, "both", MiB, replicas=2)
    assert both.status == Status.OK
    assert {(r.node_id, int(r.segment_id)) for r in both.replicas} == {("n1", 2), ("n2", 4)}
    assert len(svc.tenant("").objects) == 31  # every sealed object kept: nothing evicted
    assert svc.tiers.counters()["spills"] == 3


def test_the_coldest_value_is_not_moved_while_its_upsert_is_written(clock) -> None:  # type: ignore[no-untyped-def]
    """A move gives the old value an alloc id above the upsert in flight; a master killed
    before the upsert's PutEnd left nobody to kill that range, and the next rebuild (newest id
    wins) could serve the old value over the upsert (records.py `being_replaced`). v1 is the
    coldest, yet the demotion takes the next ones; once v2 is written it may move."""
    svc = _service(clock)
    put(svc, "k", MiB, checksum=1)
    clock.advance(1)
    v2 = put_start(svc, "k", MiB, upsert=True)
    assert v2.status == Status.OK
    _fill(svc, clock, 14, prefix="f")  # DRAM past its high watermark: v1 is the coldest
    svc.tiers.tick(clock.monotonic())
    moving = _moving_keys(svc)
    assert moving and "k" not in moving and "f000" in moving
    assert svc.put_end("", "writer", [PutEndItem("k", v2.put_id, 2, receipts_for(SECRET, v2, 2))]) \
        == [(Status.OK, "")]
    assert _tier(svc, "k") == TIER_DRAM


def _ahead_after(svc, clock: FakeClock):  # type: ignore[no-untyped-def]
    """v1 of "k", then a put-ahead allocation (granted before any key is known), then DRAM past
    its watermark so that v1, the coldest, starts moving to disk under an id above the
    allocation's: the one way left for an old value's range to outrank a write of its key."""
    put(svc, "k", MiB, checksum=1)
    clock.advance(1)
    (ahead,) = svc.put_ahead("", pb.PutAheadAsk(count=1, size_bytes=MiB)).ahead
    assert ahead.status == Status.OK
    _fill(svc, clock, 14, prefix="f")
    svc.tiers.tick(clock.monotonic())
    assert "k" in _moving_keys(svc)
    return ahead


def _bind_v2(ahead):  # type: ignore[no-untyped-def]
    """The PutEnd binding the put-ahead allocation to "k" as an upsert of v2 (checksum 2)."""
    tag = key_tag("default", "k")  # the node stores the write's key; "" is the default tenant
    return [PutEndItem("k", ahead.put_id, 2, receipts_for(SECRET, ahead, 2, tag),
                       bind=PutItem(key="", size_bytes=MiB, upsert=True))]


def _restarted(clock: FakeClock):  # type: ignore[no-untyped-def]
    """A master of a later epoch, with no rebuild grace of its own."""
    return make_service(clock, epoch=EPOCH + 60_000, rebuild_grace_s=0,
                        node_suspect_after_s=1000, node_expire_after_s=2000)


def _new_master(svc, written, disk_mounts: bool = True):  # type: ignore[no-untyped-def]
    """The next master: it loads what `svc` queued for its removal log, then n1 mounts and
    reports v2's range (DRAM, segment 1, whole); its disk (segment 2) is still reporting, or
    with `disk_mounts` False not mounted yet (a node back only after the table was whole)."""
    new = _restarted(FakeClock())
    new.load_removals(svc.tombstones.take_pending())
    segments = [segment_info(1, DRAM), _disk()] if disk_mounts else [segment_info(1, DRAM)]
    new.mount_segment("n1", 2, segments, report_follows=True)
    new.report_objects("n1", 2, int(written.segment_id),
                       [Entry("k", int(written.alloc_id), int(written.offset), MiB, 2)], last=True)
    return new


def test_an_upsert_outlives_a_restart_though_the_old_value_moved_after_it_was_placed(clock) -> None:  # type: ignore[no-untyped-def]
    """A rebuilt master orders a key's versions by alloc id; a move gives the old value a
    new one. v1 demoted after v2's put-ahead allocation was granted lands under an id above
    v2's, which the upsert's bound (v2's first id - 1) does not cover: the upsert must kill
    that range by its id too, or a master killed before the node drops it brings v1 back over
    the acknowledged v2 (`make soak-disk`: a stale read, v117 served after the upsert of v118).
    The report carries no value version (a node journaled before value ids): the dead write
    alone refuses the copy."""
    svc = _service(clock)
    ahead = _ahead_after(svc, clock)
    target = svc.tiers.moving[_obj(svc, "k")].dst
    assert target.alloc_id > ahead.replicas[0].alloc_id
    assert svc.put_end("", "writer", _bind_v2(ahead)) == [(Status.OK, "")]  # mid-move
    _report(svc, clock)  # the node finished its copy: v1's bytes under the target, on disk
    new = _new_master(svc, ahead.replicas[0])
    out = new.report_objects("n1", 2, 2, [Entry("k", target.alloc_id, target.offset, MiB, 1)],
                             last=True)
    assert out.refused == [target.alloc_id]
    assert new.tenant("").objects["k"].checksum == 2


def test_a_put_ended_across_a_restart_is_answered_from_the_whole_table_only(clock) -> None:  # type: ignore[no-untyped-def]
    """v1 demoted after v2's put-ahead allocation was granted, and the master killed before
    v2's PutEnd: the new master holds no put for the client's retried PutEnd. Answered while
    the disk (v1's moved copy, the higher id) had not reported, it acknowledged v2 from the
    DRAM report, and the disk's report then replaced v2 with v1 (`make soak-disk`: v5
    acknowledged 78 ms after a restart, v3 read 6 s later). It must wait (UNAVAILABLE,
    changing nothing) until the table is whole and then answer what the table holds: v1 won
    by its id, so v2 is not acknowledged. (The disk reports v1's copy without its value's
    version, as a node journaled before value ids does; with it, v2 wins the rebuild in either
    report order: test_a_moved_copy_keeps_its_values_version_through_two_restarts.)"""
    svc = _service(clock)
    ahead = _ahead_after(svc, clock)
    _report(svc, clock)
    (moved,) = _obj(svc, "k").replicas
    assert moved.segment.tier == TIER_DISK and moved.alloc_id > ahead.replicas[0].alloc_id
    # the master dies here: v2's PutEnd never reached it
    new = _new_master(svc, ahead.replicas[0])
    assert new.tenant("").objects["k"].checksum == 2  # v2 holds the key, for now
    retry = _bind_v2(ahead) + [PutEndItem("nothing", 12345, 3, [])]
    with pytest.raises(RequestRejected) as refused:
        new.put_end("", "writer", retry)
    assert refused.value.code == "UNAVAILABLE"
    assert new.tenant("").objects["k"].checksum == 2  # the refused request changed nothing
    out = new.report_objects("n1", 2, 2, [Entry("k", moved.alloc_id, moved.offset, MiB, 1)],
                             last=True)
    assert out.refused == [] and new.tenant("").objects["k"].checksum == 1
    assert not new.recovering()
    (answer, _) = new.put_end("", "writer", retry)
    assert answer[0] != Status.OK, answer  # what is stored is v1: v2 was never acknowledged
    assert new.tenant("").objects["k"].checksum == 1


def test_a_put_acknowledged_across_a_restart_outranks_a_moved_copy_reported_later(clock) -> None:  # type: ignore[no-untyped-def]
    """The same, but the disk that holds v1's moved copy comes back only after the table was
    whole without it (a node away past the rebuild grace): the retried PutEnd was
    acknowledged from v2's report, so the late report of v1, though its id is higher, must
    not replace v2; it is refused, and the node frees it."""
    svc = _service(clock)
    ahead = _ahead_after(svc, clock)
    _report(svc, clock)
    (moved,) = _obj(svc, "k").replicas
    new = _new_master(svc, ahead.replicas[0], disk_mounts=False)
    assert not new.recovering()
    assert new.put_end("", "writer", _bind_v2(ahead)) == [(Status.OK, "")]
    new.mount_segment("n1", 2, [_disk()], report_follows=True)
    out = new.report_objects("n1", 2, 2, [Entry("k", moved.alloc_id, moved.offset, MiB, 1)],
                             last=True)
    assert out.refused == [moved.alloc_id]
    assert new.tenant("").objects["k"].checksum == 2
    new.check_invariants()


def test_a_moved_copy_keeps_its_values_version_through_two_restarts(clock) -> None:  # type: ignore[no-untyped-def]
    """The same, and the master that acknowledged v2 dies before the disk comes back: the
    next one hears v2 and v1's moved copy, whose own id is above v2's. The node reports the
    copy with its value's version (v1's put: storage_node/journal.py kind 4), so v2, the later
    put, holds the key in either report order. Before, the rebuild ordered values by the
    copy's own id and served v1 over the acknowledged v2."""
    svc = _service(clock)
    ahead = _ahead_after(svc, clock)
    (v1,) = _obj(svc, "k").replicas
    _report(svc, clock)
    (moved,) = _obj(svc, "k").replicas
    written = ahead.replicas[0]
    assert moved.segment.tier == TIER_DISK and moved.alloc_id > written.alloc_id > v1.alloc_id
    second = _new_master(svc, written, disk_mounts=False)
    assert second.put_end("", "writer", _bind_v2(ahead)) == [(Status.OK, "")]
    removals = second.tombstones.take_pending()  # the second master dies here
    copy = (2, Entry("k", moved.alloc_id, moved.offset, MiB, 1, value_alloc_id=v1.alloc_id))
    v2 = (int(written.segment_id), Entry("k", int(written.alloc_id), int(written.offset), MiB, 2))
    for reports in ((copy, v2), (v2, copy)):
        third = _restarted(FakeClock())
        third.load_removals(removals)
        third.mount_segment("n1", 3, [segment_info(1, DRAM), _disk()], report_follows=True)
        for segment_id, entry in reports:
            third.report_objects("n1", 3, segment_id, [entry], last=True)
        assert third.tenant("").objects["k"].checksum == 2, reports
        assert third.tenant("").objects["k"].version == written.alloc_id
        third.check_invariants()


def test_a_new_master_evicts_nothing_while_its_disks_still_report(clock) -> None:  # type: ignore[no-untyped-def]
    """After a restart a node's DRAM may be mounted (reported) before its disk: a put that
    finds DRAM full is refused as UNAVAILABLE (the client retries) rather than evicting what
    DRAM holds, and a put-ahead ask gets nothing; once the disk has reported, puts spill to
    it. Before, the put evicted 64 DRAM objects (`make soak-disk`, right after a master kill,
    at 17% use: 17 acknowledged objects lost)."""
    new = _restarted(clock)
    new.mount_segment("n1", 2, [segment_info(1, DRAM), _disk()], report_follows=True)
    new.report_objects("n1", 2, 1, [Entry(f"k{i}", 1000 + i, i * MiB, MiB) for i in range(16)],
                       last=True)  # DRAM full and mounted; the disk is still reporting
    assert new.membership.disks_rebuilding == 1
    with pytest.raises(RequestRejected) as refused:  # the key may be in a report to come
        put_start(new, "late", MiB)
    assert refused.value.code == "UNAVAILABLE"
    upsert = new.put_start("", "c", [PutItem("late", MiB, upsert=True)]).results[0]
    assert upsert.status == Status.UNAVAILABLE, upsert  # no room it may take yet
    assert new.put_ahead("", pb.PutAheadAsk(count=8, size_bytes=MiB, replicas=1)).ahead == []
    assert len(new.tenant("").objects) == 16  # nothing evicted
    new.report_objects("n1", 2, 2, [], last=True)
    assert put_start(new, "late", MiB).status == Status.OK
    assert _tier(new, "k0") == TIER_DRAM and new.tiers.counters()["spills"] == 1


def test_each_read_and_write_is_counted_once_in_the_tier_it_touched(clock) -> None:  # type: ignore[no-untyped-def]
    """Hits and read bytes in the tier a GetReplicas is served from, write bytes in the tier a
    put's replica or a move's copy lands in: the counters ClusterStatus and /metrics report."""
    svc = _service(clock)
    keys = _fill(svc, clock, 17)  # 16 MiB into DRAM, the 17th spills to disk
    svc.tick()  # above the high watermark: the oldest move down to the low (10.4 MiB)
    demoted = _report(svc, clock)
    assert demoted == svc.tiers.moves()["demotions"] > 0
    on_disk = [k for k in keys if _tier(svc, k) == TIER_DISK]
    in_dram = [k for k in keys if _tier(svc, k) == TIER_DRAM]
    assert len(on_disk) == demoted + 1
    for key in (in_dram[0], in_dram[1], in_dram[0], on_disk[0]):
        _read(svc, key)
    assert get(svc, "no-such-key").status == Status.NOT_FOUND  # a miss counts nowhere
    assert svc.tiers.stats() == [(TIER_DRAM, 3, 3 * MiB, 16 * MiB),
                                 (TIER_DISK, 1, MiB, (1 + demoted) * MiB)]
    assert svc.tiers.moves() == {"demotions": demoted, "promotions": 0, "disk_evictions": 0,
                                 "spills": 1}


def test_without_a_disk_tier_dram_traffic_reaches_every_status_face() -> None:
    """No disk tier: GetReplicas counts DRAM hits in locals and adds them to the tier counters
    once per call. ClusterStatus (as the SDK's status() reads it), /api/v1/status and /metrics
    all show the same numbers, the ones computed here from the reads made."""
    from test_master_support import SECRET, mount

    from cellar.client.session_state import status_to_dict
    from cellar.master.config import MasterConfig
    from cellar.master.serving.auth import Authorizer
    from cellar.master.serving.http_api import status_json
    from cellar.master.serving.leadership import Leadership
    from cellar.master.serving.metrics import MasterCollector
    from cellar.master.serving.servicer import MasterServicer
    from cellar.tokens import TokenStore

    leadership = Leadership(MasterConfig(new_node_ramp_s=0.0), SECRET, ha=False)
    svc = leadership.service
    mount(svc, "n1", 1)
    sizes = {"a": MiB, "b": 3 * MiB, "c": 4096}
    for key, size in sizes.items():
        put(svc, key, size)
    reads = ["a", "a", "b", "c", "a"]
    for key in reads[:2]:
        assert get(svc, key).status == Status.OK
    outcome = svc.get_replicas("", "reader", [*reads[2:], "missing"])  # one call, many keys
    assert [r.status for r in outcome.results] == [Status.OK] * 3 + [Status.NOT_FOUND]
    expected = {"hits": len(reads), "read_bytes": sum(sizes[k] for k in reads),
                "write_bytes": sum(sizes.values())}

    servicer = MasterServicer(leadership, Authorizer(TokenStore(None), SECRET))
    reply = servicer.ClusterStatus(pb.ClusterStatusRequest(), servicer.stats["ClusterStatus"])
    assert [(t.tier, t.hits, t.read_bytes, t.write_bytes) for t in reply.tier_stats] == [
        (TIER_DRAM, *expected.values()), (TIER_DISK, 0, 0, 0)]
    sdk = status_to_dict(reply)["tiers"]
    http = status_json(leadership)["tiers"]
    assert set(sdk) == set(http) == {"dram"}
    assert {k: sdk["dram"][k] for k in expected} == {k: http["dram"][k] for k in expected} == expected
    samples = {(s.name, s.labels.get("tier")): s.value
               for family in MasterCollector(leadership, servicer.stats).collect()
               for s in family.samples if s.name.startswith("master_tier_")}
    assert {k: samples[f"master_tier_{k}_total", "dram"] for k in expected} == expected
    assert ("master_tier_hits_total", "disk") not in samples  # no disk mounted: no disk row


class _Recorder:
    """A lifecycle observer that keeps what it is told (state/lifecycle.py)."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, bool]] = []

    def stored(self, obj) -> None:  # type: ignore[no-untyped-def]
        pass

    def dropped(self, obj) -> None:  # type: ignore[no-untyped-def]
        pass

    def moved(self, obj, on_disk: bool) -> None:  # type: ignore[no-untyped-def]
        self.moves.append((obj.key, on_disk))


def test_demotions_and_promotions_are_told_to_the_lifecycle_observer(clock) -> None:  # type: ignore[no-untyped-def]
    svc = _service(clock, promote_window_s=5.0)
    seen = _Recorder()
    svc.objects.observer = seen
    keys = _fill(svc, clock, 14)
    svc.tick()
    _report(svc, clock)
    assert seen.moves == [(k, True) for k in keys[:4]]  # each demoted object, once
    warm = keys[1]
    _read(svc, warm)
    clock.advance(1)
    _read(svc, warm)
    _report(svc, clock)
    assert seen.moves[4:] == [(warm, False)]


def test_kv_events_name_the_medium_of_a_move(clock) -> None:  # type: ignore[no-untyped-def]
    from cellar.master.serving.kv_events import MEDIUM_DISK, MEDIUM_DRAM, medium_of

    svc = _service(clock)
    keys = _fill(svc, clock, 14)
    svc.tick()
    _report(svc, clock)
    assert [medium_of(_obj(svc, k)) for k in keys[:5]] == [MEDIUM_DISK] * 4 + [MEDIUM_DRAM]


def test_a_move_tells_the_node_how_long_the_master_waits_for_it(clock) -> None:  # type: ignore[no-untyped-def]
    """Each Move carries the time left before the master abandons it (`move_timeout_s` from
    its start): the node skips a move past it (storage_node/disk_tier.py), so no late copy
    lands in a range reused after the quarantine. Overdue reads as 1 ms, never 0 (unknown)."""
    svc = _service(clock)
    _fill(svc, clock, 14)
    svc.tick()
    move = svc.tiers.moves_for("n1")[0]
    timeout_s = svc.tiers.settings.move_timeout_s
    assert tier_move(move, clock.monotonic()).expires_in_ms == int(timeout_s * 1000)
    clock.advance(timeout_s - 2.5)
    assert tier_move(move, clock.monotonic()).expires_in_ms == 2_500
    clock.advance(10)
    assert tier_move(move, clock.monotonic()).expires_in_ms == 1
