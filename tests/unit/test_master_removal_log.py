"""Durable removes and upserts, without processes: the tombstone bound each change leaves, how a
new master that loaded them refuses old reports (and only old ones), the removal log's file
format (torn lines, hostile records, compaction), and placement in a fresh cluster."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_master_support import (
    EPOCH,
    SECRET,
    Entry,
    FakeClock,
    MiB,
    make_service,
    mount,
    put,
    put_start,
    segment_info,
)

from cellar.errors import Status
from cellar.master.requests import PutRef
from cellar.master.service import PutEndItem, PutItem
from cellar.master.serving import removal_log
from cellar.master.serving.removal_log import FileRemovalLog, decode, encode
from cellar.master.state.ids import ID_EPOCH_SHIFT
from cellar.master.state.records import HARD_PIN
from cellar.master.state.tombstones import DEAD_WRITE, HARD_PIN_RECORD, Tombstones
from tests.support.receipts import receipts_for

if TYPE_CHECKING:
    from cellar.master.serving.leadership import Leadership


def replica_ids(svc, key: str) -> list[int]:
    obj = svc.tenant("").objects[key]
    return [rep.alloc_id for rep in obj.replicas]


def restarted(svc, **settings):
    """A new master (later epoch) that loaded `svc`'s queued bounds, as from the removal log."""
    new = make_service(FakeClock(), epoch=EPOCH + 60_000, rebuild_grace_s=0, **settings)
    new.load_removals(svc.tombstones.take_pending())
    new.mount_segment("n1", 2, [segment_info(1, 64 * MiB)], report_follows=True)
    return new


def test_a_removed_key_is_refused_after_a_restart_and_a_new_value_is_not() -> None:
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "gone", 4096)
    put(svc, "kept", 4096)
    old_gone, old_kept = replica_ids(svc, "gone")[0], replica_ids(svc, "kept")[0]
    assert svc.remove("", ["gone"]) == [(Status.OK, "")]
    assert [r[1] for r in svc.tombstones.pending] == ["gone"]
    new = restarted(svc)
    out = new.report_objects("n1", 2, 1, [Entry("gone", old_gone, 0, 4096),
                                          Entry("kept", old_kept, 4096, 4096)], last=True)
    assert (out.accepted, out.refused) == (1, [old_gone])
    # a put after the restart has a larger id: the tombstone never refuses it
    put(new, "gone", 4096)
    assert replica_ids(new, "gone")[0] > new.removed_alloc_id("default", "gone")


def test_an_upsert_refuses_older_values_only() -> None:
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "k", 4096)
    v1 = replica_ids(svc, "k")[0]
    put(svc, "k", 4096, upsert=True, checksum=9)
    v2 = replica_ids(svc, "k")[0]
    assert v1 < v2 and svc.tombstones.pending == [("default", "k", v2 - 1, "")]
    new = restarted(svc)
    out = new.report_objects("n1", 2, 1, [Entry("k", v1, 0, 4096), Entry("k", v2, 4096, 4096, 9)],
                             last=True)
    assert (out.accepted, out.refused) == (1, [v1])
    assert replica_ids(new, "k") == [v2]


