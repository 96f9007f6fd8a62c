"""InFlight: the transfers still moving bytes of each allocation, and the ranges they block.

Why it exists. The node checks a grant once, when a transfer is admitted, and the bytes then
move for as long as the peer takes: a WRITE's payload streams into segment memory, a READ's
reply is a view of segment memory that leaves when the corked outbox is flushed and the kernel
takes it. Without a record of them, the master could free the range meanwhile (a completed
object's range is freed at once), hand it to another tenant, and the late bytes would land in
(or be read from) that tenant's object. So every admitted transfer holds its allocation until
it is over, and:
- a write that would complete (seal) an allocation is refused while another write of it is
  in flight (`others`): that one could still land over the sealed bytes;
- a newer allocation is refused over a range where an older allocation has transfers in
  flight (`busy`), including an entry the master's freed notice dropped meanwhile (kept as a
  draining range until its last hold ends, `dropped`).
Refusals are WriteRefused(BUSY), which the data plane answers with ST_BUSY: the put retries on
a new allocation. Each hold ends by its grant's expiry at the latest (the data server closes a
connection whose transfer outlives its grant), so the master's reasoning in time still holds.

Bounds: one count per allocation with holds, one draining range per dropped entry still held;
both bounded by the data server's connections times what one connection holds (one WRITE, and
the READ replies its outbox corks). The common case (nothing draining) costs one dict lookup.
No lock of its own: ObjectIndex calls it under its lock. It never touches memory.
"""

from __future__ import annotations

from collections.abc import Iterable

from cellar.storage_node.index_records import IndexEntry, WriteRefused


class InFlight:
    __slots__ = ("counts", "draining")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}  # alloc_id -> transfers held
        # alloc_id -> (segment, offset, end) of a dropped entry still held
        self.draining: dict[int, tuple[int, int, int]] = {}

    def hold(self, alloc_id: int) -> None:
        self.counts[alloc_id] = self.counts.get(alloc_id, 0) + 1

    def release(self, alloc_id: int) -> None:
        left = self.counts[alloc_id] - 1  # KeyError: a release without its hold
        assert left >= 0, alloc_id
        if left:
            self.counts[alloc_id] = left
        else:
            del self.counts[alloc_id]
            self.draining.pop(alloc_id, None)

    def others(self, alloc_id: int, held: bool) -> int:
        """Transfers held on `alloc_id` besides the caller's own (when it holds one)."""
        return self.counts.get(alloc_id, 0) - held

    def dropped(self, entry: IndexEntry) -> None:
        """`entry` left the index: while it is held, its range stays blocked."""
        if entry.length > 0 and entry.alloc_id in self.counts:
            self.draining[entry.alloc_id] = (entry.segment_id, entry.offset, entry.end())

    def refuse_draining(self, alloc_id: int, segment_id: int, offset: int, end: int) -> None:
        """WriteRefused(BUSY) if a draining range overlaps [offset, end) of `segment_id`."""
        for other, (seg, start, stop) in self.draining.items():
            if seg == segment_id and start < end and offset < stop:
                raise WriteRefused(WriteRefused.BUSY, f"allocation {alloc_id} overlaps the "
                                   f"freed allocation {other}, whose transfers are in flight")

    def refuse_held(self, alloc_id: int, overlapped: Iterable[IndexEntry]) -> None:
        """WriteRefused(BUSY) if one of the `overlapped` entries has transfers in flight."""
        for entry in overlapped:
            if entry.alloc_id in self.counts:
                raise WriteRefused(WriteRefused.BUSY, f"allocation {alloc_id} overlaps the "
                                   f"allocation {entry.alloc_id}, whose transfers are in flight")
