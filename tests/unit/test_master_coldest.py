"""coldest_first (master/state/coldest.py): the order demotion and disk eviction take.

Up to EXACT_SCAN_OBJECTS objects the order is exact; above it each object handed out is the
coldest of `samples` random picks. What a wrong version would do: scan the whole segment for
every round (the work counted here grows with the segment, not with the moves), hand out an
object twice, one that is pinned or moving or already gone, or a hot object while cold ones
abound. Then the disk tier itself (master/state/tiers.py) over a DRAM segment past the exact
bound: one tick demotes the cold, never the hot set.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_master_support import FakeClock, get, put

from cellar.errors import Status
from cellar.master.state.coldest import (
    EMPTY_ROUNDS_TO_STOP,
    EXACT_SCAN_OBJECTS,
    LIST_REUSE_ROUNDS,
    ColdPicker,
    coldest_first,
)

SAMPLES = 16


@dataclass(eq=False)
class Item:
    age: float
    ok: bool = True
    seen: list[int] = field(default_factory=lambda: [0])


def _counted_key(calls: list[int]) -> Any:
    def key(item: Item) -> float:
        calls[0] += 1
        return item.age
    return key


def _eligible(item: Item) -> bool:
    return item.ok


def test_a_small_segment_gets_the_exact_order() -> None:
    items = {Item(age=random.Random(1).random() + i) for i in range(100)}
    taken = list(coldest_first(items, 10, lambda i: i.age, _eligible, random.Random(0), SAMPLES))
    assert taken == sorted(items, key=lambda i: i.age)[:10]


def test_a_large_segment_costs_samples_per_object_not_a_scan() -> None:
    items = {Item(age=float(i)) for i in range(50 * EXACT_SCAN_OBJECTS)}
    calls = [0]
    taken = list(coldest_first(items, 256, _counted_key(calls), _eligible, random.Random(0),
                               SAMPLES))
    assert len(taken) == 256 and len(set(taken)) == 256
    assert calls[0] <= 256 * SAMPLES, calls[0]  # a partial sort would key all 204,800
    # approximate but cold: the coldest of 16 picks lies in the coldest ~6% on average
    ranks = sorted(item.age for item in taken)
    assert ranks[len(ranks) // 2] < 0.1 * len(items), ranks[len(ranks) // 2]


def test_the_hot_set_is_never_handed_out_while_cold_objects_abound() -> None:
    cold = [Item(age=float(i)) for i in range(20_000)]
    hot = [Item(age=1e9 + i) for i in range(32)]
    items = set(cold) | set(hot)
    taken = set(coldest_first(items, 4000, lambda i: i.age, _eligible, random.Random(3),
                              SAMPLES))
    assert len(taken) == 4000
    assert not taken & set(hot)


def test_ineligible_and_departed_objects_are_skipped_and_an_empty_segment_ends() -> None:
    items = {Item(age=float(i), ok=i % 2 == 0) for i in range(2 * EXACT_SCAN_OBJECTS)}
    rng = random.Random(5)
    handed = []
    for item in coldest_first(items, 100, lambda i: i.age, _eligible, rng, SAMPLES):
        handed.append(item)
        items.discard(item)  # as a disk eviction drops what it was handed
        gone = next(i for i in items if i.ok)  # and something else leaves meanwhile
        items.discard(gone)
    assert len(handed) == 100 and all(item.ok for item in handed)
    assert len(set(handed)) == 100
    nothing = {Item(age=float(i), ok=False) for i in range(2 * EXACT_SCAN_OBJECTS)}
    calls = [0]
    assert list(coldest_first(nothing, 100, _counted_key(calls), _eligible, rng, SAMPLES)) == []
    assert calls[0] == 0  # none eligible: keyed nothing, and stopped
    assert EMPTY_ROUNDS_TO_STOP * SAMPLES < 100 * SAMPLES  # it stops long before the limit


def test_the_picker_keeps_a_segments_list_for_its_rounds_and_forgets_an_unused_one() -> None:
    items = {Item(age=float(i)) for i in range(2 * EXACT_SCAN_OBJECTS)}
    picker = ColdPicker(random.Random(7), SAMPLES)

    def everything() -> set[Item]:  # as many as the picks find: the newcomer if it is listed
        return set(picker.pick(items, len(items), lambda i: i.age, _eligible))

    assert len(everything()) > EXACT_SCAN_OBJECTS
    newcomer = Item(age=-1.0)  # the coldest of all, put after the list was made
    items.add(newcomer)
    for _ in range(LIST_REUSE_ROUNDS - 1):  # the kept list does not hold it
        assert newcomer not in everything()
        picker.end_tick()
    assert newcomer in everything()  # its rounds are over: a new list
    late = Item(age=-2.0)
    items.add(late)
    picker.end_tick()  # the round above used the list: kept
    assert late not in everything()
    picker.end_tick()
    picker.end_tick()  # a tick without a round on this segment: its list is forgotten
    assert late in everything()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_the_tier_demotes_cold_objects_of_a_large_segment_never_the_hot_set(  # type: ignore[no-untyped-def]
        clock, monkeypatch) -> None:
    from test_master_tiers import _moving_keys, _service

    from cellar.master.state import tiers

    keyed = [0]
    lru2 = tiers._lru2

    def counted_lru2(obj: Any) -> Any:
        keyed[0] += 1
        return lru2(obj)

    monkeypatch.setattr(tiers, "_lru2", counted_lru2)

    svc = _service(clock)
    size = 2048  # 16 MiB of DRAM: 7,000 objects fill it to 0.875 (above 0.80)
    keys = [f"k{i:05d}" for i in range(7000)]
    for key in keys:
        put(svc, key, size)
        clock.advance(0.01)
    assert len(svc.membership.nodes["n1"].segments[1].objects) > EXACT_SCAN_OBJECTS
    hot = keys[:32]  # the oldest puts, read twice since: the hot set by LRU-2
    for _ in range(2):
        for key in hot:
            got = get(svc, key)
            assert got.status == Status.OK
            svc.unpin("", "reader", [got.pin_id])
        clock.advance(1)
    keyed[0] = 0
    svc.tick()
    moving = _moving_keys(svc)
    assert keyed[0] <= len(moving) * SAMPLES, keyed[0]  # not all 7,000 (a partial sort)
    assert len(moving) == svc.tiers.settings.max_moves_per_tick
    assert not moving & set(hot)
    ranks = sorted(keys.index(key) for key in moving)
    assert ranks[len(ranks) // 2] < len(keys) // 5, ranks[len(ranks) // 2]  # the cold end
