"""The master's side of keeping engine hashes across a rebuild: a PutEnd of a page with an
engine hash notes it for each replica's node (the next heartbeat reply carries it, once), and
a rebuilt master adopts a reported hash (bounds-checked: a malformed one is dropped, the object
kept) and indexes it for the prefix query. With real processes:
tests/faults/test_master_restart.py::test_engine_hashes_outlive_node_and_master_kills."""

from __future__ import annotations

from test_master_support import EPOCH, Entry, FakeClock, make_service, mount, put, segment_info

from cellar.master.state import membership
from cellar.proto import engine_hash

HASH = engine_hash.encode(424242)


def test_a_put_end_notes_the_hash_for_the_next_heartbeat_once() -> None:
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "page", 4096, engine_hash=HASH)
    put(svc, "plain", 4096)
    replica = svc.tenant("").objects["page"].replicas[0]
    first = svc.heartbeat("n1", 1, 0)
    assert first.engine_hashes == [(1, replica.alloc_id, HASH)]
    assert svc.heartbeat("n1", 1, 0).engine_hashes == []  # sent once (best effort)


def test_notes_past_the_bound_are_dropped_and_counted(monkeypatch) -> None:
    monkeypatch.setattr(membership, "MAX_HASH_NOTES_PER_NODE", 3)
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    for i in range(5):
        put(svc, f"p{i}", 4096, engine_hash=engine_hash.encode(i))
    assert len(svc.heartbeat("n1", 1, 0).engine_hashes) == 3
    assert svc.membership.hash_notes_dropped == 2


def test_a_rebuild_adopts_a_reported_hash_and_drops_a_malformed_one() -> None:
    svc = make_service(FakeClock(), epoch=EPOCH + 60_000, rebuild_grace_s=0)
    svc.mount_segment("n1", 2, [segment_info(1, 1 << 26)], report_follows=True)
    good, bad = Entry("good", 10, 0, 4096), Entry("bad", 11, 4096, 4096)
    good.engine_hash, bad.engine_hash = HASH, b"\x07not-an-encoding"  # type: ignore[attr-defined]
    out = svc.report_objects("n1", 2, 1, [good, bad], last=True)
    assert out.accepted == 2  # the object is kept, told by its key hash
    tenant = svc.tenant("")
    assert tenant.objects["good"].engine_hash == HASH
    assert tenant.objects["bad"].engine_hash == b""
    assert tenant.engine_hashes.get(HASH) == [tenant.objects["good"]]


def test_a_replica_reported_without_the_hash_its_object_has_is_told_it_again() -> None:
    """Notes are best effort (sent once): a node that missed one reports the replica without
    the hash. The rebuild takes the hash from another replica's report and notes it for the
    node that missed it, whichever report comes first, so the next rebuild has it everywhere."""
    for with_hash_first in (True, False):
        svc = make_service(FakeClock(), epoch=EPOCH + 60_000, rebuild_grace_s=0)
        svc.mount_segment("n1", 2, [segment_info(1, 1 << 26)], report_follows=True)
        svc.mount_segment("n2", 2, [segment_info(2, 1 << 26)], report_follows=True)
        told, missed = Entry("page", 10, 0, 4096), Entry("page", 11, 0, 4096)
        told.engine_hash = HASH  # type: ignore[attr-defined]
        first, second = (("n1", 1, told), ("n2", 2, missed)) if with_hash_first else (
            ("n2", 2, missed), ("n1", 1, told))
        for node, segment, entry in (first, second):
            assert svc.report_objects(node, 2, segment, [entry], last=True).accepted == 1
        page = svc.tenant("").objects["page"]
        assert page.engine_hash == HASH and len(page.replicas) == 2
        assert svc.heartbeat("n2", 2, 0).engine_hashes == [(2, 11, HASH)]
        assert svc.heartbeat("n1", 2, 0).engine_hashes == []  # it reported the hash itself