def test_a_hard_pin_outlives_a_restart_until_its_key_is_removed_or_replaced() -> None:
    """A hard-pinned put leaves a pin record (its PutEnd waits for it like a removal's bound);
    a restarted master adopts that version hard-pinned: charged as hard-pinned, never offered to
    eviction. A later upsert without a pin, or a remove, ends the record; a compacted log keeps
    only live pins. Before, every adopted object was unpinned."""
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "sys", 4096, hard_pin=True)
    put(svc, "plain", 4096)
    put(svc, "gone", 4096, hard_pin=True)
    pinned, plain, gone = (replica_ids(svc, k)[0] for k in ("sys", "plain", "gone"))
    assert svc.tombstones.pending == [("default", "sys", pinned, HARD_PIN_RECORD),
                                      ("default", "gone", gone, HARD_PIN_RECORD)]
    svc.remove("", ["gone"])
    assert [rec for rec in svc.tombstones.snapshot() if rec[3] == HARD_PIN_RECORD] == [
        ("default", "sys", pinned, HARD_PIN_RECORD)]
    new = restarted(svc)
    out = new.report_objects("n1", 2, 1, [Entry("sys", pinned, 0, 4096),
                                          Entry("plain", plain, 4096, 4096)], last=True)
    assert out.accepted == 2
    tenant = new.tenant("")
    assert tenant.objects["sys"].pin_kind == HARD_PIN
    assert tenant.objects["plain"].pin_kind != HARD_PIN
    assert tenant.hard_pinned_bytes == tenant.objects["sys"].reserved
    new.check_invariants()

    # an upsert without a pin ends it: the next master adopts the new version unpinned
    put(new, "sys", 4096, upsert=True, checksum=9)
    newer = replica_ids(new, "sys")[0]
    assert new.tombstones.hard_pinned_from("default", "sys") == 0
    third = restarted(new)
    third.load_removals(svc.tombstones.snapshot())  # the whole log: the pin, then the bound
    out = third.report_objects("n1", 2, 1, [Entry("sys", newer, 8192, 4096, 9)], last=True)
    assert out.accepted == 1 and third.tenant("").objects["sys"].pin_kind != HARD_PIN


def test_a_remove_acknowledged_mid_put_wins_over_that_put() -> None:
    """The remove comes after the put's PutStart and is acknowledged before its PutEnd: the put
    is ordered just before the remove (its PutEnd answers OK, nothing is stored), and after a
    restart neither the old value nor the put's sealed allocation comes back; a put that never
    ends (its writer gave up, its bytes sealed on the node) does not either."""
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "k", 4096)
    v1 = replica_ids(svc, "k")[0]
    started = put_start(svc, "k", 4096, upsert=True)
    v2 = started.replicas[0].alloc_id
    put(svc, "j", 4096)
    v0 = replica_ids(svc, "j")[0]
    abandoned = put_start(svc, "j", 4096, upsert=True)  # its writer gives up: no PutEnd ever
    v3 = abandoned.replicas[0].alloc_id
    assert svc.remove("", ["k", "j"]) == [(Status.OK, "")] * 2
    end = PutEndItem("k", started.put_id, 9, receipts_for(SECRET, started, 9))
    assert svc.put_end("", "writer", [end]) == [(Status.OK, "")]
    assert "k" not in svc.tenant("").objects
    svc.check_invariants()
    new = restarted(svc)
    out = new.report_objects("n1", 2, 1, [Entry("k", v1, 0, 4096), Entry("k", v2, 4096, 4096, 9),
                                          Entry("j", v0, 8192, 4096), Entry("j", v3, 12288, 4096, 9)],
                             last=True)
    assert (out.accepted, sorted(out.refused)) == (0, sorted([v0, v1, v2, v3]))


def test_a_remove_of_a_key_the_master_lost_still_leaves_a_bound() -> None:
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    assert svc.remove("", ["never-seen"]) == [(Status.NOT_FOUND, "no such key")]
    new = restarted(svc)
    old = (EPOCH - 1) << ID_EPOCH_SHIFT  # a value an away node still holds
    out = new.report_objects("n1", 2, 1, [Entry("never-seen", old, 0, 4096)], last=True)
    assert out.refused == [old]


def test_a_removes_repeat_after_a_restart_answers_as_the_first_call_did() -> None:
    """The first Remove's reply is lost with its master; its repeat (same request tag) finds
    the key gone on the new master: OK for what it removed, NOT_FOUND for what it missed, and
    another call (another tag) removing the same key gets NOT_FOUND."""
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "gone", 4096)
    first = svc.remove("", ["gone", "absent"], by="tag-1")
    assert first == [(Status.OK, ""), (Status.NOT_FOUND, "no such key")]
    new = restarted(svc)
    new.report_objects("n1", 2, 1, [], last=True)
    assert new.remove("", ["gone", "absent"], by="tag-1") == first
    assert new.remove("", ["gone"], by="tag-2") == [(Status.NOT_FOUND, "no such key")]
    assert new.remove("", ["gone"]) == [(Status.NOT_FOUND, "no such key")]
    assert new.remove("", ["gone"], by="tag-1") == [(Status.OK, "")]  # misses keep the tag


