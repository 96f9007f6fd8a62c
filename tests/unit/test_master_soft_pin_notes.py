"""The master's side of keeping soft pins across a rebuild: a PutEnd of a soft-pinned put
notes the pin and its lapse (wall clock ms) for each replica's node, and so does a repair copy
of one; the next heartbeat reply carries each note once. A rebuilt master soft-pins a reported
object again until that lapse: a lapsed pin comes back plain, a lapse beyond
MAX_SOFT_PIN_TTL_MS is cut to it. With real processes:
tests/faults/test_master_restart.py::test_a_soft_pin_outlives_a_master_kill."""

from __future__ import annotations

from typing import Any

import pytest
from test_master_repair import cluster, expire, run_repair
from test_master_support import EPOCH, Entry, FakeClock, make_service, mount, put, segment_info

from cellar.master.requests import MAX_SOFT_PIN_TTL_MS
from cellar.master.state.records import NO_PIN, SOFT_PIN, SOFT_PIN_NO_LAPSE_MS


def test_a_put_end_notes_the_soft_pin_and_its_lapse_once() -> None:
    clock = FakeClock()
    svc = make_service(clock)
    mount(svc, "n1", 1)
    put(svc, "ttl", 4096, soft_pin=True, soft_pin_ttl_ms=60_000)
    put(svc, "forever", 4096, soft_pin=True)
    put(svc, "plain", 4096)
    objects = svc.tenant("").objects
    assert svc.heartbeat("n1", 1, 0).soft_pins == [
        (1, objects["ttl"].replicas[0].alloc_id, clock.wall_ms() + 60_000),
        (1, objects["forever"].replicas[0].alloc_id, SOFT_PIN_NO_LAPSE_MS)]
    assert svc.heartbeat("n1", 1, 0).soft_pins == []  # sent once (best effort)


def test_a_repair_copy_of_a_soft_pinned_object_is_noted_for_its_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    svc = cluster(clock)
    put(svc, "pinned", 64 * 1024, replicas=2, soft_pin=True)
    noted: list[tuple[str, int, int]] = []
    note = svc.membership.note_soft_pin

    def record(segment: Any, alloc_id: int, until_ms: int) -> None:
        noted.append((segment.node.node_id, alloc_id, until_ms))
        note(segment, alloc_id, until_ms)

    monkeypatch.setattr(svc.membership, "note_soft_pin", record)
    victim = svc.tenant("").objects["pinned"].replicas[0].segment.node.node_id
    expire(svc, clock, victim)
    run_repair(svc, clock)
    ((node_id, alloc_id, until_ms),) = noted  # the copy's node, nobody else
    copy = next(r for r in svc.tenant("").objects["pinned"].replicas if r.alloc_id == alloc_id)
    assert copy.segment.node.node_id == node_id != victim and until_ms == SOFT_PIN_NO_LAPSE_MS


def test_a_rebuild_pins_a_reported_object_again_until_its_lapse() -> None:
    clock = FakeClock()
    svc = make_service(clock, epoch=EPOCH + 60_000, rebuild_grace_s=0,
                       node_suspect_after_s=1e7, node_expire_after_s=2e7)  # no heartbeats here
    svc.mount_segment("n1", 2, [segment_info(1, 1 << 26)], report_follows=True)
    now_ms = clock.wall_ms()
    svc.report_objects("n1", 2, 1, [
        Entry("ttl", 10, 0, 4096, soft_pin_until_ms=now_ms + 30_000),
        Entry("forever", 11, 4096, 4096, soft_pin_until_ms=SOFT_PIN_NO_LAPSE_MS),
        Entry("lapsed", 12, 8192, 4096, soft_pin_until_ms=now_ms - 1),
        Entry("plain", 13, 12288, 4096),
        Entry("far", 14, 16384, 4096, soft_pin_until_ms=now_ms + 10 * MAX_SOFT_PIN_TTL_MS),
    ], last=True)
    objects = svc.tenant("").objects

    def pinned() -> set[str]:
        assert all(o.pin_kind in (NO_PIN, SOFT_PIN) for o in objects.values())
        return {key for key, o in objects.items() if o.pin_kind == SOFT_PIN}

    assert pinned() == {"ttl", "forever", "far"}
    clock.advance(31)
    svc.tick()
    assert pinned() == {"forever", "far"}  # the reported lapse, by this master's clock
    clock.advance(MAX_SOFT_PIN_TTL_MS / 1000)
    svc.tick()
    assert pinned() == {"forever"}  # a lapse past the longest TTL a put may ask is cut to it
    svc.check_invariants()
