"""The records of a node's object index (storage_node/index.py) and its refusals.

What it owns: `IndexEntry` (one allocation as the node knows it) and its `AllocState`, the
refusals a write or a read gets (`WriteRefused`, `ReadRefused`, each with a reason constant),
the shapes of what the index takes from heartbeat replies (`FreedLike`, `EngineHashLike`),
`SegmentUsage`, and `merge_ranges`, the interval arithmetic that counts received bytes once.
Split out of index.py, which holds the table and its rules (sealing, tombstones, the write and
read floors, persistence) and re-exports these names. No locks, no I/O, no state.
"""

from __future__ import annotations

import dataclasses
import enum
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Protocol


class AllocState(str, enum.Enum):
    WRITING = "writing"
    SEALED = "sealed"


@dataclass(slots=True)
class IndexEntry:
    alloc_id: int
    segment_id: int
    offset: int            # where the object starts in the segment (the grant's offset)
    length: int            # object size in bytes
    tenant: str
    key: str
    checksum: int          # xxh3_64 of the whole value, as the writer declared it
    epoch: int             # epoch of the master that granted the write
    write_grant_expiry_ms: int
    state: AllocState = AllocState.WRITING
    received_bytes: int = 0
    # merged [start, end) ranges received, relative to `offset`; emptied once SEALED
    ranges: list[tuple[int, int]] = field(default_factory=list)
    engine_hash: bytes = b""  # the engine's hash of the page, as the master told it (or b"")
    # A copy's value (a tier move, a repair copy): the alloc id of the put that wrote these
    # bytes, older than this allocation's own; 0 for the put's own range (journal.py kind 4)
    value_id: int = 0
    # The soft pin the master noted (heartbeat replies), wall clock ms it lapses (journal.py
    # kind 5; 2^64 - 1: never); 0: none
    soft_pin_until_ms: int = 0

    def end(self) -> int:
        return self.offset + self.length

    def copy(self) -> IndexEntry:
        return dataclasses.replace(self, ranges=list(self.ranges))


class WriteRefused(Exception):
    """A write the index does not accept; `reason` is one of the class constants."""

    SEALED = "sealed"      # the allocation was completely written already
    FREED = "freed"        # the master freed the allocation (tombstone)
    CONFLICT = "conflict"  # metadata disagrees with the allocation's first write
    # transfers are still in flight on the allocation (its seal), or on an older allocation
    # the range overlaps (a newer allocation's admission): retry, the hold ends by a deadline
    BUSY = "busy"

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class ReadRefused(Exception):
    """A read the index does not allow; `reason` is one of the class constants."""

    GONE = "gone"     # the allocation is not (or no longer, or not yet completely) here
    STALE = "stale"   # the grant predates this node's current mount

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class EngineHashLike(Protocol):
    """A `pb.EngineHashNote` (or anything with its fields)."""

    segment_id: int
    alloc_id: int
    engine_hash: bytes


class SoftPinLike(Protocol):
    """A `pb.SoftPinNote` (or anything with its fields)."""

    segment_id: int
    alloc_id: int
    until_ms: int


class FreedLike(Protocol):
    """What apply_freed needs of a proto FreedRange."""

    segment_id: int
    alloc_id: int
    offset: int
    length: int


@dataclass(slots=True, frozen=True)
class SegmentUsage:
    objects: int = 0
    sealed_objects: int = 0
    sealed_bytes: int = 0
    writing_bytes: int = 0


def merge_ranges(ranges: list[tuple[int, int]], start: int, end: int) -> int:
    """Add [start, end) to sorted, disjoint, non-adjacent `ranges`; return newly covered bytes."""
    if start >= end:
        return 0
    lo = bisect_left(ranges, start, key=lambda r: r[1])  # first range ending at/after start
    hi = bisect_right(ranges, end, key=lambda r: r[0])   # first range starting after end
    if lo < hi:
        old = sum(e - s for s, e in ranges[lo:hi])
        start, end = min(start, ranges[lo][0]), max(end, ranges[hi - 1][1])
    else:
        old = 0
    ranges[lo:hi] = [(start, end)]
    return (end - start) - old


__all__ = ["AllocState", "EngineHashLike", "FreedLike", "IndexEntry", "ReadRefused",
           "SegmentUsage", "SoftPinLike", "WriteRefused", "merge_ranges"]
