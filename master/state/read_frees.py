"""Ranges of one segment freed while a read grant could still name them.

Why
    A reader that unpinned an object keeps its read grant until the grant expires
    (`pin_ttl_s`). The node admits a read by its own index, which lists the freed allocation
    until the freed-range notice reaches it (its next heartbeat). A tcp writer's first frame
    makes the node drop the old entry, but a shm or rdma writer copies into the range itself:
    before its bytes land, it CLAIMs the allocation at the node (transfer/frame.py OP_CLAIM),
    which drops the old entry so the old grant reads nothing. That claim is one more round trip
    to the node, needed only while such a range's notice is unacknowledged and its grants
    live, and only by a write that overlaps it. The master keeps those ranges here and flags
    the write replicas that overlap one (`Replica.claim` in PutStart and put-ahead replies);
    every other write skips the claim.

What it keeps
    (offset, end, freed-notice seq, until monotonic s) per range, sorted by offset; a range
    leaves when its node acknowledged the notice (`prune`, from the node's heartbeat) or its
    grants expired. Bounded by the ranges freed between two heartbeats of the node. A notice
    the node's outbox dropped unsent (backlog overflow: `Node.outbox_dropped_seq`) is never
    applied, so an acknowledgement of later ones does not end its range: only time does.
"""

from __future__ import annotations

import bisect

__all__ = ["RecentReadFrees"]


class RecentReadFrees:
    __slots__ = ("_starts", "_items", "_longest")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._items: list[tuple[int, int, int, float]] = []  # (offset, end, seq, until)
        self._longest = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, offset: int, length: int, seq: int, until: float) -> None:
        assert length > 0 and seq > 0, "a freed range has bytes and a notice"
        k = bisect.bisect_right(self._starts, offset)
        self._starts.insert(k, offset)
        self._items.insert(k, (offset, offset + length, seq, until))
        self._longest = max(self._longest, length)

    def overlaps(self, offset: int, length: int, acked_seq: int, now: float,
                 unsent_through: int = 0) -> bool:
        """Whether [offset, +length) overlaps a range whose notice the node has not applied
        (seq > `acked_seq`, or dropped unsent: seq <= `unsent_through`) while its grants may
        live (until > `now`)."""
        end = offset + length
        items = self._items
        k = bisect.bisect_left(self._starts, end)  # items[:k] start before `end`
        floor = offset - self._longest  # an item starting before this ends before `offset`
        while k > 0:
            k -= 1
            start, stop, seq, until = items[k]
            if start < floor:
                return False
            if stop > offset and _pending(seq, until, acked_seq, now, unsent_through):
                return True
        return False

    def prune(self, acked_seq: int, now: float, unsent_through: int = 0) -> None:
        """Forget the ranges whose notice the node applied (acknowledged, not dropped unsent)
        or whose grants expired."""
        keep = [item for item in self._items
                if _pending(item[2], item[3], acked_seq, now, unsent_through)]
        if len(keep) != len(self._items):
            self._items = keep
            self._starts = [item[0] for item in keep]
            self._longest = max((item[1] - item[0] for item in keep), default=0)


def _pending(seq: int, until: float, acked_seq: int, now: float, unsent_through: int) -> bool:
    """A range whose notice the node has not applied (not acknowledged yet, or dropped unsent)
    while its grants may still live."""
    return (seq > acked_seq or seq <= unsent_through) and until > now
