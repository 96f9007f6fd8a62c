"""Ahead drops: the versions an outstanding put-ahead allocation must not be bound behind.

Why
    A put-ahead allocation (master/put_ahead.py) takes its alloc id when it is granted, before
    its key is known, and is bound to a key at PutEnd only if it is newer than every version
    of the key, since a rebuild from the nodes keeps a key's newest allocation. The key's
    current version and its removal bound (state/tombstones.py) say that while they exist. A
    version the master dropped on its own (evicted, or lost with its node) leaves no trace:
    the key is absent, yet the node may come back with that version's bytes, or a new master
    may rebuild before the node applied its freed notice, and the rebuild then prefers that
    version, newer than the acknowledged put bound to the older allocation: an older value
    back (found by review on 2026-12-06).

What it owns
    - the put-ahead allocations outstanding (granted, not yet bound or dropped), put id ->
      first alloc id, in grant order, which is alloc id order: the oldest is the first;
    - per (tenant, key), the newest alloc id of a version dropped while an outstanding
      allocation was older than it (`dropped`). A bind of an allocation at or below it is
      refused (EXPIRED: the client puts the key again through PutStart).

Bounds (the invariant: every entry is above the oldest outstanding allocation)
    An entry matters only to allocations older than it, and every allocation granted later is
    newer, so it is forgotten as soon as the oldest outstanding allocation is newer: when an
    allocation ends (bound, refused, handed back, revoked at its writer timeout: a put-ahead
    allocation lives at most `write_grant_ttl_s`) and before each new entry. What is kept is
    the versions dropped within a grant's life of their put. And at most `max_keys` entries
    (config `max_put_ahead_dropped_keys`): beyond it the lowest is forgotten into `floor`,
    which refuses every bind at or below it, of any key: fail safe, a put again through
    PutStart rather than an older value back.

Cost: a drop reads the oldest outstanding allocation, O(1), and does nothing more when none
is outstanding or every one is newer than the version (an LRU victim is old); an entry costs
O(log n) once in and once out. It never drops objects, does no I/O and never touches payload
bytes.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Mapping

from cellar.master.state.records import Obj


class AheadDrops:
    """Outstanding put-ahead allocations and the versions dropped behind them."""

    def __init__(self, max_keys: int) -> None:
        assert max_keys >= 0
        self.max_keys = max_keys
        self.outstanding: OrderedDict[int, int] = OrderedDict()  # put id -> first alloc id
        self.dropped: dict[tuple[str, str], int] = {}  # (tenant, key) -> newest dropped alloc id
        # (alloc id, tenant, key) of every entry, lowest first, and of entries since raised
        # (stale: `dropped` holds a larger id); at least as long as `dropped`, at most max_keys
        self._lowest: list[tuple[int, str, str]] = []
        self.floor = 0  # binds at or below it are refused, any key (entries forgotten)
        self.forgotten = 0  # entries forgotten into the floor

    def granted(self, put_id: int, first_alloc_id: int) -> None:
        """A put-ahead allocation from `first_alloc_id` on is outstanding."""
        outstanding = self.outstanding
        assert not outstanding or next(reversed(outstanding.values())) < first_alloc_id, \
            "put-ahead allocations are granted in alloc id order"
        outstanding[put_id] = first_alloc_id

    def ended(self, put_id: int) -> None:
        """The allocation is bound or dropped: what only it could be refused for is forgotten."""
        if self.outstanding.pop(put_id, None) is not None:
            self._prune()

    def __len__(self) -> int:
        """Entries held, stale ones included: the memory this costs."""
        return len(self._lowest)

    def oldest(self) -> int:
        """The first alloc id of the oldest outstanding allocation (0: none)."""
        for first in self.outstanding.values():
            return first
        return 0

    def dropped_version(self, tenant_name: str, key: str, newest_alloc_id: int) -> None:
        """A version of the key whose newest range is `newest_alloc_id` left the table without
        a client's remove or upsert: remembered if an outstanding allocation is older."""
        oldest = self.oldest()
        if not oldest or newest_alloc_id < oldest or newest_alloc_id <= self.floor:
            return  # every outstanding allocation is newer, or the floor refuses them already
        self._prune()
        name = (tenant_name, key)
        if self.dropped.get(name, 0) >= newest_alloc_id:
            return
        self.dropped[name] = newest_alloc_id
        lowest = self._lowest
        heapq.heappush(lowest, (newest_alloc_id, tenant_name, key))
        while len(lowest) > self.max_keys:
            alloc_id, tenant, dropped_key = heapq.heappop(lowest)
            if self.dropped.get((tenant, dropped_key)) == alloc_id:
                del self.dropped[(tenant, dropped_key)]
                self.floor = max(self.floor, alloc_id)
                self.forgotten += 1

    def refused_at_or_below(self, tenant_name: str, key: str) -> int:
        """Allocations at or below this id must not be bound to the key (0: none refused)."""
        return max(self.dropped.get((tenant_name, key), 0), self.floor)

    def check_invariants(self, puts: Mapping[int, Obj]) -> None:
        """O(n), for tests and the audit: every outstanding allocation is a put in flight (one
        that ended and was not told would pin entries forever), in alloc id order; every entry
        is above the oldest of them and in the heap, which holds at most `max_keys`."""
        ids = list(self.outstanding.values())
        assert ids == sorted(ids), "outstanding put-ahead allocations out of alloc id order"
        for put_id, first in self.outstanding.items():
            obj = puts.get(put_id)
            assert obj is not None and obj.version == first, \
                f"put-ahead allocation {put_id} ended without being told"
        oldest = self.oldest()
        assert len(self._lowest) <= self.max_keys and len(self.dropped) <= len(self._lowest)
        heap = set(self._lowest)
        for (tenant, key), alloc_id in self.dropped.items():
            assert oldest and alloc_id > oldest, f"dropped version of {key!r} outlived its use"
            assert (alloc_id, tenant, key) in heap, f"dropped version of {key!r} not in the heap"
        assert not self.floor or 0 < oldest < self.floor, "a floor no allocation is under"

    def _prune(self) -> None:
        """Forget every entry (and the floor) no outstanding allocation is older than."""
        oldest = self.oldest()
        if not oldest:
            self.dropped.clear()
            self._lowest.clear()
            self.floor = 0
            return
        lowest, dropped = self._lowest, self.dropped
        while lowest and lowest[0][0] < oldest:
            alloc_id, tenant, key = heapq.heappop(lowest)
            if dropped.get((tenant, key)) == alloc_id:
                del dropped[(tenant, key)]
        if self.floor < oldest:
            self.floor = 0
