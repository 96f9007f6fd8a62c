"""coldest_first: a segment's objects in the order the disk tier moves or drops them.

Why
    Demotion and disk eviction (state/tiers.py) run every tick while a node's DRAM or disk is
    above its watermark, which under steady writes is most ticks. They used to take the
    coldest objects by a partial sort of the whole segment: O(objects) per tick. In Python that
    is 35 ms at 10^5 objects and 290 ms at 10^6 (heapq.nsmallest of 256 by LRU-2, measured on
    the 2-core VM), every 100 ms tick, on the master's event loop: a 64 GiB disk of 64 KiB
    pages holds 10^6 objects. So above EXACT_SCAN_OBJECTS objects the order is approximate, as
    the evictor's (state/eviction.py, after Redis's evict.c): each object handed out is the
    coldest of `samples` random picks, O(samples) per object instead of O(objects) per round.
    (`tier_exact_scan_objects`, master/config.py, moves the bound; 0 samples every segment.)
    The picks come from a list of the segment's objects: copying the set into it costs ~10 ms
    at 2 x 10^5 objects, so `ColdPicker` keeps each segment's list for up to
    LIST_REUSE_ROUNDS rounds in a row. A kept list misses the objects that arrived since it
    was made, and those are the most recently put or moved: the last a round would take.

What it gives
    A generator, so a caller stops as soon as it has moved or dropped enough. Exact (a partial
    sort, as before) up to EXACT_SCAN_OBJECTS objects, which keeps small nodes and the tests on
    the exact order. Above it: never an object twice, never one `eligible` refuses or that
    left `objects` since the round began; it ends after EMPTY_ROUNDS_TO_STOP rounds of picks
    in a row found nothing eligible (a segment whose objects are nearly all pinned or moving:
    the next tick tries again).
What it never does: change an object or a segment.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterator
from typing import Any

from cellar.master.state.records import Obj

EXACT_SCAN_OBJECTS = 4096   # objects in a segment up to which the order is exact (default)
EMPTY_ROUNDS_TO_STOP = 4    # rounds of `samples` picks in a row with nothing eligible
LIST_REUSE_ROUNDS = 16      # rounds (ticks) one list of a segment's objects is picked from


def coldest_first(objects: Collection[Obj], limit: int, key: Callable[[Obj], Any],
                  eligible: Callable[[Obj], bool], rng: random.Random,
                  samples: int, pool: list[Obj] | None = None,
                  exact_up_to: int = EXACT_SCAN_OBJECTS) -> Iterator[Obj]:
    """At most `limit` of `objects` that `eligible` accepts, coldest by `key` first (exactly
    up to `exact_up_to` objects, else each the coldest of `samples` random picks from
    `pool`, a list of them made earlier, or from a new one)."""
    if limit <= 0:
        return
    if len(objects) <= exact_up_to:
        yield from heapq.nsmallest(limit, (o for o in objects if eligible(o)), key=key)
        return
    if pool is None:
        pool = list(objects)
    count = len(pool)
    pick = rng.random
    taken: set[Obj] = set()
    empty_rounds = 0
    while len(taken) < limit and empty_rounds < EMPTY_ROUNDS_TO_STOP:
        best: Obj | None = None
        best_key: Any = None
        for _ in range(samples):
            obj = pool[int(pick() * count)]
            if obj in taken or obj not in objects or not eligible(obj):
                continue
            obj_key = key(obj)
            if best is None or obj_key < best_key:
                best, best_key = obj, obj_key
        if best is None:
            empty_rounds += 1
            continue
        empty_rounds = 0
        taken.add(best)
        yield best


class ColdPicker:
    """`coldest_first` over a master's segments, each large segment's list of objects kept
    for LIST_REUSE_ROUNDS rounds, or until the segment has grown or shrunk by half (module
    docstring). `end_tick` forgets the lists no round used since the last call (a segment
    back under its watermark, or gone), so nothing keeps a gone segment's objects alive."""

    def __init__(self, rng: random.Random, samples: int,
                 exact_up_to: int = EXACT_SCAN_OBJECTS) -> None:
        self._rng = rng
        self._samples = samples
        self._exact_up_to = exact_up_to
        # id(objects) -> (that set, its list, rounds left, used since the last end_tick)
        self._lists: dict[int, tuple[Collection[Obj], list[Obj], int, bool]] = {}

    def pick(self, objects: Collection[Obj], limit: int, key: Callable[[Obj], Any],
             eligible: Callable[[Obj], bool]) -> Iterator[Obj]:
        pool = None
        if len(objects) > self._exact_up_to:
            kept = self._lists.get(id(objects))
            if kept is not None and kept[0] is objects and kept[2] > 0 and (
                    len(kept[1]) // 2 <= len(objects) <= 2 * len(kept[1])):
                pool, rounds = kept[1], kept[2]
            else:
                pool, rounds = list(objects), LIST_REUSE_ROUNDS
            self._lists[id(objects)] = (objects, pool, rounds - 1, True)
        return coldest_first(objects, limit, key, eligible, self._rng, self._samples, pool,
                             self._exact_up_to)

    def end_tick(self) -> None:
        self._lists = {ident: (objects, pool, rounds, False)
                       for ident, (objects, pool, rounds, used) in self._lists.items() if used}
