"""Eviction: LRU order by last access, pins skipped, soft pins second, hard pins never."""

from __future__ import annotations

import random

import pytest
from test_master_support import FakeClock, MiB, get, make_service, mount, put, put_start

from cellar.errors import Status
from cellar.master.service import PutItem
from cellar.master.state.eviction import Evictor

LONG_LIVED = {"node_suspect_after_s": 1000, "node_expire_after_s": 2000}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def full_service(clock: FakeClock, **settings):  # type: ignore[no-untyped-def]
    """One 8 MiB segment holding eight 1 MiB objects k0..k7, put one second apart."""
    svc = make_service(clock, **LONG_LIVED, **settings)
    mount(svc, "n1", 1, size=8 * MiB)
    for i in range(8):
        put(svc, f"k{i}", MiB)
        clock.advance(1)
    return svc


def keys(svc) -> set[str]:  # type: ignore[no-untyped-def]
    return set(svc.tenant("").objects)


def test_put_start_evicts_least_recently_used(clock) -> None:  # type: ignore[no-untyped-def]
    svc = full_service(clock)
    get(svc, "k0")  # k0 is now the most recently used; k1 the least
    svc.unpin("", "reader", list(svc.pins.pins))
    assert put_start(svc, "new", MiB).status == Status.OK
    assert keys(svc) == {f"k{i}" for i in range(8)} - {"k1"}
    assert put_start(svc, "new2", MiB).status == Status.OK
    assert "k2" not in keys(svc) and "k0" in keys(svc)
    assert svc.evictor.evicted_keys == 2 and svc.evictor.evicted_bytes == 2 * MiB


def test_read_pinned_objects_are_skipped(clock) -> None:  # type: ignore[no-untyped-def]
    svc = full_service(clock)
    pinned = get(svc, "k0")
    clock.advance(1)
    # make k0 the oldest again by touching everything else after it
    for i in range(1, 8):
        svc.unpin("", "reader", [get(svc, f"k{i}").pin_id])
    svc.tenant("").objects["k0"].last_access = 0.0
    assert put_start(svc, "new", MiB).status == Status.OK
    assert "k0" in keys(svc) and "k1" not in keys(svc)
    svc.unpin("", "reader", [pinned.pin_id])


def test_soft_pinned_only_in_second_pass_hard_pinned_never(clock) -> None:  # type: ignore[no-untyped-def]
    # the default tenant may hard-pin, and hold the whole (4 MiB) store WRITING
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=4 * MiB)
    put(svc, "hard", MiB, hard_pin=True)
    clock.advance(1)
    put(svc, "soft", MiB, soft_pin=True)
    clock.advance(1)
    put(svc, "plain1", MiB)
    clock.advance(1)
    put(svc, "plain2", MiB)
    order = []
    for i in range(3):
        assert put_start(svc, f"new{i}", MiB, hard_pin=True).status == Status.OK
        order.append(sorted({"hard", "soft", "plain1", "plain2"} - keys(svc)))
    assert order == [["plain1"], ["plain1", "plain2"], ["plain1", "plain2", "soft"]]
    refused = put_start(svc, "one-more", MiB)
    assert refused.status == Status.NO_SPACE and "nothing evictable" in refused.message
    assert "hard" in keys(svc)


def test_no_space_when_everything_is_pinned(clock) -> None:  # type: ignore[no-untyped-def]
    svc = full_service(clock)
    pins = [get(svc, f"k{i}").pin_id for i in range(8)]
    assert put_start(svc, "new", MiB).status == Status.NO_SPACE
    svc.unpin("", "reader", pins[:1])
    assert put_start(svc, "new", MiB).status == Status.OK
    assert "k0" not in keys(svc)


def test_eviction_per_put_is_bounded(clock) -> None:  # type: ignore[no-untyped-def]
    svc = make_service(clock, max_evictions_per_put=3, **LONG_LIVED)
    mount(svc, "n1", 1, size=8 * MiB)
    for i in range(8):
        put(svc, f"k{i}", MiB)
        clock.advance(1)
    # 4 MiB needs four 1 MiB objects gone (and contiguous): more than the bound allows
    assert put_start(svc, "big", 4 * MiB).status == Status.NO_SPACE
    assert len(keys(svc)) == 5


def test_no_eviction_when_the_put_lacks_nodes_not_bytes(clock) -> None:  # type: ignore[no-untyped-def]
    # Eviction frees bytes, never nodes: 2 replicas with one placeable node, or with every
    # other node avoided, cannot be placed however much is evicted (make soak-ha: a new
    # leader with one node mounted emptied it 64 objects a put).
    svc = full_service(clock)
    space, now = svc.space, clock.monotonic()
    assert space.evict_for_space(MiB, 2, (), "", now, MiB) is None
    mount(svc, "n2", 2, size=MiB)  # a second node, empty
    assert space.evict_for_space(2 * MiB, 1, ("n1", "n2"), "", now, 2 * MiB) is None
    assert svc.evictor.evicted_keys == 0 and keys(svc) == {f"k{i}" for i in range(8)}
    assert space.evict_for_space(MiB, 2, (), "", now, MiB) is not None  # n2 + room on n1
    assert svc.evictor.evicted_keys >= 1


