"""Early reads (client/early_reads.py, `GetBatch.start_early`/`on_early`): the logic, on fake
replies. A key read before is read again under the grant kept from that read while
GetReplicas is in flight; its bytes are kept only if the reply names the same allocation with
the same size and checksum and the bytes hash to it. Otherwise the key is read from the reply
as before, and a caller's buffer holds none of the early bytes unless a read put the value's
own bytes there. The real-process checks are tests/integration/test_sdk_early_reads.py."""

from __future__ import annotations

import time

import pytest
import xxhash
from test_client_core import HEADER, fill, get_reply

import cellar
from cellar.client.early_reads import MARGIN_S, Locations, early_reads_from_env
from cellar.client.gets import GetBatch, into_result, take_value
from cellar.client.puts import PutBatch, PutEntry
from cellar.client.session_state import NodeHealth
from cellar.client.statuses import MISS
from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb
from cellar.proto.tiers import TIER_DISK, TIER_DRAM
from cellar.transfer.base import ST_CONNECT_FAILED, TransferResult

MASTER_MS = 1_000_000
GRANT_TTL_MS = 10_000
VALUE = b"V" * 4096
OTHER = b"O" * 4096  # what the old range holds once reused by another allocation


def reply_for(values, alloc_id=7, missing=()):  # type: ignore[no-untyped-def]
    reply = get_reply(values, nodes=("n1",), missing=missing)
    reply.header.master_time_ms = MASTER_MS
    for result in reply.results:
        for rep in result.replicas:
            rep.grant.alloc_id = alloc_id
            rep.grant.expiry_ms = MASTER_MS + GRANT_TTL_MS
    return reply


def read_once(locations: Locations, dest: memoryview | None = None) -> GetBatch:
    """A plain get of "k" that remembers where it read it."""
    batch = GetBatch(["k"], None if dest is None else [dest], health=NodeHealth(),
                     locations=locations)
    assert batch.start_early() == []
    batch.on_reply(reply_for({"k": VALUE}))
    batch.on_read_results(fill(batch.next_ops(), {"n1": VALUE}))
    assert batch.entries[0].status == Status.OK
    return batch


def early_fill(ops, data: bytes) -> list[TransferResult]:
    """The node served `data` for each early op (what the range held at the time)."""
    for op in ops:
        op.buffer[:] = data[:len(op.buffer)]
    return [TransferResult(checksum=xxhash.xxh3_64_intdigest(bytes(op.buffer))) for op in ops]


def test_a_confirmed_early_read_is_kept_and_nothing_more_is_read() -> None:
    locations = Locations()
    read_once(locations)
    assert len(locations) == 1
    batch = GetBatch(["k"], None, health=NodeHealth(), locations=locations)
    (op,) = batch.start_early()
    assert op.grant.alloc_id == 7 and op.route.node_id == "n1"
    results = early_fill([op], VALUE)
    batch.on_reply(reply_for({"k": VALUE}))
    batch.on_early(results)
    assert batch.next_ops() == []  # settled by the early read
    assert take_value(batch.entries[0]) == VALUE
    assert (locations.kept, locations.discarded) == (1, 0)


def test_another_allocation_in_the_reply_discards_the_early_bytes_and_reads_again() -> None:
    locations = Locations()
    dest = memoryview(bytearray(4096))
    read_once(locations, dest)
    batch = GetBatch(["k"], [dest], health=NodeHealth(), locations=locations)
    (op,) = batch.start_early()
    results = early_fill([op], OTHER)  # the old range now holds another allocation's bytes
    batch.on_reply(reply_for({"k": VALUE}, alloc_id=8))  # replaced: a new allocation
    batch.on_early(results)
    assert bytes(dest) == bytes(4096), "the early bytes are cleared before the key is read"
    (again,) = batch.next_ops()
    assert again.grant.alloc_id == 8
    batch.on_read_results(fill([again], {"n1": VALUE}))
    assert batch.entries[0].status == Status.OK and bytes(dest) == VALUE
    assert (locations.kept, locations.discarded) == (0, 1)
    assert locations.find("k", 0.0) is not None and locations.find("k", 0.0).grant.alloc_id == 8


