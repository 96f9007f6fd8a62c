"""Tombstones: what a late index report must not bring back.

Owns three memories of removal, all consulted by rebuild (master/node_rpcs.py):
- removed keys: (tenant, key) -> a bound: every allocation of that key with an id at or below
  it is dead. A Remove, RemovePrefix or RemoveAll sets it to the newest id issued when it ran
  (a put of the key still in flight included: its PutEnd answers OK and stores nothing, the
  put ordered just before the remove, master/removals.py); a remove of a key
  the master does not hold sets it too (a node that is away may still hold a value); an upsert
  sets it just below the new version's first allocation, so every older value is dead. A node
  that was away (or whose freed notice had not arrived) and still reports such a replica is
  refused. Bounded by `max_remove_tombstones` (oldest forgotten first; 0 keeps none);
- freed while down: node id -> alloc ids the master told a previous incarnation of that node to
  free, so a node restart does not undo a remove or an eviction;
- dead writes: alloc ids of versions dropped while WRITING (revoked, timed out, a put-ahead
  allocation refused at PutEnd or never bound). Such a version was never acknowledged, but a
  node may have sealed its bytes, and rebuild prefers the newest allocation of a key: without
  this, a put refused as AlreadyExists under a put-ahead grant (written before the master knew
  its key, master/put_ahead.py) or an upsert revoked midway would replace the acknowledged
  value after a master restart (`tests/integration/test_sdk_put_ahead.py`). A key bound cannot
  say it (the dead version is newer than the live one), so each is remembered by alloc id,
  bounded like the removed keys by `max_remove_tombstones`.

One memory of a right, kept with them since it must outlive the master the same way:
- hard pins: (tenant, key) -> the first alloc id of its hard-pinned version. A node's index does
  not know pins, so a rebuilt master adopted every object unpinned and a hard-pinned prefix
  (a system prompt) became evictable after a master restart. A PutEnd that completes a
  hard-pinned put queues its record (the reply waits for the log); rebuild adopts a version of
  the key whose allocation is at or above it hard-pinned. A removal or upsert of the key (a
  bound at or above the record) ends it. Bounded like the others.

Durability: a bound is worth something after a master kill only if the next master knows it.
Every new bound is also queued in `pending`; the serving room (master/serving/removal_log.py)
writes the queue to the removal log (a local file, or etcd under HA) before the reply that
acknowledges the remove or upsert goes out, and a new master `load`s the log before it
adopts any report. Invariant: a bound only grows (`raise_bound` keeps the larger).

It never drops objects or frees ranges itself, and does no I/O.
"""

from __future__ import annotations

from collections import OrderedDict

# (tenant, key, bound alloc id, by): `by` is the request tag (serving/request_memory.py) of
# the Remove that set the bound, '' for any other; it lets a new master answer that Remove's
# repeat as the first call was answered (OK) instead of NOT_FOUND after a failover. With `by`
# DEAD_WRITE the record is one dead write: only that alloc id of the key is dead. (A master
# from before dead writes reads it as a bound, which kills the key's older versions too: a
# cache miss, never an older value back.)
TombstoneRecord = tuple[str, str, int, str]
DEAD_WRITE = "\0dead-write"
# With `by` HARD_PIN_RECORD the record is a hard pin: the key's version whose first allocation is the
# record's id is hard-pinned. (A master from before hard pin records reads it as a bound, which
# kills that version: a cache miss, never an older value back.)
HARD_PIN_RECORD = "\0hard-pin"


