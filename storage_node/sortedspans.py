"""SortedSpans: the (offset, alloc_id) pairs of one segment's objects, in order, cheap to change.

Why not one sorted list
    The index finds the neighbours of every new allocation (does it overlap an entry the master
    freed?) and removes an entry on every free. With one Python list, `insert` and `del` move
    every item behind the position: O(n) per object, and a segment holds up to millions of
    objects, written into holes all over it once the cache is full (measured: 16k entries
    already add ~5 us to each first write). Here the items live in buckets of at most
    2 * BUCKET_ITEMS, with a list of each bucket's last item to bisect: an insert or a removal
    moves at most one bucket plus the bucket table (n / BUCKET_ITEMS entries).

Invariants
    Every bucket is non-empty and sorted; buckets are in order (each bucket's items are above
    the previous bucket's last item); `_maxes[b]` is `_buckets[b][-1]`. No duplicate items.

Not thread-safe: the index calls it with its lock held.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

Span = tuple[int, int]  # (offset in the segment, alloc id)

BUCKET_ITEMS = 512  # a bucket splits in two beyond twice this


class SortedSpans:
    __slots__ = ("_buckets", "_maxes", "_len")

    def __init__(self) -> None:
        self._buckets: list[list[Span]] = []
        self._maxes: list[Span] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Span]:
        for bucket in self._buckets:
            yield from bucket

    def add(self, item: Span) -> None:
        """Insert `item` (not present yet) at its place."""
        buckets, maxes = self._buckets, self._maxes
        self._len += 1
        if not buckets:
            buckets.append([item])
            maxes.append(item)
            return
        b = bisect_left(maxes, item)
        if b == len(buckets):  # beyond every item: the common case of a growing segment
            b -= 1
            buckets[b].append(item)
            maxes[b] = item
        else:
            insort(buckets[b], item)
        bucket = buckets[b]
        if len(bucket) > 2 * BUCKET_ITEMS:
            upper = bucket[BUCKET_ITEMS:]
            del bucket[BUCKET_ITEMS:]
            buckets.insert(b + 1, upper)
            maxes[b] = bucket[-1]
            maxes.insert(b + 1, upper[-1])

    def remove(self, item: Span) -> bool:
        """Remove `item`; False if it was not there."""
        buckets, maxes = self._buckets, self._maxes
        b = bisect_left(maxes, item)
        if b == len(buckets):
            return False
        bucket = buckets[b]
        i = bisect_left(bucket, item)
        if i == len(bucket) or bucket[i] != item:
            return False
        del bucket[i]
        self._len -= 1
        if not bucket:
            del buckets[b]
            del maxes[b]
        elif i == len(bucket):
            maxes[b] = bucket[-1]
        return True

    def before(self, item: Span) -> Span | None:
        """The greatest item below `item`, or None."""
        buckets = self._buckets
        b = bisect_left(self._maxes, item)  # first bucket with an item >= `item`
        if b < len(buckets):
            bucket = buckets[b]
            i = bisect_left(bucket, item)
            if i > 0:
                return bucket[i - 1]
        return buckets[b - 1][-1] if b > 0 else None

    def neighbours(self, item: Span) -> tuple[Span | None, Span | None]:
        """(the greatest item below `item`, the least item >= `item`), None where there is
        none, with one lookup: the index asks for both on the first write of every object."""
        buckets = self._buckets
        b = bisect_left(self._maxes, item)
        if b == len(buckets):
            return (buckets[b - 1][-1] if b > 0 else None), None
        bucket = buckets[b]
        i = bisect_left(bucket, item)
        if i > 0:
            return bucket[i - 1], bucket[i]
        return (buckets[b - 1][-1] if b > 0 else None), bucket[i]

    def from_(self, item: Span) -> Iterator[Span]:
        """The items >= `item`, in order. The caller must not change this object while it
        iterates (the index collects what to drop first, then drops it)."""
        buckets = self._buckets
        b = bisect_left(self._maxes, item)
        if b == len(buckets):
            return
        bucket = buckets[b]
        for i in range(bisect_left(bucket, item), len(bucket)):
            yield bucket[i]
        for b2 in range(b + 1, len(buckets)):
            yield from buckets[b2]