def test_a_removed_key_leaves_no_early_bytes_in_the_callers_buffer() -> None:
    locations = Locations()
    dest = memoryview(bytearray(4096))
    read_once(locations, dest)
    dest[:] = b"\xee" * 4096  # the caller reuses its buffer
    batch = GetBatch(["k"], [dest], health=NodeHealth(), locations=locations)
    results = early_fill(batch.start_early(), OTHER)
    batch.on_reply(reply_for({"k": VALUE}, missing={"k"}))
    batch.on_early(results)
    assert batch.next_ops() == []
    assert into_result(batch.entries[0]) == MISS
    assert bytes(dest) == bytes(4096)
    assert len(locations) == 0, "a key found missing is forgotten"


def test_same_allocation_but_bytes_that_do_not_hash_to_its_checksum_are_read_again() -> None:
    locations = Locations()
    read_once(locations)
    batch = GetBatch(["k"], None, health=NodeHealth(), locations=locations)
    (op,) = batch.start_early()
    op.buffer[:] = OTHER
    results = [TransferResult(checksum=xxhash.xxh3_64_intdigest(OTHER))]
    batch.on_reply(reply_for({"k": VALUE}))
    batch.on_early(results)
    (again,) = batch.next_ops()
    batch.on_read_results(fill([again], {"n1": VALUE}))
    assert take_value(batch.entries[0]) == VALUE
    assert (locations.kept, locations.discarded) == (0, 1)


def test_a_refused_early_read_falls_back_without_marking_the_node() -> None:
    locations = Locations()
    read_once(locations)
    health = NodeHealth()
    batch = GetBatch(["k"], None, health=health, locations=locations)
    batch.start_early()
    batch.on_reply(reply_for({"k": VALUE}))
    batch.on_early([TransferResult(6, "grant expired")])
    assert health.unhealthy() == set()
    (again,) = batch.next_ops()
    batch.on_read_results(fill([again], {"n1": VALUE}))
    assert take_value(batch.entries[0]) == VALUE


def test_a_failed_lookup_clears_the_early_bytes() -> None:
    locations = Locations()
    dest = memoryview(bytearray(4096))
    read_once(locations, dest)
    batch = GetBatch(["k"], [dest], health=NodeHealth(), locations=locations)
    early_fill(batch.start_early(), OTHER)
    batch.drop_early()
    assert bytes(dest) == bytes(4096)


def test_a_budgeted_get_reads_no_disk_replica_early() -> None:
    locations = Locations()
    batch = GetBatch(["k"], None, health=NodeHealth(), locations=locations)
    reply = reply_for({"k": VALUE})
    reply.segments[0].tier = TIER_DISK
    batch.on_reply(reply)
    batch.on_read_results(fill(batch.next_ops(), {"n1": VALUE}))
    assert locations.find("k", 0.0) is not None and locations.find("k", 0.0).disk
    budgeted = GetBatch(["k"], None, health=NodeHealth(), locations=locations, budgeted=True)
    assert budgeted.start_early() == []
    plain = GetBatch(["k"], None, health=NodeHealth(), locations=locations)
    assert len(plain.start_early()) == 1


def test_a_destination_too_small_for_the_kept_size_is_not_read_early() -> None:
    locations = Locations()
    read_once(locations)
    small = memoryview(bytearray(100))
    batch = GetBatch(["k"], [small], health=NodeHealth(), locations=locations)
    assert batch.start_early() == []


