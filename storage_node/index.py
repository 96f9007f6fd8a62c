"""ObjectIndex: the node's own record of the objects it holds, and the sealing rule.

What it owns
    One entry per allocation this node has received bytes for: alloc_id -> (segment, offset,
    object size, tenant, key, checksum, epoch, state, write-grant expiry). The first write of an
    allocation creates the entry (WRITING); received byte ranges are merged as intervals, so a
    retried chunk never counts twice; when [offset, offset + object size) has arrived completely
    the entry becomes SEALED. A new master rebuilds its object table from `snapshot()` (the
    "Cache durability" issue), so the index keeps everything a rebuild needs.

The sealing rule (why the master may reuse a completed object's range at once)
    Once SEALED, writes to that alloc_id are refused, so a writer whose grant is still valid
    cannot touch the range again after the object is complete. When the master frees a range
    (`apply_freed`) the entry is dropped but leaves a tombstone alloc_id -> grant expiry: writes
    under that allocation stay refused until its grant has expired (plus the allowed clock
    skew), after which the grant check refuses them anyway and the tombstone is purged. A first
    write of a *newer* allocation (alloc ids only grow, across epochs too: master/state/ids.py)
    that overlaps an entry proves the master freed that entry (it never hands out a live range
    twice), so the old entry is tombstoned the same way even if its FreedRange has not arrived
    yet. A first write of an *older* allocation that overlaps an entry is refused (FREED): it
    can only come from a dead grant whose range the master has handed out again, and it must
    never drop the newer entry (issue 19, the ghost write). Together: a late write from a
    timed-out writer never lands in someone else's object.

Invariants
    Entries of one segment never overlap (zero-length objects hold no bytes and are not in the
    per-segment order). `received_bytes` equals the total length of the merged intervals and
    never exceeds the object size. An alloc_id is never both an entry and a tombstone.
    Memory is bounded: entries by the allocations the master made in this node's segments,
    tombstones by the free rate times the grant TTL (they purge by expiry).

Thread safety
    Data-plane threads call `admit_write`/`record_written` concurrently with the control loop's
    `apply_freed`/`clear`; one lock guards everything, held for O(log n + k) work per call.
    `usage` and `counts` (each /metrics scrape and status call) read per-segment counters
    kept at every change (`_count`), O(segments): walking the entries instead held the lock
    0.3 s + 0.13 s per scrape at 10^6 entries (now 0.06 + 0.02 ms).

Persistence and re-attach (node restart, master restart)
    With a journal (storage_node/journal.py) every SEALED entry and every drop of a SEALED
    entry is appended to a file beside the segments (with `defer_journal`, seals are queued
    until `flush_journal`, which the node's data server calls before it acknowledges any
    write), so a node killed with -9 and restarted with the same id `restore`s its SEALED
    entries (WRITING ones are lost on purpose: their
    bytes are partial). On a mount that must rebuild a master, `prepare_report` drops the
    WRITING entries and returns the SEALED ones to report; entries the master refuses are
    dropped (`drop_alloc_ids`), like entries the verifier found corrupt (`drop_if_matches`).

The write floor (grants issued before the current mount)
    After a re-mount the master may hand out again ranges it had granted before (it expired
    this node, or this process is new). `set_mount(mount_ms, write_grant_ttl_ms)` records the
    master time of the mount; a write whose grant was issued earlier (expiry - ttl < mount_ms)
    is refused (FREED: that allocation takes no more writes, ever). Until the first mount a
    node started with `refuse_writes_until_mount()` accepts no write at all.

The read check (grants that prove the bytes are the reader's)
    A read grant names an allocation; `admit_read` answers only while that allocation is
    SEALED here at the granted offset and size, and gives back its tenant and key so the
    caller can compare them with the grant's key tag. Once the master frees the range (the
    reader unpinned, the object was removed) the entry is dropped, so an old grant reads
    nothing even if the range already holds the next tenant's object. `set_mount` also sets a
    read floor: read grants issued before the current mount are refused.

Transfers in flight (storage_node/inflight.py says why)
    `admit_write(hold=True)`/`admit_read(hold=True)` count a transfer on its allocation until
    `release`. A write that would seal is refused (BUSY) while another write of the allocation
    is held; a newer allocation is refused (BUSY) over an older entry with holds, or over the
    range of one dropped while held (freed, cleared), until its last hold ends.

It never touches segment memory and never decides whether a grant is authentic (access.py
does); alloc ids are unique per master epoch, which is all this issue relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cellar.proto import engine_hash as engine_hashes
from cellar.storage_node.index_records import (
    AllocState,
    EngineHashLike,
    FreedLike,
    IndexEntry,
    ReadRefused,
    SegmentUsage,
    SoftPinLike,
    WriteRefused,
    merge_ranges,
)
from cellar.storage_node.index_table import TOMBSTONE_GRACE_MS, IndexTable, journal_entry
from cellar.storage_node.journal import IndexJournal, JournalEntry
from cellar.storage_node.sortedspans import SortedSpans

_NO_WRITES_MS = 1 << 62  # write floor before the first mount: every grant is older


class ObjectIndex(IndexTable):
    """The rules over the table (module docstring); every public method takes the lock."""

    # ---- data plane ------------------------------------------------------------------

    def admit_write(
        self,
        *,
        alloc_id: int,
        segment_id: int,
        object_offset: int,
        object_size: int,
        tenant: str,
        key: str,
        checksum: int,
        epoch: int,
        grant_expiry_ms: int,
        hold: bool = False,
    ) -> None:
        """Accept a write into this allocation or raise WriteRefused. With `hold`, the write is
        counted in flight until `release` (its payload is streaming into the range).

        The caller has already checked the grant and that the range lies inside the segment and
        inside [object_offset, object_offset + object_size).
        """
        with self._lock:
            self._refuse_dead_grant(alloc_id, grant_expiry_ms)
            entry = self._entries.get(alloc_id)
            if entry is None:
                if object_size > 0:
                    self._insert_dropping_overlaps(segment_id, object_offset, object_size,
                                                   alloc_id)
                entry = self._entries[alloc_id] = IndexEntry(
                    alloc_id, segment_id, object_offset, object_size, tenant, key, checksum,
                    epoch, grant_expiry_ms)
                self._count(entry, 1)
                if hold:
                    self._inflight.hold(alloc_id)
                return
            if entry.state is AllocState.SEALED:
                raise WriteRefused(WriteRefused.SEALED, f"allocation {alloc_id} is complete")
            if (entry.segment_id, entry.offset, entry.length, entry.tenant, entry.key,
                    entry.checksum) != (segment_id, object_offset, object_size, tenant, key,
                                        checksum):
                raise WriteRefused(
                    WriteRefused.CONFLICT,
                    f"allocation {alloc_id} was first written as {entry.tenant!r}/{entry.key!r} "
                    f"({entry.length} bytes at {entry.offset}, checksum {entry.checksum:#x})",
                )
            if grant_expiry_ms > entry.write_grant_expiry_ms:
                entry.write_grant_expiry_ms = grant_expiry_ms
            if hold:
                self._inflight.hold(alloc_id)

    def hold(self, alloc_id: int) -> None:
        """Count one more transfer in flight on `alloc_id` (one not admitted through
        `admit_write`/`admit_read`, e.g. a retried chunk drained while its reply is due)."""
        with self._lock:
            self._inflight.hold(alloc_id)

    def release(self, alloc_id: int) -> None:
        """One transfer held on `alloc_id` is over (its payload arrived or never will; its
        reply was handed to the kernel or never will be). The last one of an entry dropped
        meanwhile unblocks its range."""
        with self._lock:
            self._inflight.release(alloc_id)

    def in_flight(self, alloc_id: int) -> int:
        """How many transfers are held on `alloc_id`."""
        with self._lock:
            return self._inflight.others(alloc_id, held=False)

    def draining(self) -> int:
        """How many dropped entries still have transfers in flight (their ranges blocked)."""
        with self._lock:
            return len(self._inflight.draining)

    def claim(self, *, alloc_id: int, segment_id: int, object_offset: int, object_size: int,
              grant_expiry_ms: int) -> None:
        """A writer that copies into the segment itself (shm, rdma) is about to write this
        allocation: drop the older entries its range overlaps, as `admit_write` does for a
        write's first frame, so that no read under a grant of the range's previous allocation
        (which the master freed; its notice may not be here yet) is served from the bytes the
        copy is about to put there. Raises WriteRefused where `admit_write` would (a grant from
        before this mount, a freed allocation, a newer one in the range). Records nothing:
        the COMMIT admits the object with its checksum."""
        with self._lock:
            self._refuse_dead_grant(alloc_id, grant_expiry_ms)
            if alloc_id in self._entries:
                return  # admitted already (a retry; its COMMIT decides): its overlaps went then
            if object_size > 0:  # a segment with no entries left may still drain (inflight.py)
                self._drop_older_overlaps(self._order.get(segment_id), segment_id,
                                          object_offset, object_size, alloc_id)

    def sealed(self, alloc_id: int) -> IndexEntry | None:
        """The SEALED entry of `alloc_id` still held here (its fields no longer change), or None."""
        with self._lock:
            entry = self._entries.get(alloc_id)
            return entry if entry is not None and entry.state is AllocState.SEALED else None

    def record_written(self, alloc_id: int, rel_start: int, rel_end: int, *,
                       held: bool = False) -> IndexEntry | None:
        """Bytes [rel_start, rel_end) of the object arrived; the entry (now SEALED, so its
        fields no longer change) if this completed it, else None. `held`: the caller's own
        write is one of the holds on the allocation (it releases it itself, after this).
        WriteRefused(BUSY), nothing recorded, when this would complete the allocation while
        another write of it is still in flight: that one could land over the sealed bytes
        (and, once the range is freed and reused, over the next object's)."""
        with self._lock:
            entry = self._entries.get(alloc_id)
            if entry is None or entry.state is AllocState.SEALED:
                return None  # freed meanwhile, or a concurrent duplicate chunk
            assert 0 <= rel_start <= rel_end <= entry.length, (rel_start, rel_end, entry.length)
            others = self._inflight.others(alloc_id, held)
            if others > 0 and self._would_complete(entry, rel_start, rel_end):
                raise WriteRefused(WriteRefused.BUSY,
                                   f"allocation {alloc_id}: {others} other write(s) of it still "
                                   "in flight; not sealed")
            self._count(entry, -1)  # counted out as it was, back in as it is below
            if rel_start == 0 and rel_end == entry.length:  # the whole object (one frame)
                entry.received_bytes = entry.length
            else:
                entry.received_bytes += merge_ranges(entry.ranges, rel_start, rel_end)
            assert entry.received_bytes <= entry.length
            sealed = entry.received_bytes == entry.length
            if sealed:
                entry.state = AllocState.SEALED
                entry.ranges = []
            self._count(entry, 1)
            if sealed:
                if self._journal is not None:
                    self._journal.sealed(entry, defer=self._defer_journal)
                return entry
            return None

    def flush_journal(self) -> None:
        """Write the journal records of seals deferred so far (see `defer_journal`)."""
        journal = self._journal
        # Unlocked peek: a seal queued just after it is flushed by its own writer's reply.
        if journal is not None and journal.queued:
            with self._lock:
                journal.flush()

    # ---- control plane ---------------------------------------------------------------

    def apply_freed(self, ranges: Iterable[FreedLike], now_ms: int) -> int:
        """Drop the entries the master freed, tombstoning them; returns how many were dropped."""
        dropped = 0
        with self._lock:
            for freed in ranges:
                entry = self._entries.get(freed.alloc_id)
                if entry is not None:
                    self._drop(entry)
                    dropped += 1
            self._purge(now_ms)
            self._flush_drops()
        return dropped

    def purge(self, now_ms: int) -> int:
        """Forget tombstones whose grants have expired; returns how many."""
        with self._lock:
            return self._purge(now_ms)

    def clear(self, now_ms: int) -> None:
        """Forget every entry: the master this node (re)mounted on starts with an empty view.

        Entries become tombstones until their write grants expire: after a remount on a master
        with the same epoch, a grant issued before the remount may still be valid, and its
        writes must not land in ranges the master now hands out again. (The "Cache
        durability" issue replaces this with a rebuild of the master from `snapshot()`.)
        """
        with self._lock:
            for entry in list(self._entries.values()):
                self._drop(entry)
            assert not self._entries
            self._order.clear()
            self._purge(now_ms)
            self._flush_drops()

    def refuse_writes_until_mount(self) -> None:
        """No write is admitted before the first `set_mount` (a restarted node's old grants)."""
        with self._lock:
            self._write_floor_ms = _NO_WRITES_MS

    def set_mount(self, mount_ms: int, write_grant_ttl_ms: int, read_grant_ttl_ms: int = 0) -> None:
        """Refuse from now on every write grant, and every read grant, issued before master
        time `mount_ms` (a master that sends no read TTL gets no read floor)."""
        with self._lock:
            self._write_floor_ms = mount_ms
            self._write_grant_ttl_ms = max(write_grant_ttl_ms, 0)
            self._read_floor_ms = mount_ms if read_grant_ttl_ms > 0 else 0
            self._read_grant_ttl_ms = max(read_grant_ttl_ms, 0)

    def admit_read(self, *, alloc_id: int, segment_id: int, object_offset: int, length: int,
                   grant_expiry_ms: int, hold: bool = False) -> tuple[str, str]:
        """(tenant, key) of the SEALED allocation a read grant names, if this node still holds
        it exactly there; else ReadRefused. The caller checks that (tenant, key) is the
        object the grant was signed for: a reused range holds another allocation (or none).
        With `hold`, the read is counted in flight until `release` (its reply is a view of
        the range until it has left)."""
        with self._lock:
            if self._read_floor_ms and grant_expiry_ms - self._read_grant_ttl_ms < self._read_floor_ms:
                raise ReadRefused(ReadRefused.STALE,
                                  f"allocation {alloc_id}: the read grant was issued before this "
                                  "node's current mount")
            entry = self._entries.get(alloc_id)
            if entry is None:
                raise ReadRefused(ReadRefused.GONE, f"allocation {alloc_id} is not held here")
            if entry.state is not AllocState.SEALED:
                raise ReadRefused(ReadRefused.GONE, f"allocation {alloc_id} is not sealed")
            if (entry.segment_id, entry.offset, entry.length) != (segment_id, object_offset, length):
                raise ReadRefused(ReadRefused.GONE,
                                  f"allocation {alloc_id} is {entry.length} bytes at "
                                  f"{entry.segment_id}/{entry.offset}, not where the grant says")
            if hold:
                self._inflight.hold(alloc_id)
            return entry.tenant, entry.key

    def restore(self, entries: Iterable[JournalEntry], segment_sizes: dict[int, int]) -> list[int]:
        """Re-create SEALED entries replayed from the journal; returns their alloc ids.

        Entries of unknown segments, outside their segment, empty or overlapping an entry
        restored before them are skipped (and stay out of the journal at its next compaction).
        """
        restored: list[int] = []
        with self._lock:
            for j in sorted(entries, key=lambda e: e.alloc_id, reverse=True):
                size = segment_sizes.get(j.segment_id)
                if (size is None or j.length <= 0 or j.offset < 0 or j.offset + j.length > size
                        or j.alloc_id in self._entries or self._overlaps(j.segment_id, j.offset,
                                                                         j.length)):
                    continue
                entry = IndexEntry(j.alloc_id, j.segment_id, j.offset, j.length, j.tenant, j.key,
                                   j.checksum, j.epoch, j.write_grant_expiry_ms,
                                   AllocState.SEALED, j.length, engine_hash=j.engine_hash,
                                   value_id=j.value_id, soft_pin_until_ms=j.soft_pin_until_ms)
                self._entries[j.alloc_id] = entry
                self._count(entry, 1)
                self._order.setdefault(j.segment_id, SortedSpans()).add((j.offset, j.alloc_id))
                restored.append(j.alloc_id)
            if self._journal is not None:
                try:
                    self._journal.rewrite([journal_entry(e) for e in self._entries.values()])
                except OSError:
                    self._journal.failed = True
                    self._journal.close(unlink=True)
        return restored

    def prepare_report(self, now_ms: int) -> list[IndexEntry]:
        """For a mount that rebuilds a master: drop WRITING entries, return SEALED copies."""
        with self._lock:
            for entry in [e for e in self._entries.values() if e.state is AllocState.WRITING]:
                self._drop(entry)
            self._purge(now_ms)
            self._flush_drops()
            return [entry.copy() for entry in self._entries.values()]

    def seal_copy(self, source: IndexEntry, alloc_id: int, segment_id: int, offset: int) -> bool:
        """Enter a SEALED copy of `source` (a tier move, storage_node/disk_tier.py) under the
        master's new allocation, journaled before this returns. Refused (False) if the id is
        known or tombstoned; entries it overlaps were freed by the master (as for a write)."""
        with self._lock:
            if alloc_id in self._entries or alloc_id in self._tombstones:
                return False
            entry = IndexEntry(alloc_id, segment_id, offset, source.length, source.tenant,
                               source.key, source.checksum, source.epoch,
                               source.write_grant_expiry_ms, AllocState.SEALED, source.length,
                               engine_hash=source.engine_hash,
                               value_id=source.value_id or source.alloc_id,
                               soft_pin_until_ms=source.soft_pin_until_ms)
            assert entry.length > 0, "a tier move of an empty object"
            try:
                self._insert_dropping_overlaps(segment_id, offset, entry.length, alloc_id)
            except WriteRefused:  # a newer entry, or transfers in flight, in the range
                return False
            self._entries[alloc_id] = entry
            self._count(entry, 1)
            if self._journal is not None:
                self._journal.sealed(entry)
            self._flush_drops()
            return True

    def move_target_free(self, alloc_id: int, segment_id: int, offset: int, length: int) -> bool:
        """Whether a tier move may write [offset, +length) for `alloc_id`: the id is neither
        known (done already) nor tombstoned (freed), and no newer allocation overlaps it
        (the master reused the range). Called with the mover's own gate held, right before
        the pwrite (storage_node/disk_tier.py says why the moment after it is safe too). When
        it may, the older entries the range overlaps (the master freed them before it placed
        the move there) go now, as a shm writer's `claim` drops them: no read under their
        grants is admitted between this look and the copy, which would send the moved bytes."""
        with self._lock:
            if alloc_id in self._entries or alloc_id in self._tombstones:
                return False
            try:  # nor an older one whose transfers still move its bytes (inflight.py)
                self._drop_older_overlaps(self._order.get(segment_id), segment_id, offset,
                                          length, alloc_id)
            except WriteRefused:
                return False
            return True

    def set_value_id(self, alloc_id: int, value_id: int) -> None:
        """A repair copy's value (proto CopyTask.value_alloc_id: the alloc id of the put that
        wrote the bytes), set on its allocation before the copy seals it, so the SEALED record
        carries it; ignored once sealed, and unless older than the allocation itself."""
        with self._lock:
            entry = self._entries.get(alloc_id)
            if entry is not None and entry.state is AllocState.WRITING and 0 < value_id < alloc_id:
                entry.value_id = value_id

    def set_engine_hashes(self, notes: Iterable[EngineHashLike]) -> int:
        """The master's engine hashes of SEALED allocations here (heartbeat replies), kept and
        journaled so the next report carries them; a note for an allocation that is not (or no
        longer) SEALED here, in that segment, or a hash out of bounds, is ignored. Returns how
        many were kept."""
        def valid(note: Any) -> bytes | None:
            value = bytes(note.engine_hash)
            return value if value and not engine_hashes.error(value) else None

        return self._keep_notes(notes, valid, "engine_hash", IndexJournal.engine_hash)

    def set_soft_pins(self, notes: Iterable[SoftPinLike]) -> int:
        """The master's soft pins of SEALED allocations here (heartbeat replies), each with its
        lapse (wall clock ms), kept and journaled so the next report carries them and a
        rebuilt master pins the object again; ignored as `set_engine_hashes` says (and a
        lapse of 0). Returns how many were kept."""
        return self._keep_notes(notes, lambda note: int(note.until_ms) or None,
                                "soft_pin_until_ms", IndexJournal.soft_pin)

    def _keep_notes(self, notes: Iterable[Any], valid: Callable[[Any], Any], field: str,
                    record: Callable[..., None]) -> int:
        """Set `field` of each note's SEALED allocation (in the note's segment) to the note's
        value (`valid`: the value, or None when out of bounds), journaled with `record`."""
        kept = 0
        with self._lock:
            for note in notes:
                entry = self._entries.get(int(note.alloc_id))
                value = valid(note)
                if (entry is None or entry.state is not AllocState.SEALED
                        or entry.segment_id != int(note.segment_id)
                        or value is None or getattr(entry, field) == value):
                    continue
                setattr(entry, field, value)
                if self._journal is not None:
                    record(self._journal, entry.alloc_id, value, defer=True)
                kept += 1
            if self._journal is not None:
                self._journal.flush()
        return kept

    def drop_alloc_ids(self, alloc_ids: Iterable[int]) -> int:
        """Drop these entries (the master refused them in a rebuild); returns how many."""
        dropped = 0
        with self._lock:
            for alloc_id in alloc_ids:
                entry = self._entries.get(alloc_id)
                if entry is not None:
                    self._drop(entry)
                    dropped += 1
            self._flush_drops()
        return dropped

    def drop_if_matches(self, alloc_id: int, segment_id: int, offset: int, length: int) -> bool:
        """Drop the entry if it is still this exact SEALED allocation (verifier)."""
        with self._lock:
            entry = self._entries.get(alloc_id)
            if (entry is None or entry.state is not AllocState.SEALED
                    or (entry.segment_id, entry.offset, entry.length) != (segment_id, offset, length)):
                return False
            self._drop(entry)
            self._flush_drops()
            return True

    def maybe_compact(self) -> bool:
        """Rewrite the journal when dead records dominate it; True if it did."""
        journal = self._journal
        if journal is None or not journal.wants_compaction():
            return False
        with self._lock:
            try:
                journal.rewrite([journal_entry(e) for e in self._entries.values()
                                 if e.state is AllocState.SEALED])
            except OSError:
                journal.failed = True
                journal.close(unlink=True)
                return False
        return True

    # ---- queries ---------------------------------------------------------------------

    def get(self, alloc_id: int) -> IndexEntry | None:
        with self._lock:
            entry = self._entries.get(alloc_id)
            return entry.copy() if entry is not None else None

    def is_tombstoned(self, alloc_id: int) -> bool:
        with self._lock:
            return alloc_id in self._tombstones

    def snapshot(self) -> list[IndexEntry]:
        """Copies of every entry (WRITING and SEALED), for a master's rebuild."""
        with self._lock:
            return [entry.copy() for entry in self._entries.values()]

    def usage(self) -> dict[int, SegmentUsage]:
        """Per-segment object counts and bytes (kept as entries change: O(segments))."""
        with self._lock:
            return {seg: SegmentUsage(*row) for seg, row in self._usage.items()}

    def counts(self) -> dict[str, int]:
        with self._lock:
            sealed = sum(row[1] for row in self._usage.values())
            return {"entries": len(self._entries), "sealed": sealed,
                    "writing": len(self._entries) - sealed, "tombstones": len(self._tombstones)}

    def __len__(self) -> int:
        return len(self._entries)

__all__ = ["TOMBSTONE_GRACE_MS", "AllocState", "IndexEntry", "ObjectIndex", "ReadRefused",
           "SegmentUsage", "WriteRefused"]