def test_remove_prefix_and_remove_all_queue_every_key() -> None:
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    for i in range(5):
        put(svc, f"a/{i}", 4096)
        put(svc, f"b/{i}", 4096)
    assert svc.remove_prefix("", "a/") == 5
    assert sorted(k for _t, k, _b, _by in svc.tombstones.take_pending()) == [f"a/{i}" for i in range(5)]
    assert svc.remove_all("") == 5
    assert len(svc.tombstones.take_pending()) == 5
    assert svc.put_start("", "w", [PutItem("c", 4096)]).results[0].status == Status.OK
    assert svc.tombstones.pending == []  # a plain put leaves no bound


def test_loaded_bounds_move_the_alloc_id_counter_above_them() -> None:
    svc = make_service(FakeClock(), epoch=EPOCH)
    high = (EPOCH + 10) << ID_EPOCH_SHIFT  # a bound from a master with a later clock
    svc.load_removals([("default", "k", high, "")])
    mount(svc, "n1", 1)
    assert put_start(svc, "k", 4096).replicas[0].alloc_id > high
    assert svc.tombstones.pending == []  # loading queues nothing to write again


def test_file_log_round_trip_skips_torn_and_hostile_lines(tmp_path: Path) -> None:
    path = tmp_path / "removals.log"
    log = FileRemovalLog(path)
    assert log.load() == []
    records = [("default", "k\n1", 5, ""), ("t2", "ключ", 1 << 40, "ab" * 16)]
    asyncio.run(log.append(records, list))
    log.close()
    with open(path, "ab") as f:  # hostile or torn lines: all skipped, never raised
        f.write(b'["default","x",0]\n["default","",3]\n["default","y",9223372036854775808]\n'
                b'{"a":1}\n["default","z",true]\n["default","torn",12')
    again = FileRemovalLog(path)
    assert again.load() == records
    assert again.refused_on_load == 6
    again.close()