def test_put_start_evicts_only_where_the_put_can_go(clock) -> None:  # type: ignore[no-untyped-def]
    # The least recently used objects live on n2, which is being drained: evicting them frees
    # nothing a put may take. The put evicts n1's oldest instead, and only it.
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n2", 2, size=4 * MiB)
    for i in range(4):
        put(svc, f"old{i}", MiB)
        clock.advance(1)
    mount(svc, "n1", 1, size=8 * MiB)
    for i in range(8):
        put(svc, f"k{i}", MiB)
        clock.advance(1)
    assert {r.segment.node.node_id for i in range(4)
            for r in svc.tenant("").objects[f"old{i}"].replicas} == {"n2"}
    svc.repair.drain("n2")
    assert put_start(svc, "new", MiB).status == Status.OK
    assert keys(svc) == {f"old{i}" for i in range(4)} | {f"k{i}" for i in range(1, 8)}
    assert svc.evictor.evicted_keys == 1
    # n1 holds soft-pinned objects only now, n2 normal ones: no soft-pinned object goes while
    # normal ones are left, even if none of them can help (the put is NO_SPACE instead)
    svc.remove("", [f"k{i}" for i in range(1, 8)])
    svc.unpin("", "writer", list(svc.pins.pins))
    for i in range(7):
        put(svc, f"soft{i}", MiB, soft_pin=True)
    assert put_start(svc, "new2", 2 * MiB).status == Status.NO_SPACE
    assert {f"soft{i}" for i in range(7)} <= keys(svc)


def test_watermark_eviction_runs_in_tick(clock) -> None:  # type: ignore[no-untyped-def]
    svc = make_service(clock, eviction_samples=128, **LONG_LIVED)  # pool <= sample: exact LRU
    mount(svc, "n1", 1, size=100 * MiB)
    for i in range(89):
        put(svc, f"k{i:02}", MiB)
        clock.advance(0.01)
    svc.tick()
    assert len(keys(svc)) == 89  # 89% < high watermark
    put(svc, "k89", MiB)
    put(svc, "k90", MiB)  # 91% > 90%
    svc.tick()
    capacity, used = svc.capacity()
    assert used <= 0.85 * capacity
    assert len(keys(svc)) == 85
    assert keys(svc) == {f"k{i:02}" for i in range(6, 91)}  # the oldest six went


def test_watermark_eviction_is_bounded_per_tick(clock) -> None:  # type: ignore[no-untyped-def]
    svc = make_service(clock, max_evictions_per_tick=2, **LONG_LIVED)
    mount(svc, "n1", 1, size=100 * MiB)
    for i in range(95):
        put(svc, f"k{i:02}", MiB)
    svc.tick()
    assert len(keys(svc)) == 93
    for _ in range(5):
        svc.tick()
    assert len(keys(svc)) == 85  # keeps going across ticks down to the low watermark
    svc.tick()
    assert len(keys(svc)) == 85


def test_sampling_picks_old_objects_from_large_pools() -> None:
    class Fake:
        __slots__ = ("last_access", "pins", "gslot", "tslot", "pool_kind", "pin_kind", "tenant", "reserved", "replicas")

    evictor = Evictor(16, lambda obj: 0, random.Random(1))
    pool = evictor.pools[1]
    objs = []
    for i in range(10_000):
        obj = Fake()
        obj.last_access, obj.pins, obj.reserved, obj.replicas = float(i), 0, 64, ()
        pool.add(obj)  # type: ignore[arg-type]
        objs.append(obj)
    ranks = [evictor._sample(pool).last_access for _ in range(200)]  # type: ignore[union-attr]
    assert sum(ranks) / len(ranks) < 10_000 * 0.10  # on average from the oldest ~6%
    for obj in objs[:9_990]:
        obj.pins = 1
    pool.pinned = 9_990
    picked = evictor._sample(pool)
    assert picked is not None and picked.pins == 0
    # With a filter: only accepted victims, and no scan of the pool for a rare one (None).
    for obj in objs:
        obj.pins = 0
    pool.pinned = 0
    even = [evictor._sample(pool, lambda o: int(o.last_access) % 2 == 0) for _ in range(50)]
    assert all(p is not None and int(p.last_access) % 2 == 0 for p in even)
    assert evictor._sample(pool, lambda o: o is objs[1234]) is None


def test_get_refreshes_lru_order_between_tenants_too(clock) -> None:  # type: ignore[no-untyped-def]
    svc = make_service(clock, tenants={"a": {}, "b": {}}, **LONG_LIVED)
    mount(svc, "n1", 1, size=4 * MiB)
    put(svc, "x", MiB, tenant="a")
    clock.advance(1)
    put(svc, "y", MiB, tenant="b")
    clock.advance(1)
    put(svc, "z", MiB, tenant="a")
    clock.advance(1)
    svc.unpin("a", "reader", [get(svc, "x", tenant="a").pin_id])
    put(svc, "w", MiB, tenant="b")
    assert svc.put_start("b", "w", [PutItem("v", MiB)]).results[0].status == Status.OK
    assert set(svc.tenant("a").objects) == {"x", "z"}
    assert set(svc.tenant("b").objects) == {"w"}