def test_locations_expire_before_their_grant_and_stay_bounded() -> None:
    locations = Locations(max_keys=2)
    batch = read_once(locations)
    route, grant = batch.entries[0].candidates[0][:2]
    found = locations.find("k", 0.0)
    assert found is not None
    good_for_s = GRANT_TTL_MS / 1000 - MARGIN_S
    now = found.good_until - good_for_s
    assert locations.find("k", now + good_for_s - 0.01) is not None
    assert locations.find("k", now + good_for_s) is None
    locations.remember([(key, route, grant, 4096, 1, False) for key in ("a", "b")],
                       MASTER_MS, now=now)
    locations.remember([("a", route, grant, 4096, 1, False)], MASTER_MS, now=now)  # a is newest
    locations.remember([("c", route, grant, 4096, 1, False)], MASTER_MS, now=now)
    assert len(locations) == 2 and locations.find("b", now) is None  # the oldest went first
    assert locations.find("a", now) is not None and locations.find("c", now) is not None
    locations.remember([("late", route, grant, 4096, 1, False)], grant.expiry_ms - 500, now=now)
    assert locations.find("late", now) is None, "a grant within MARGIN_S of expiry is not kept"
    locations.remember([("unknown", route, grant, 4096, 1, False)], 0, now=now)
    assert locations.find("unknown", now) is None, "no master clock, nothing kept"


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, on in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv("CELLAR_EARLY_READS", text)
        assert early_reads_from_env() is on
    monkeypatch.setenv("CELLAR_EARLY_READS", "yes")
    with pytest.raises(cellar.InvalidArgument, match="CELLAR_EARLY_READS"):
        early_reads_from_env()


def test_a_prefix_get_uses_no_early_read_after_a_miss() -> None:
    locations = Locations()
    read_once(locations)
    dest = memoryview(bytearray(4096))
    batch = GetBatch(["gone", "k"], [memoryview(bytearray(4096)), dest], health=NodeHealth(),
                     locations=locations, prefix=True)
    results = early_fill(batch.start_early(), VALUE)  # "k" is read early, and is good
    reply = reply_for({"gone": VALUE, "k": VALUE}, missing={"gone"})
    reply.results[1].replicas[0].offset = 0  # where read_once found it: the early read matches
    batch.on_reply(reply)
    batch.on_early(results)
    batch.keep_prefix()
    assert batch.next_ops() == []
    gone, k = batch.entries
    assert into_result(gone) == MISS and into_result(k) == MISS and k.cut


def test_no_early_read_goes_to_a_node_that_failed_a_read_lately() -> None:
    locations = Locations()
    read_once(locations)
    health = NodeHealth()
    health.mark_failed("n1")
    assert GetBatch(["k"], None, health=health, locations=locations).start_early() == []
    assert len(GetBatch(["k"], None, health=NodeHealth(), locations=locations).start_early()) == 1


# ---- keys this client put (PutBatch.written) ---------------------------------------------

def _put_start_reply(placements: list[tuple[str, int, int]]) -> pb.PutStartReply:
    """One OK result per (node, segment id, tier), each one replica at offset 0 of SIZE."""
    results, segments = [], {}
    for n, (node, sid, tier) in enumerate(placements):
        rep = pb.Replica(node_id=node, segment_id=sid, offset=0, length=len(VALUE),
                         grant=pb.Grant(op=2, alloc_id=50 + n, epoch=1,
                                        expiry_ms=MASTER_MS + GRANT_TTL_MS, key_tag=5,
                                        mac=b"m" * 16))
        results.append(pb.PutStartResult(status=Status.OK, put_id=100 + n, replicas=[rep]))
        segments[sid] = pb.SegmentInfo(segment_id=sid, node_id=node, size_bytes=1 << 20,
                                       host_id="h", tier=tier, endpoints=[
                                           pb.Endpoint(transport="tcp", address=f"{node}:1")])
    return pb.PutStartReply(results=results, segments=list(segments.values()))


