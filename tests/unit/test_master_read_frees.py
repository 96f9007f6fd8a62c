"""Which writes must CLAIM their range first (master/state/read_frees.py, `Replica.claim`).

A range freed while a read grant for its object may live (read within `pin_ttl_s`) is
remembered until the node acknowledges the freed notice; a write grant with the COMMIT right
(a shm/rdma writer) that overlaps it is flagged. A tcp writer's grant, a range never read, an
acknowledged notice and an expired grant are not. The real-process check is
tests/security/test_identity_grants.py (a stale read after a shm write: refused)."""

from __future__ import annotations

from test_master_support import (
    FakeClock,
    MiB,
    PutItem,
    get,
    make_service,
    mount,
    put,
    segment_info,
)

from cellar.errors import Status
from cellar.master.state.read_frees import RecentReadFrees


def _reused(svc, clock, *, read: bool, may_commit: bool = True):  # type: ignore[no-untyped-def]
    """Put "a", maybe read it (and unpin), remove it; the PutStart of "b" that takes its range."""
    put(svc, "a", MiB)
    if read:
        svc.unpin("", "reader", [get(svc, "a").pin_id])
    old = svc.tenant("").objects["a"].replicas[0]
    assert svc.remove("", ["a"]) == [(Status.OK, "")]
    clock.advance(0.1)
    started = svc.put_start("", "writer", [_item("b")], may_commit=may_commit).results[0]
    assert started.status == Status.OK
    (rep,) = started.replicas
    assert (rep.segment_id, rep.offset) == (old.segment.segment_id, old.offset), "not reused"
    return rep


def _item(key: str) -> PutItem:
    return PutItem(key, MiB)


def test_a_shm_write_over_a_range_read_moments_ago_is_flagged_until_the_node_acks() -> None:
    clock = FakeClock()
    svc = make_service(clock)
    mount(svc, "n1", 1, 8 * MiB)
    assert _reused(svc, clock, read=True).claim
    node = svc.membership.nodes["n1"]
    seg = node.segments[1]
    assert seg.read_frees is not None and len(seg.read_frees) == 1
    # the node's heartbeat acknowledges every notice sent so far: nothing left to claim
    sent = node.outbox[-1][0]
    svc.heartbeat("n1", 1, sent)
    assert seg.read_frees is None
    clock.advance(0.1)
    again = svc.put_start("", "writer", [_item("c")], may_commit=True).results[0]
    assert again.status == Status.OK and not again.replicas[0].claim


def test_no_claim_for_a_range_never_read_a_tcp_writer_or_an_expired_grant() -> None:
    clock = FakeClock()
    svc = make_service(clock)
    mount(svc, "n1", 1, 8 * MiB)
    assert not _reused(svc, clock, read=False).claim  # never read: no old read grant
    clock2 = FakeClock()
    svc2 = make_service(clock2)
    mount(svc2, "n1", 1, 8 * MiB)
    assert not _reused(svc2, clock2, read=True, may_commit=False).claim  # tcp: first frame
    clock3 = FakeClock()
    svc3 = make_service(clock3, pin_ttl_s=1.0, grant_skew_s=0.5)
    mount(svc3, "n1", 1, 8 * MiB)
    put(svc3, "a", MiB)
    svc3.unpin("", "reader", [get(svc3, "a").pin_id])
    svc3.remove("", ["a"])
    clock3.advance(1.6)  # the read grant expired (plus the skew margin)
    started = svc3.put_start("", "writer", [_item("b")], may_commit=True).results[0]
    assert not started.replicas[0].claim


def test_recent_read_frees_overlap_and_prune() -> None:
    frees = RecentReadFrees()
    frees.add(1000, 100, seq=5, until=10.0)
    frees.add(0, 50, seq=6, until=10.0)
    frees.add(4000, 3000, seq=7, until=20.0)
    assert frees.overlaps(1099, 10, acked_seq=0, now=0.0)
    assert not frees.overlaps(1100, 10, acked_seq=0, now=0.0)  # ends where it starts
    assert not frees.overlaps(50, 950, acked_seq=0, now=0.0)   # the gap between two
    assert frees.overlaps(6999, 1, acked_seq=0, now=0.0)       # inside the long one
    assert not frees.overlaps(1000, 100, acked_seq=5, now=0.0)  # acknowledged
    assert not frees.overlaps(1000, 100, acked_seq=0, now=10.0)  # grants expired
    frees.prune(acked_seq=6, now=0.0)
    assert len(frees) == 1 and frees.overlaps(5000, 1, acked_seq=6, now=0.0)
    frees.prune(acked_seq=6, now=20.0)
    assert len(frees) == 0


def test_a_notice_dropped_unsent_keeps_its_range_flagged_until_the_grants_expire() -> None:
    """The outbox overflowed: the node never gets that notice, so acknowledging later ones
    does not make the range safe; only the grants' expiry does."""
    frees = RecentReadFrees()
    frees.add(0, 100, seq=3, until=10.0)
    frees.add(500, 100, seq=9, until=10.0)
    frees.prune(acked_seq=20, now=1.0, unsent_through=3)
    assert len(frees) == 1
    assert frees.overlaps(0, 10, acked_seq=20, now=1.0, unsent_through=3)
    assert not frees.overlaps(500, 10, acked_seq=20, now=1.0, unsent_through=3)
    frees.prune(acked_seq=20, now=10.0, unsent_through=3)
    assert len(frees) == 0


def test_a_node_process_mounting_again_has_shm_writes_claim_until_its_old_grants_expired() -> None:
    """A node that mounted before (its mount names a previous epoch: a master restart, or this
    master expired it) may still move bytes for transfers admitted under the earlier mount;
    this master knows nothing of them, so every shm/rdma write there claims first (the node
    refuses a claim over such a range ST_BUSY) until their grants have expired. A fresh node
    process, and tcp writers, claim nothing."""
    clock = FakeClock()
    svc = make_service(clock, write_grant_ttl_s=10.0, pin_ttl_s=4.0, grant_skew_s=0.5)
    mount(svc, "n1", 1, 8 * MiB)  # a fresh process: previous_epoch 0
    first = svc.put_start("", "writer", [_item("a")], may_commit=True).results[0]
    assert first.status == Status.OK and not first.replicas[0].claim
    outcome = svc.mount_segment("n1", 1, [segment_info(1, 8 * MiB)], previous_epoch=svc.epoch)
    assert outcome.results == [(Status.OK, "")], outcome.results
    for key, may_commit, want in (("b", True, True), ("c", False, False)):
        started = svc.put_start("", "writer", [_item(key)], may_commit=may_commit).results[0]
        assert started.status == Status.OK and started.replicas[0].claim is want, key
    clock.advance(10.4)  # the longest grant (10 s) and the skew (0.5 s) not yet over
    assert svc.put_start("", "writer", [_item("d")], may_commit=True).results[0].replicas[0].claim
    clock.advance(0.2)
    svc.heartbeat("n1", 1, 0)
    assert svc.membership.nodes["n1"].claim_until == 0.0
    assert not svc.put_start("", "writer", [_item("e")],
                             may_commit=True).results[0].replicas[0].claim