class Tombstones:
    def __init__(self, max_removed: int) -> None:
        self.max_removed = max_removed
        self.removed: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.removed_by: dict[tuple[str, str], str] = {}  # the tag of a bound, when it has one
        self.pending: list[TombstoneRecord] = []  # new bounds not yet in the removal log
        self._freed_while_down: dict[str, set[int]] = {}
        self.dead_writes: OrderedDict[int, tuple[str, str]] = OrderedDict()  # id -> (tenant, key)
        self.hard_pins: OrderedDict[tuple[str, str], int] = OrderedDict()  # -> first alloc id

    def remember_removed(self, tenant_name: str, key: str, alloc_id: int, by: str = "") -> None:
        """Every allocation of the key with an id <= `alloc_id` is dead; queue it for the log.
        `by`: the tag of the Remove request that did it ('' for any other change)."""
        if not self.max_removed or alloc_id <= 0:
            return
        if self.raise_bound(tenant_name, key, alloc_id, by):
            self.pending.append((tenant_name, key, alloc_id, by))

    def raise_bound(self, tenant_name: str, key: str, alloc_id: int, by: str = "") -> bool:
        """Keep the larger bound (a log replays in any order); False when nothing changed."""
        name = (tenant_name, key)
        if self.removed.get(name, 0) >= alloc_id:
            return False
        self.removed[name] = alloc_id
        self.removed.move_to_end(name)
        if by:  # a bound without a tag (a miss, an upsert) keeps the last remover's tag
            self.removed_by[name] = by
        while len(self.removed) > self.max_removed:
            oldest, _bound = self.removed.popitem(last=False)
            self.removed_by.pop(oldest, None)
        return True

    def kill_write(self, tenant_name: str, key: str, alloc_ids: list[int]) -> None:
        """Allocations of a version dropped while WRITING: never to be adopted; queued for the
        log (those a key bound already kills are not)."""
        if not self.max_removed:
            return
        bound = self.removed_alloc_id(tenant_name, key)
        for alloc_id in alloc_ids:
            if alloc_id > bound and self._remember_dead(alloc_id, tenant_name, key):
                self.pending.append((tenant_name, key, alloc_id, DEAD_WRITE))

    def _remember_dead(self, alloc_id: int, tenant_name: str, key: str) -> bool:
        if alloc_id in self.dead_writes:
            return False
        self.dead_writes[alloc_id] = (tenant_name, key)
        while len(self.dead_writes) > self.max_removed:
            self.dead_writes.popitem(last=False)
        return True

    def remember_hard_pin(self, tenant_name: str, key: str, first_alloc_id: int) -> None:
        """The key's version allocated from `first_alloc_id` on is hard-pinned; queued for the
        log, so a rebuilt master pins it again."""
        if self.max_removed and self._remember_pin(tenant_name, key, first_alloc_id):
            self.pending.append((tenant_name, key, first_alloc_id, HARD_PIN_RECORD))

    def _remember_pin(self, tenant_name: str, key: str, first_alloc_id: int) -> bool:
        name = (tenant_name, key)
        if first_alloc_id <= self.removed.get(name, 0) or self.hard_pins.get(name, 0) >= first_alloc_id:
            return False
        self.hard_pins[name] = first_alloc_id
        self.hard_pins.move_to_end(name)
        while len(self.hard_pins) > self.max_removed:
            self.hard_pins.popitem(last=False)
        return True

    def hard_pinned_from(self, tenant_name: str, key: str) -> int:
        """The first alloc id of the key's hard-pinned version (0: none, or it was removed or
        replaced since): a reported allocation at or above it is that version's."""
        first = self.hard_pins.get((tenant_name, key), 0)
        return first if first > self.removed.get((tenant_name, key), 0) else 0

    def dead_write(self, alloc_id: int) -> bool:
        """Whether `alloc_id` belonged to a version dropped while WRITING."""
        return alloc_id in self.dead_writes

    def load(self, records: list[TombstoneRecord]) -> int:
        """Bounds and dead writes read back from the removal log by a new master (nothing is
        queued again); returns the highest id, so the caller can move its alloc id counter
        above it."""
        highest = 0
        if not self.max_removed:
            return 0
        for tenant_name, key, alloc_id, by in records:
            if by == DEAD_WRITE:
                self._remember_dead(alloc_id, tenant_name, key)
            elif by == HARD_PIN_RECORD:
                self._remember_pin(tenant_name, key, alloc_id)
            else:
                self.raise_bound(tenant_name, key, alloc_id, by)
            highest = max(highest, alloc_id)
        return highest

    def take_pending(self) -> list[TombstoneRecord]:
        pending, self.pending = self.pending, []
        return pending

    def snapshot(self) -> list[TombstoneRecord]:
        """Every bound, dead write and live hard pin held, oldest first (what a compacted log
        keeps; the bounds first, so a replay in order ends a pin they end)."""
        by = self.removed_by
        return [*((tenant, key, bound, by.get((tenant, key), ""))
                  for (tenant, key), bound in self.removed.items()),
                *((tenant, key, alloc_id, DEAD_WRITE)
                  for alloc_id, (tenant, key) in self.dead_writes.items()),
                *((tenant, key, first, HARD_PIN_RECORD) for (tenant, key), first in self.hard_pins.items()
                  if self.hard_pinned_from(tenant, key))]

    def removed_alloc_id(self, tenant_name: str, key: str) -> int:
        """The bound remembered for the key (0: none): ids at or below it are dead."""
        return self.removed.get((tenant_name, key), 0)

    def removed_by_request(self, tenant_name: str, key: str, tag: str) -> bool:
        """Whether the key's bound was set by the Remove request tagged `tag` (its repeat)."""
        return bool(tag) and self.removed_by.get((tenant_name, key)) == tag

    def freed_while_down(self, node_id: str, alloc_ids: set[int]) -> None:
        self._freed_while_down[node_id] = alloc_ids

    def refused_for(self, node_id: str) -> set[int]:
        return self._freed_while_down.get(node_id, set())

    def node_reported(self, node_id: str) -> None:
        """Every segment of the node has reported: nothing of its past is left to refuse."""
        self._freed_while_down.pop(node_id, None)