def test_file_log_compacts_to_the_live_bounds(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(removal_log, "COMPACT_SLACK_RECORDS", 10)
    path = tmp_path / "removals.log"
    log = FileRemovalLog(path)
    log.load()
    live = [("default", "k", 100, "")]
    for i in range(30):
        asyncio.run(log.append([("default", "k", i + 1, "")], lambda: live))
    log.close()
    lines = path.read_bytes().count(b"\n")
    assert lines < 30 and decode(path.read_bytes())[0][0] == live[0]


def test_encode_is_one_line_per_record() -> None:
    records = [("a", "b\nc", 1, ""), ("d", "e", 2, "9f" * 16)]
    data = encode(records)
    assert data.count(b"\n") == 2 and decode(data) == (records, 0)


def test_decode_refuses_a_tag_out_of_bounds() -> None:
    data = b'["a","k",1,"' + b"x" * 65 + b'"]\n["a","k",2,7]\n["a","k",3,"t"]\n'
    assert decode(data) == ([("a", "k", 3, "t")], 2)


def test_nodes_that_mount_together_share_writes_from_the_first_put() -> None:
    clock = FakeClock()
    svc = make_service(clock, new_node_ramp_s=10.0)
    mount(svc, "first", 1)
    clock.advance(1.0)  # the second node mounts a second later: both are new
    mount(svc, "second", 2)
    placed = Counter()
    for i in range(300):
        result = put_start(svc, f"k{i}", 64 * 1024)
        placed[result.replicas[0].node_id] += 1
        svc.put_end("", "writer", [PutEndItem(f"k{i}", result.put_id, 7, receipts_for(SECRET, result, 7))])
    assert 120 <= placed["first"] <= 180 and 120 <= placed["second"] <= 180, placed
    # a third node joining nodes that hold data still ramps
    mount(svc, "late", 3)
    burst = Counter(put_start(svc, f"b{i}", 64 * 1024).replicas[0].node_id for i in range(30))
    assert burst["late"] == 0, burst


class _FlakyLog:
    """A removal log whose first `failures` appends raise (an etcd outage), recording the rest."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[tuple[str, str, int]] = []

    async def append(self, records, snapshot) -> None:  # noqa: ANN001 - the log's interface
        if self.failures:
            self.failures -= 1
            raise ConnectionError("etcd unreachable")
        self.written += records


def _leadership_on_a_flaky_log(failures: int) -> tuple[Leadership, _FlakyLog]:
    """A single master's Leadership whose removal log fails its first `failures` appends,
    with one node mounted."""
    from cellar.master.config import MasterConfig
    from cellar.master.serving.leadership import Leadership

    leadership = Leadership(MasterConfig(new_node_ramp_s=0.0), SECRET, ha=False)
    flaky = _FlakyLog(failures=failures)
    leadership.removal_log = flaky  # type: ignore[assignment]
    mount(leadership.service, "n1", 1)
    return leadership, flaky


def test_bounds_of_a_failed_write_go_out_with_the_next_remove() -> None:
    leadership, flaky = _leadership_on_a_flaky_log(failures=1)
    svc = leadership.service
    for key in "abc":
        put(svc, key, 4096)
    assert svc.tombstones.take_pending() == []
    svc.remove("", ["a"])
    with pytest.raises(ConnectionError):
        asyncio.run(leadership.make_durable())  # not acknowledged: its bound is kept
    assert flaky.written == []
    # The remove's repeat (answered from the reply memory: no new bound) still waits for the
    # write, and a read does not.
    assert leadership.durable_due("Remove") and not leadership.durable_due("GetReplicas")
    # so does a revoke's repeat: its dead writes are bounds a successor must know too
    assert leadership.durable_due("PutRevoke")
    svc.remove("", ["b"])
    asyncio.run(leadership.make_durable())
    assert [key for _, key, _, _ in flaky.written] == ["a", "b"]
    svc.remove("", ["c"])
    asyncio.run(leadership.make_durable())  # written once: nothing is carried twice
    assert [key for _, key, _, _ in flaky.written] == ["a", "b", "c"]
    assert not leadership.durable_due("Remove")


def test_bounds_of_two_writes_failing_at_once_both_go_out_with_the_next() -> None:
    """Two removes whose writes are in flight together (the etcd log's group commit: each
    took its own bounds before either failed) and both fail: the bounds of both are kept, not
    only the last to fail, so the first one's repeat (answered OK from the reply memory) is
    acknowledged only once its bound is in the log, and its old value's ranges are freed."""
    leadership, flaky = _leadership_on_a_flaky_log(failures=2)
    svc = leadership.service
    for key in "abc":
        put(svc, key, 4096)
    svc.remove("", ["a"])
    first = leadership.take_durable()
    svc.remove("", ["b"])
    second = leadership.take_durable()
    assert svc.objects.held_count == 2
    for work in (first, second):
        with pytest.raises(ConnectionError):
            asyncio.run(leadership.make_durable(work))
    assert flaky.written == [] and leadership.durable_due("Remove")
    asyncio.run(leadership.make_durable())  # a's repeat: writes what both failures kept
    assert sorted(key for _, key, _, _ in flaky.written) == ["a", "b"]
    assert svc.objects.held_count == 0 and not leadership.durable_due("Remove")
    svc.remove("", ["c"])
    asyncio.run(leadership.make_durable())  # nothing carried twice
    assert sorted(key for _, key, _, _ in flaky.written) == ["a", "b", "c"]


def test_a_changes_ranges_stay_on_their_nodes_until_its_bound_is_written() -> None:
    """A remove's or an upsert's old version keeps its ranges allocated, and its node untold,
    while its bound is not in the removal log: a successor that rebuilds from the nodes must
    still find it (tests/faults/test_durable_removes.py, the same across a failover). Once a
    write succeeds (the retry's, or any later change's) they are freed; a reader's pin still
    holds them past that, as for any drop."""
    leadership, flaky = _leadership_on_a_flaky_log(failures=1)
    svc = leadership.service
    segment = svc.membership.segments[1]
    outbox = segment.node.outbox
    for key in ("a", "up", "read", "later"):
        put(svc, key, MiB)
    outbox.clear()
    used = segment.allocator.used_bytes

    svc.remove("", ["a"])
    put(svc, "up", MiB, upsert=True, checksum=9)  # the old "up" waits too
    with pytest.raises(ConnectionError):
        asyncio.run(leadership.make_durable())
    assert segment.allocator.used_bytes == used + MiB  # the new "up"; nothing freed
    assert list(outbox) == []
    assert svc.objects.held_count == 2

    pin = svc.get_replicas("", "reader", ["read"]).results[0].pin_id
    svc.remove("", ["read"])  # this write succeeds and carries the failed one's bounds
    asyncio.run(leadership.make_durable())
    assert [key for _, key, _, _ in flaky.written] == ["a", "up", "read"]
    assert segment.allocator.used_bytes == used - MiB  # a and the old up; "read" is pinned
    assert len(outbox) == 2 and svc.objects.held_count == 0
    svc.unpin("", "reader", [pin])
    assert segment.allocator.used_bytes == used - 2 * MiB and len(outbox) == 3

    # without a removal log (turned off) nothing waits
    leadership.removal_log = None
    svc.remove("", ["later"])
    asyncio.run(leadership.make_durable())
    assert segment.allocator.used_bytes == used - 3 * MiB and svc.objects.held_count == 0


def test_a_put_end_repeated_after_a_restart_is_recognised_by_its_receipt() -> None:
    """The first PutEnd completed the put and its reply died with the master; the new master
    adopted the object from the node. The writer's repeat carries the node's receipt: OK, not
    NOT_FOUND (which made the SDK start the put over and meet AlreadyExists). A receipt for
    another allocation, a forged one or another checksum proves nothing."""
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    started = put_start(svc, "k", 4096)
    receipts = receipts_for(SECRET, started, 9)
    assert svc.put_end("", "writer", [PutEndItem("k", started.put_id, 9, receipts)]) \
        == [(Status.OK, "")]
    other = put_start(svc, "other", 4096)
    new = restarted(svc)
    rep = started.replicas[0]
    new.report_objects("n1", 2, 1, [Entry("k", rep.alloc_id, rep.offset, 4096, 9)], last=True)
    again = PutEndItem("k", started.put_id, 9, receipts)
    assert new.put_end("", "writer", [again]) == [(Status.OK, "")]
    forged = bytes(receipts[0][:-1]) + bytes([receipts[0][-1] ^ 1])
    for item in (PutEndItem("k", started.put_id, 9, []),
                 PutEndItem("k", started.put_id, 9, [forged]),
                 PutEndItem("k", started.put_id, 9, receipts_for(SECRET, other, 9)),
                 PutEndItem("k", started.put_id, 8, receipts_for(SECRET, started, 8))):
        assert new.put_end("", "writer", [item])[0][0] == Status.NOT_FOUND


class _Target:
    removals_prefix = "/cellar/t/removals/"


class _Election:
    """What the etcd removal log uses of the election: the leader-only writes, in a dict."""

    def __init__(self) -> None:
        self.target = _Target()
        self.store: dict[str, bytes] = {}
        self.removal_values: list[bytes] = []

    async def write_as_leader(self, puts: dict[str, bytes],
                              delete_range: tuple[str, str] | None = None) -> bool:
        if delete_range is not None:
            for key in [k for k in self.store if delete_range[0] <= k < delete_range[1]]:
                del self.store[key]
        self.store.update(puts)
        return True


def test_etcd_log_stays_small_since_every_election_reads_it_whole() -> None:
    """A soak's worth of bounds over 256 keys: the log in etcd never holds more than
    2 x the live bounds + the etcd slack, so an election's read stays small (at the file's
    slack of 65,536 it never compacted in 10 minutes and takeovers grew from 3 s to 6.5 s)."""
    from cellar.master.serving.removal_log import (
        COMPACT_FACTOR,
        ETCD_COMPACT_SLACK_RECORDS,
        EtcdRemovalLog,
    )

    election = _Election()
    log = EtcdRemovalLog(election)  # type: ignore[arg-type]
    log.load(epoch=1)
    live: dict[str, int] = {}
    bound = 0

    async def run() -> None:
        nonlocal bound
        for _ in range(6 * ETCD_COMPACT_SLACK_RECORDS):
            bound += 1
            key = f"k{bound % 256}"
            live[key] = bound
            await log.append([("default", key, bound, "")],
                             lambda: [("default", k, b, "") for k, b in live.items()])

    asyncio.run(run())
    records, refused = decode(b"".join(election.store.values()))
    assert refused == 0
    assert len(records) <= COMPACT_FACTOR * len(live) + ETCD_COMPACT_SLACK_RECORDS + 1
    newest: dict[str, int] = {}
    for _tenant, key, b, _by in records:
        newest[key] = max(newest.get(key, 0), b)
    assert newest == live  # nothing the log had to keep was dropped


def test_a_write_dropped_before_it_completed_is_never_adopted_after_a_restart() -> None:
    # An upsert whose bytes a node sealed, revoked before its PutEnd (or, the same for the
    # table, a put-ahead allocation refused at PutEnd): newer than the acknowledged value, so
    # a rebuild that prefers the newest allocation would put it in that value's place.
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "k", 4096, checksum=7)
    acked = replica_ids(svc, "k")[0]
    started = put_start(svc, "k", 4096, upsert=True)
    assert started.status == Status.OK
    revoked = started.replicas[0]
    assert revoked.alloc_id > acked
    assert svc.put_revoke("", "writer", [PutRef("k", started.put_id)]) == [(Status.OK, "")]
    assert [(r[2], r[3]) for r in svc.tombstones.pending] == [(revoked.alloc_id, DEAD_WRITE)]
    reports = [Entry("k", acked, 0, 4096, checksum=7),
               Entry("k", revoked.alloc_id, revoked.offset, 4096, checksum=8)]
    forgetful = make_service(FakeClock(), epoch=EPOCH + 60_000, rebuild_grace_s=0)
    forgetful.mount_segment("n1", 2, [segment_info(1, 64 * MiB)], report_follows=True)
    forgetful.report_objects("n1", 2, 1, reports, last=True)
    assert forgetful.get_replicas("", "r", ["k"]).results[0].checksum == 8  # what it guards
    new = restarted(svc)
    out = new.report_objects("n1", 2, 1, reports, last=True)
    assert (out.accepted, out.refused) == (1, [revoked.alloc_id])
    assert new.get_replicas("", "r", ["k"]).results[0].checksum == 7


