"""IndexTable: the state of a node's object index and the operations that keep its invariants.

What it owns: the entries (alloc_id -> IndexEntry), their per-segment order, the tombstones
and their expiry heap, the per-segment usage counters, the write and read floors, and the
transfers in flight (storage_node/inflight.py). Every method here runs with `_lock` held by
its caller; ObjectIndex (storage_node/index.py) holds the rules and the public calls, and
tells the story (sealing, tombstones, overlaps, floors, persistence). Split out of index.py to
keep each file readable; nothing here takes the lock or talks to anyone.
"""

from __future__ import annotations

import heapq
import threading

from cellar.storage_node.index_records import (
    AllocState,
    IndexEntry,
    WriteRefused,
    merge_ranges,
)
from cellar.storage_node.inflight import InFlight
from cellar.storage_node.journal import IndexJournal, JournalEntry
from cellar.storage_node.sortedspans import SortedSpans

# Extra time a tombstone outlives its grant's expiry (beyond the allowed skew), so that a
# correction of the master-clock estimate cannot revive a grant whose tombstone is gone.
TOMBSTONE_GRACE_MS = 5_000


class IndexTable:
    def __init__(self, *, allowed_skew_ms: int = 0, journal: IndexJournal | None = None,
                 defer_journal: bool = False) -> None:
        self._lock = threading.Lock()
        self._allowed_skew_ms = allowed_skew_ms
        self._journal = journal
        # Seals from the data path reach the journal at the next flush_journal() (one write
        # for many objects); whoever acknowledges writes must flush before it does.
        self._defer_journal = defer_journal
        self._write_floor_ms = 0      # grants issued before this master time are refused
        self._write_grant_ttl_ms = 0
        self._read_floor_ms = 0       # read grants issued before this master time are refused
        self._read_grant_ttl_ms = 0
        self._entries: dict[int, IndexEntry] = {}
        # per segment: (offset, alloc_id) of entries holding bytes, sorted
        self._order: dict[int, SortedSpans] = {}
        self._tombstones: dict[int, int] = {}  # alloc_id -> write grant expiry (master ms)
        self._tombstone_heap: list[tuple[int, int]] = []  # (expiry_ms, alloc_id)
        # per segment: [objects, sealed objects, sealed bytes, WRITING bytes received], kept
        # as entries come, seal and go: `usage` and `counts` (every /metrics scrape and status
        # call) read them instead of walking every entry under the lock (at 10^6 entries that
        # walk held the data path's lock 0.3 s + 0.13 s per scrape)
        self._usage: dict[int, list[int]] = {}
        self._inflight = InFlight()  # transfers still moving bytes (storage_node/inflight.py)

    def _refuse_dead_grant(self, alloc_id: int, grant_expiry_ms: int) -> None:
        """WriteRefused(FREED) for a write grant issued before this node's current mount, or
        for an allocation the master freed (tombstoned here). Under the lock."""
        if grant_expiry_ms - self._write_grant_ttl_ms < self._write_floor_ms:
            raise WriteRefused(
                WriteRefused.FREED,
                f"allocation {alloc_id}: the grant was issued before this node's current mount",
            )
        if alloc_id in self._tombstones:
            raise WriteRefused(WriteRefused.FREED, f"allocation {alloc_id} was freed")

    @staticmethod
    def _would_complete(entry: IndexEntry, rel_start: int, rel_end: int) -> bool:
        """Whether recording [rel_start, rel_end) would seal `entry` (nothing changes)."""
        trial = list(entry.ranges)
        return entry.received_bytes + merge_ranges(trial, rel_start, rel_end) == entry.length \
            or (rel_start == 0 and rel_end == entry.length)

    # ---- internals (lock held) -------------------------------------------------------

    def _overlaps(self, segment_id: int, offset: int, length: int) -> bool:
        order = self._order.get(segment_id)
        return bool(order) and bool(self._overlapping(order, offset, offset + length))

    def _overlapping(self, order: SortedSpans, offset: int, end: int) -> list[IndexEntry]:
        """The entries of `order` that overlap [offset, end): the one starting before `offset`
        if it reaches into it, and every one starting inside it (all have length > 0)."""
        found = []
        prev = order.before((offset, -1))
        if prev is not None and self._entries[prev[1]].end() > offset:
            found.append(self._entries[prev[1]])
        for start, alloc_id in order.from_((offset, -1)):
            if start >= end:
                break
            found.append(self._entries[alloc_id])
        return found

    def _count(self, entry: IndexEntry, sign: int) -> None:
        """Add (+1) or take away (-1) `entry` in its segment's usage counters, as it is now
        (an entry that changes is taken away before and added after: `record_written`)."""
        row = self._usage.setdefault(entry.segment_id, [0, 0, 0, 0])
        row[0] += sign
        if entry.state is AllocState.SEALED:
            row[1] += sign
            row[2] += sign * entry.length
        else:
            row[3] += sign * entry.received_bytes
        if not row[0]:
            del self._usage[entry.segment_id]

    def _drop(self, entry: IndexEntry) -> None:
        del self._entries[entry.alloc_id]
        self._count(entry, -1)
        if entry.state is AllocState.SEALED and self._journal is not None:
            self._journal.dropped(entry.alloc_id, defer=True)  # the caller flushes
        if entry.length > 0:
            order = self._order.get(entry.segment_id)
            if order is not None:
                order.remove((entry.offset, entry.alloc_id))
        self._tombstones[entry.alloc_id] = entry.write_grant_expiry_ms
        heapq.heappush(self._tombstone_heap, (entry.write_grant_expiry_ms, entry.alloc_id))
        self._inflight.dropped(entry)

    def _insert_dropping_overlaps(self, segment_id: int, offset: int, length: int,
                                  alloc_id: int) -> None:
        """_drop_older_overlaps, then insert (offset, alloc_id) into the segment's order; in the
        common case of nothing to drop (the first write of every object comes here) that is
        two neighbour lookups and one insert, each O(log n) plus one bucket."""
        order = self._order.get(segment_id)
        if order is None:
            order = self._order[segment_id] = SortedSpans()
        self._drop_older_overlaps(order, segment_id, offset, length, alloc_id)
        order.add((offset, alloc_id))

    def _drop_older_overlaps(self, order: SortedSpans | None, segment_id: int, offset: int,
                             length: int, alloc_id: int) -> None:
        """Drop the entries [offset, +length) overlaps (the master freed them before it granted
        `alloc_id`), unless `_refuse_over` refuses the range. Nothing to drop and nothing
        draining, the common case, costs two neighbour lookups."""
        overlapped = self._refuse_over(order, segment_id, offset, length, alloc_id)
        if overlapped and length > 0:  # (an empty range drops nothing)
            for entry in overlapped:
                self._drop(entry)
            if not self._defer_journal:  # else the data server's flush writes the drops
                self._flush_drops()

    def _refuse_over(self, order: SortedSpans | None, segment_id: int, offset: int,
                     length: int, alloc_id: int) -> list[IndexEntry]:
        """The entries [offset, +length) overlaps, which `alloc_id` may take the range from;
        WriteRefused(FREED) if one is newer than `alloc_id`, WriteRefused(BUSY) if transfers
        are still in flight on one (or on a dropped entry in the range): their bytes would
        cross the new allocation's."""
        end = offset + length
        if self._inflight.draining:
            self._inflight.refuse_draining(alloc_id, segment_id, offset, end)
        if not order:
            return []
        # Overlapped: the entry starting before `offset` reaching into it, or one starting
        # inside [offset, end) (entries never overlap each other, and all have length > 0).
        prev, after = order.neighbours((offset, -1))
        if not ((prev is not None and self._entries[prev[1]].end() > offset)
                or (after is not None and after[0] < end)):
            return []
        overlapped = self._overlapping(order, offset, end)
        newer = [e.alloc_id for e in overlapped if e.alloc_id > alloc_id]
        if newer:  # a dead grant: the master freed this range before it granted `newer`
            raise WriteRefused(
                WriteRefused.FREED,
                f"allocation {alloc_id} overlaps the newer allocation {newer[0]}: the "
                "master freed this range since that grant was issued")
        self._inflight.refuse_held(alloc_id, overlapped)
        return overlapped

    def _flush_drops(self) -> None:
        """Write the drop records `_drop` queued (one write for the whole call)."""
        if self._journal is not None:
            self._journal.flush()

    def _purge(self, now_ms: int) -> int:
        purged = 0
        heap = self._tombstone_heap
        horizon = now_ms - self._allowed_skew_ms - TOMBSTONE_GRACE_MS
        while heap and heap[0][0] < horizon:
            expiry, alloc_id = heapq.heappop(heap)
            if self._tombstones.get(alloc_id) == expiry:
                del self._tombstones[alloc_id]
                purged += 1
        return purged


def journal_entry(e: IndexEntry) -> JournalEntry:
    return JournalEntry(e.alloc_id, e.segment_id, e.offset, e.length, e.checksum, e.epoch,
                        e.write_grant_expiry_ms, e.tenant, e.key, e.engine_hash, e.value_id,
                        e.soft_pin_until_ms)
