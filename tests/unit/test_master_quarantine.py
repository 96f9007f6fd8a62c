"""Quarantine: a revoked or timed-out put's range is not reused before its write grant expires."""

from __future__ import annotations

from test_master_support import FakeClock, MiB, get, make_service, mount, put, put_start

from cellar.errors import Status
from cellar.master.service import PutRef

LONG_LIVED = {"node_suspect_after_s": 1000, "node_expire_after_s": 2000}


def one_slot_service():  # type: ignore[no-untyped-def]
    """A segment with room for exactly one 1 MiB object."""
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=MiB)
    return svc, clock


def test_revoked_range_is_not_reallocated_before_grant_expiry() -> None:
    svc, clock = one_slot_service()
    started = put_start(svc, "a", MiB)
    offset = started.replicas[0].offset
    grant_expiry_ms = started.replicas[0].expiry_ms
    clock.advance(5)
    svc.put_revoke("", "w", [PutRef("a", started.put_id)])
    assert svc.quarantine.held_bytes == MiB
    assert svc.tenant("").used_bytes == 0  # not charged to the tenant
    assert svc.capacity()[1] == MiB  # but still used for the watermark
    assert put_start(svc, "b", MiB).status == Status.NO_SPACE
    clock.advance(svc.config.write_grant_ttl_s - 5)  # grant expiry reached, skew not yet
    svc.tick()
    assert clock.wall_ms() == grant_expiry_ms
    assert put_start(svc, "b", MiB).status == Status.NO_SPACE
    clock.advance(svc.config.grant_skew_s)
    svc.tick()
    assert svc.quarantine.held_bytes == 0
    reused = put_start(svc, "b", MiB)
    assert reused.status == Status.OK and reused.replicas[0].offset == offset


def test_timed_out_range_waits_for_the_skew_margin() -> None:
    svc, clock = one_slot_service()
    put_start(svc, "a", MiB)
    clock.advance(svc.config.write_grant_ttl_s)
    svc.tick()
    assert not svc.objects.puts and svc.quarantine.held_bytes == MiB
    assert put_start(svc, "b", MiB).status == Status.NO_SPACE
    clock.advance(svc.config.grant_skew_s)
    svc.tick()
    assert put_start(svc, "b", MiB).status == Status.OK


def test_complete_objects_range_is_reusable_immediately() -> None:
    svc, clock = one_slot_service()
    put(svc, "a", MiB)
    svc.remove("", ["a"])
    assert svc.quarantine.held_bytes == 0
    assert put_start(svc, "b", MiB).status == Status.OK


def test_evicted_complete_range_is_reused_in_the_same_put() -> None:
    svc, clock = one_slot_service()
    put(svc, "a", MiB)
    assert put_start(svc, "b", MiB).status == Status.OK
    assert svc.evictor.evicted_keys == 1


def test_upsert_replaced_version_is_freed_immediately_after_unpin() -> None:
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=2 * MiB)
    put(svc, "k", MiB)
    pin = get(svc, "k").pin_id
    put(svc, "k", MiB, upsert=True)
    assert svc.capacity()[1] == 2 * MiB
    svc.unpin("", "reader", [pin])
    assert svc.capacity()[1] == MiB and svc.quarantine.held_bytes == 0


def test_quarantine_of_an_expired_node_is_discarded() -> None:
    clock = FakeClock()
    svc = make_service(clock)
    mount(svc, "n1", 1, size=MiB)
    started = put_start(svc, "a", MiB)
    svc.put_revoke("", "w", [PutRef("a", started.put_id)])
    assert svc.quarantine.held_bytes == MiB
    clock.advance(11)
    svc.tick()  # the node expired: its segment (and quarantined range) are gone
    assert svc.quarantine.held_bytes == 0 and len(svc.quarantine) == 0
    clock.advance(60)
    svc.tick()  # releasing nothing into a forgotten allocator
