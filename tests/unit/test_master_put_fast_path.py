"""`MasterService.put_start` runs the common case of a key inline (its fast path) and every
other case through `_put_one`. Both must give exactly the same outcome: same statuses and
messages, ids, placements, grants, and the same state left behind. Checked by running the same
batches through put_start on one service and through `_put_one` alone on a twin."""

from __future__ import annotations

import random

from test_master_support import SECRET, FakeClock, make_service, mount

from cellar.master.service import MasterService, PutEndItem, PutItem, PutStartOutcome
from tests.support.receipts import receipts_for

KiB = 1024
MiB = 1024 * KiB


def twins(**settings) -> tuple[MasterService, MasterService]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(2):
        svc = make_service(FakeClock(), seed=7, **settings)
        mount(svc, "n1", 1, size=8 * MiB)
        mount(svc, "n2", 2, size=8 * MiB)
        mount(svc, "n3", 3, size=4 * MiB)
        out.append(svc)
    return out[0], out[1]


def slow_put_start(svc: MasterService, items: list[PutItem]) -> PutStartOutcome:
    """put_start with every key through _put_one (what the fast path must equal)."""
    tenant = svc.tenant("default")
    now, wall_ms = svc.clock.monotonic(), svc.clock.wall_ms()
    segments: dict = {}  # type: ignore[type-arg]
    results = [svc.put_starts._put_one(tenant, item, now, wall_ms, segments) for item in items]
    return PutStartOutcome(results, list(segments.values()))


def summary(outcome: PutStartOutcome) -> list[tuple]:  # type: ignore[type-arg]
    rows: list[tuple] = [tuple(s.segment_id for s in outcome.segments)]  # type: ignore[type-arg]
    for r in outcome.results:
        rows.append((r.status, r.message, bool(r.put_id),  # put ids are random: present or not
                     [(g.node_id, g.segment_id, g.offset, g.length, g.op, g.alloc_id, g.epoch,
                       g.expiry_ms, g.key_tag, g.mac) for g in r.replicas]))
    return rows


def state(svc: MasterService) -> tuple:  # type: ignore[type-arg]
    tenant = svc.tenant("default")
    return (sorted(tenant.writing), tenant.used_bytes, tenant.object_count, svc.no_space_count,
            sorted((o.tenant.name, o.key) for o in svc.objects.puts.values()),
            [(s.segment_id, s.allocator.used_bytes, len(s.objects))
             for s in svc.membership.segments.values()])


def test_fast_path_equals_put_one_on_mixed_batches() -> None:
    fast, slow = twins()
    rng = random.Random(3)
    sizes = [1, 64, 65, 4095, 200 * KiB, 256 * KiB - 1, 256 * KiB, MiB, 3 * MiB, 9 * MiB, 0, -5]
    for round_ in range(30):
        items = []
        for i in range(rng.randrange(1, 40)):
            key = rng.choice([f"k{round_}/{i}", f"k{round_ // 2}/{i}", "", "a\x00b", "é/x",
                              "x" * 2000, f"dup{i % 3}"])
            items.append(PutItem(
                key=key, size_bytes=rng.choice(sizes), replicas=rng.choice([0, 1, 1, 1, 2]),
                soft_pin=rng.random() < 0.1, hard_pin=rng.random() < 0.05,
                upsert=rng.random() < 0.2,
                avoid_node_ids=["n2"] if rng.random() < 0.1 else [],
                preferred_host_id="host-1" if rng.random() < 0.1 else ""))
        got = fast.put_start("default", "c", items)
        want = slow_put_start(slow, items)
        assert summary(got) == summary(want)
        assert state(fast) == state(slow)
        # finish some puts on both, so keys exist (ALREADY_EXISTS, upserts) and space runs out
        for svc, outcome in ((fast, got), (slow, want)):
            ends = [PutEndItem(item.key, r.put_id, 1, receipts_for(SECRET, r, 1))
                    for i, (item, r) in enumerate(zip(items, outcome.results, strict=True))
                    if r.status == 0 and i % 7]
            svc.put_end("default", "c", ends)


def test_fast_path_evicts_for_room_like_put_one() -> None:
    fast, slow = twins()
    for svc in (fast, slow):
        for n in range(3):  # fill every segment with complete (evictable) objects
            items = [PutItem(key=f"fill{n}/{i}", size_bytes=MiB) for i in range(8)]
            outcome = svc.put_start("default", "c", items)
            svc.put_end("default", "c", [PutEndItem(it.key, r.put_id, 1, receipts_for(SECRET, r, 1))
                                         for it, r in zip(items, outcome.results, strict=True)
                                         if r.status == 0])
    items = [PutItem(key=f"more/{i}", size_bytes=MiB) for i in range(6)]
    assert summary(fast.put_start("default", "c", items)) == summary(slow_put_start(slow, items))
    assert state(fast) == state(slow)
    assert fast.evictor.evicted_keys == slow.evictor.evicted_keys > 0


def test_fast_path_rounds_like_the_allocator() -> None:
    """The fast path inlines SegmentAllocator.rounded_size (its figure is beside the copy):
    at every boundary of the rule, the bytes it reserves are the allocator's."""
    from cellar.master.state.allocator import SegmentAllocator

    svc = make_service(FakeClock())
    mount(svc, "n1", 1, size=64 * MiB)
    sizes = [1, 63, 64, 65, 4095, 4096, 262143, 262144, 262145, 266240, 266241]
    outcome = svc.put_start("", "c", [PutItem(f"k{i}", size) for i, size in enumerate(sizes)])
    assert all(r.status == 0 for r in outcome.results)
    objects = sorted(svc.objects.puts.values(), key=lambda o: int(o.key[1:]))
    assert [o.reserved for o in objects] == [SegmentAllocator.rounded_size(s) for s in sizes]