def test_keys_put_through_a_mapping_are_written_with_their_write_grant_and_tier() -> None:
    """Only keys whose PutEnd was OK and whose replica went to a transport that reads the
    client's own mapping are handed to `Locations` (the write grant is never shown to a node:
    such a transport copies out of the mapping); a disk replica is marked so."""
    keys = ["dram", "remote", "disk", "refused", "failed"]
    entries = [PutEntry(k, memoryview(VALUE), None) for k in keys]
    batch = PutBatch(entries, tenant="t", replicas=1, soft_pin=False, upsert=False,
                     health=NodeHealth(), max_attempts=1,
                     reads_own_mapping=lambda route: route.node_id == "n1")
    batch.start_request(HEADER)
    ops = batch.on_start_reply(_put_start_reply([
        ("n1", 1, TIER_DRAM), ("n2", 2, TIER_DRAM), ("n1", 3, TIER_DISK), ("n1", 1, TIER_DRAM),
        ("n1", 1, TIER_DRAM)]))
    ok = TransferResult(receipt=b"r" * 68)
    ends, revokes = batch.on_write_results(
        [ok, ok, ok, ok, TransferResult(ST_CONNECT_FAILED, "refused")], may_retry=False)
    assert [item.key for item in ends] == ["dram", "remote", "disk", "refused"]
    assert [ref.key for ref in revokes] == ["failed"]
    batch.on_end_reply(pb.PutEndReply(results=[
        pb.KeyResult(status=Status.OK), pb.KeyResult(status=Status.OK),
        pb.KeyResult(status=Status.OK), pb.KeyResult(status=Status.ALREADY_EXISTS)]))
    digest = xxhash.xxh3_64_intdigest(VALUE)
    assert [(key, grant.alloc_id, grant.op, size, checksum, disk)
            for key, _route, grant, size, checksum, disk in batch.written] == [
        ("dram", 50, 2, len(VALUE), digest, False), ("disk", 52, 2, len(VALUE), digest, True)]
    assert batch.written[0][1] is ops[0].route

    locations = Locations()
    locations.remember(batch.written, MASTER_MS)
    found = locations.find("dram", time.monotonic())
    assert found is not None and found.grant.alloc_id == 50 and not found.disk
    assert locations.find("remote", time.monotonic()) is None


def test_without_a_mapping_transport_nothing_put_is_kept() -> None:
    batch = PutBatch([PutEntry("k", memoryview(VALUE), None)], tenant="t", replicas=1,
                     soft_pin=False, upsert=False, health=NodeHealth())
    batch.start_request(HEADER)
    batch.on_start_reply(_put_start_reply([("n1", 1, TIER_DRAM)]))
    batch.on_write_results([TransferResult(receipt=b"r" * 68)], may_retry=False)
    batch.on_end_reply(pb.PutEndReply(results=[pb.KeyResult(status=Status.OK)]))
    assert batch.written == []


def test_a_key_put_is_read_early_and_its_bytes_kept_only_when_the_reply_confirms() -> None:
    """A location from a put (its write grant, alloc 50) serves the next get early; the bytes
    are kept when the reply names alloc 50 with the same size and checksum, and cleared and
    read again from the reply when it names another allocation (the key replaced)."""
    for alloc_id, kept in ((50, True), (51, False)):
        batch = PutBatch([PutEntry("k", memoryview(VALUE), None)], tenant="t", replicas=1,
                         soft_pin=False, upsert=False, health=NodeHealth(),
                         reads_own_mapping=lambda route: True)
        batch.start_request(HEADER)
        batch.on_start_reply(_put_start_reply([("n1", 1, TIER_DRAM)]))
        batch.on_write_results([TransferResult(receipt=b"r" * 68)], may_retry=False)
        batch.on_end_reply(pb.PutEndReply(results=[pb.KeyResult(status=Status.OK)]))
        locations = Locations()
        locations.remember(batch.written, MASTER_MS)
        dest = memoryview(bytearray(len(VALUE)))
        get = GetBatch(["k"], [dest], health=NodeHealth(), locations=locations)
        (op,) = get.start_early()
        assert op.grant.alloc_id == 50 and op.route.node_id == "n1"
        results = early_fill([op], VALUE if kept else OTHER)
        get.on_reply(reply_for({"k": VALUE}, alloc_id=alloc_id))
        get.on_early(results)
        assert (locations.kept, locations.discarded) == ((1, 0) if kept else (0, 1))
        if kept:
            assert get.next_ops() == [] and bytes(dest) == VALUE
        else:
            assert bytes(dest) == bytes(len(VALUE)), "the early bytes are cleared"
            (again,) = get.next_ops()
            assert again.grant.alloc_id == 51