def test_puts_upserts_and_removes_that_complete_leave_no_dead_write() -> None:
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "k", 4096)
    assert svc.tombstones.pending == []  # the common path writes nothing
    put(svc, "k", 4096, upsert=True)
    assert [r[3] for r in svc.tombstones.pending] == [""]  # the upsert's bound alone
    svc.tombstones.take_pending()
    assert svc.remove("", ["k"]) == [(Status.OK, "")]
    assert [r[3] for r in svc.tombstones.pending] == [""]  # the remove's bound alone


def test_dead_writes_go_through_the_log_and_its_compaction_and_are_capped() -> None:
    stones = Tombstones(max_removed=3)
    stones.kill_write("t", "k", [11, 12])
    stones.remember_removed("t", "k", 5)
    stones.kill_write("t", "k", [4])  # at or below the key's bound: dead already, no record
    records, refused = decode(encode(stones.take_pending()))
    assert refused == 0 and [r[2:] for r in records] == [(11, DEAD_WRITE), (12, DEAD_WRITE),
                                                         (5, "")]
    loaded = Tombstones(max_removed=3)
    assert loaded.load(records) == 12
    assert loaded.dead_write(11) and loaded.dead_write(12) and not loaded.dead_write(5)
    assert loaded.removed_alloc_id("t", "k") == 5 and loaded.pending == []
    assert sorted(r[2] for r in loaded.snapshot()) == [5, 11, 12]
    loaded.kill_write("t", "j", [20, 21])  # past the cap: the oldest are forgotten first
    assert not loaded.dead_write(11) and loaded.dead_write(12) and loaded.dead_write(21)
