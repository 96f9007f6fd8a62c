"""Segment offset allocator: where inside a segment each replica's bytes go.

What it owns
    The free/used map of one segment's offset space, ``[0, capacity_bytes)``. One
    ``SegmentAllocator`` per mounted segment; the master asks it for an offset when it places a
    replica and hands the offset back when the replica is dropped. It is pure bookkeeping: no I/O,
    no locks (the master mutates metadata from one asyncio loop), no clocks.

The invariant
    Every byte of ``[0, capacity_bytes)`` is in exactly one block, either allocated or free. Every
    offset and size is a multiple of ``SMALL_GRANULARITY_BYTES`` (64). No two free blocks are
    adjacent: ``free`` coalesces with both neighbours immediately, so a segment with nothing
    allocated is one free block of the whole capacity. Each free block sits in exactly one bin (the
    one its size maps to) and a bin's bit is set in the bitmaps iff the bin is non-empty.
    ``check_invariants`` verifies all of this in O(n); tests, the soak and the fault tests call it
    (through ``cellar.master.state.audit``), the hot path never does; ``alloc`` and ``free`` assert
    the O(1) part (bounds, alignment, no double hand-out, used bytes never negative).

Why TLSF (two-level segregated fit)
    The master places up to ~50k objects/s, so alloc and free must be O(1) and cheap in CPython.
    TLSF keeps free blocks in bins indexed by (first level = floor(log2(size)), second level = one
    of 32 linear subdivisions of that power-of-two range). Two bitmaps (plain ints) say which bins
    are non-empty, so "the smallest non-empty bin that is certain to fit" is two bit tricks
    (``(x & -x).bit_length()``), never a list walk. We round the request *up* to the next bin
    boundary before searching, so every block in the bin found fits and we take the most recently
    freed one without looking at sizes ("good fit"). Only when that finds nothing do we scan the
    bins below it that may still hold a fit, and then at most ``GOOD_FIT_SCAN_LIMIT`` misses, so
    the cost stays bounded; the price is that ``alloc`` can return None while a fitting block
    hides deeper in such a bin (the segment is then full to within one bin width, ~3%).
    32 subdivisions rather than 16: a bin then spans 1/32 of its power of two, so the blocks a
    guaranteed-fit search skips are at most ~3% smaller than needed instead of ~6%; uniform KV
    page sizes land in one narrow bin and pack tightly; a 32-bit second-level bitmap is still one
    cheap int op. Below 32 granules (2 KiB) the bins are exact: one bin per 64-byte size.

    Placement inside the chosen block: requests of ``PAGE_ALIGN_THRESHOLD_BYTES`` (256 KiB) or
    more are rounded to ``PAGE_BYTES`` and get a page-aligned offset carved from the *head* of the
    block (any unaligned leading fragment goes back to the free lists; the guaranteed-fit search
    asks for size + 4032 bytes, the worst-case padding); the data plane copies ~3x slower when
    source and destination disagree on page alignment, and client buffers are page-aligned.
    Smaller requests round to 64 bytes and are carved from the *tail*, so the head of a large free
    region stays page-aligned and the next large request needs no padding.

    ``largest_free_block_bytes`` reads a cache (the largest free size and how many blocks have
    it) kept with a compare or two per operation; only after the last block of that size is
    taken does the next call recompute it, from the top non-empty bin.

What it must never do
    It never touches payload bytes (it does not even know where the memory is). It does not know
    about quarantine: a freed range is reusable the moment ``free`` returns, so callers must delay
    ``free`` until every write grant that could still land in the range has expired. It never
    corrupts its state on bad input: a bad ``free`` raises ``KeyError``, a bad size raises
    ``ValueError``, a non-int raises ``TypeError``, and nothing changes before the input has been
    checked.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["SegmentAllocator"]

# Sizes are kept in bytes; the bin mapping works on 64-byte granules.
_GRANULE_SHIFT = 6
_SL_LOG2 = 5  # 32 second-level subdivisions per power of two
_SL_COUNT = 1 << _SL_LOG2
_SL_MASK = _SL_COUNT - 1
_SL_BITS_AT_OR_ABOVE = tuple(-1 << sl for sl in range(_SL_COUNT))
# Largest capacity accepted (4 EiB). Also the "largest free block unknown" sentinel: no free block
# can be this big, so the `size >= largest` test on the insert path never fires while it is set.
_MAX_CAPACITY_BYTES = 1 << 62
_LARGEST_UNKNOWN = _MAX_CAPACITY_BYTES


def _bin_index(size_bytes: int) -> int:
    """Flat bin index (first_level * 32 + second_level) of the bin holding a free block of this size.

    Sizes below 32 granules (2 KiB) have exact bins in first level 0; above that, first level
    ``fl`` covers ``[32 << (fl - 1), 64 << (fl - 1))`` granules in 32 equal steps. The one copy
    of the formula; `alloc` inlines only the round-up variant (its comment has the figure).
    """
    granules = size_bytes >> _GRANULE_SHIFT
    if granules < _SL_COUNT:
        return granules
    top_bit = granules.bit_length() - 1
    return ((top_bit - _SL_LOG2 + 1) << _SL_LOG2) | ((granules >> (top_bit - _SL_LOG2)) - _SL_COUNT)


def _bin_index_round_up(size_bytes: int) -> int:
    """Index of the first bin in which every block is >= size_bytes (the guaranteed-fit bin)."""
    granules = size_bytes >> _GRANULE_SHIFT
    if granules < _SL_COUNT:
        return granules
    granules += (1 << (granules.bit_length() - 1 - _SL_LOG2)) - 1
    return _bin_index(granules << _GRANULE_SHIFT)


class SegmentAllocator:
    """Offset allocator for one segment of `capacity_bytes`. Pure logic, no I/O, no locks (used from one asyncio loop)."""

    SMALL_GRANULARITY_BYTES = 64  # every offset and size is a multiple of this
    PAGE_BYTES = 4096
    # Requests >= this get page-aligned offsets and sizes rounded to PAGE_BYTES.
    PAGE_ALIGN_THRESHOLD_BYTES = 256 * 1024
    # Upper bound on blocks examined by the fallback scan below the guaranteed-fit bin.
    GOOD_FIT_SCAN_LIMIT = 16

    __slots__ = (
        "_capacity_bytes",
        "_used_bytes",
        "_allocated",  # live allocation offset -> reserved size
        "_free_start",  # free block start -> size
        "_free_end",  # free block end (exclusive) -> start
        "_bins",  # flat bin index -> {start: size}, insertion-ordered, used LIFO
        "_sl_bitmaps",  # first level -> bitmap of its non-empty second-level bins
        "_fl_bitmap",  # bitmap of first levels that have a non-empty bin
        "_level_count",  # first levels in use (one spare beyond the capacity's own level)
        "_largest_bytes",  # largest free block size, or _LARGEST_UNKNOWN
        "_largest_count",  # how many free blocks have exactly _largest_bytes
        "_sorted_free_starts",  # sorted free starts kept across reserve() calls; None when stale
    )

    def __init__(self, capacity_bytes: int) -> None:
        if type(capacity_bytes) is not int:
            raise TypeError(f"capacity_bytes must be an int, got {type(capacity_bytes).__name__}")
        capacity_bytes &= -self.SMALL_GRANULARITY_BYTES
        if capacity_bytes < self.SMALL_GRANULARITY_BYTES:
            raise ValueError(
                f"capacity_bytes must be >= {self.SMALL_GRANULARITY_BYTES}, got {capacity_bytes}"
            )
        if capacity_bytes >= _MAX_CAPACITY_BYTES:
            raise ValueError(
                f"capacity_bytes must be < {_MAX_CAPACITY_BYTES}, got {capacity_bytes}"
            )
        self._capacity_bytes = capacity_bytes
        self._used_bytes = 0
        self._allocated: dict[int, int] = {}
        self._free_start: dict[int, int] = {0: capacity_bytes}
        self._free_end: dict[int, int] = {capacity_bytes: 0}
        # One spare first level: rounding a size <= capacity up can land one level higher.
        self._level_count = (_bin_index(capacity_bytes) >> _SL_LOG2) + 2
        self._bins: list[dict[int, int]] = [{} for _ in range(self._level_count << _SL_LOG2)]
        self._sl_bitmaps: list[int] = [0] * self._level_count
        self._fl_bitmap = 0
        self._largest_bytes = 0
        self._largest_count = 0
        self._sorted_free_starts: list[int] | None = None
        self._bin_insert(0, capacity_bytes)

    # ------------------------------------------------------------------ public API

    @staticmethod
    def rounded_size(nbytes: int) -> int:
        """Bytes actually reserved for a request of `nbytes` (> 0); ValueError on <= 0."""
        if type(nbytes) is not int:
            raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        if nbytes >= SegmentAllocator.PAGE_ALIGN_THRESHOLD_BYTES:
            return (nbytes + SegmentAllocator.PAGE_BYTES - 1) & -SegmentAllocator.PAGE_BYTES
        return (nbytes + SegmentAllocator.SMALL_GRANULARITY_BYTES - 1) & -SegmentAllocator.SMALL_GRANULARITY_BYTES

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a new block of rounded_size(nbytes), or None if no free block fits.

        None means no block reaches the guaranteed-fit bin and the bounded scan below it found
        none either (see the module docstring); nothing is changed in that case.
        """
        # Hot path. Inlined here, and only here: rounded_size (a call is ~45 ns) and the
        # guaranteed-fit bin (`_bin_index_round_up`: two nested calls, ~100 ns of ~1.35 us per
        # alloc, 7%; interleaved alloc/free rounds, 20k live mixed sizes). Every other bin index
        # calls `_bin_index` (~40 ns per call, under 5%: not worth a second copy of the formula).
        if type(nbytes) is not int:
            raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        page_aligned = nbytes >= 262144  # PAGE_ALIGN_THRESHOLD_BYTES
        if page_aligned:
            size = (nbytes + 4095) & -4096
            need = size + 4032  # worst case padding from a 64-byte boundary to a page boundary
        else:
            size = need = (nbytes + 63) & -64
        if size > self._capacity_bytes - self._used_bytes:
            return None

        # Guaranteed-fit bin: every block in it, or in any bin above it, is >= need.
        granules = need >> 6
        if granules < 32:
            want_idx = granules
        else:
            granules += (1 << (granules.bit_length() - 6)) - 1
            top_bit = granules.bit_length() - 1
            want_idx = ((top_bit - 4) << 5) | ((granules >> (top_bit - 5)) - 32)
        fl = want_idx >> 5
        found = -1
        sl_bitmaps = self._sl_bitmaps
        if fl < self._level_count:
            bits = sl_bitmaps[fl] & _SL_BITS_AT_OR_ABOVE[want_idx & 31]
            if bits:
                found = (fl << 5) | ((bits & -bits).bit_length() - 1)
            else:
                bits = self._fl_bitmap >> (fl + 1)
                if bits:
                    fl += (bits & -bits).bit_length()
                    bits = sl_bitmaps[fl]
                    found = (fl << 5) | ((bits & -bits).bit_length() - 1)
        bins = self._bins
        if found >= 0:
            found_bin = bins[found]
            start, block_bytes = found_bin.popitem()
        else:
            found, start, block_bytes = self._good_fit_scan(size, page_aligned, want_idx)
            if found < 0:
                return None
            found_bin = bins[found]
            del found_bin[start]
        if block_bytes == self._largest_bytes:
            self._largest_count -= 1
            if not self._largest_count:
                self._largest_bytes = _LARGEST_UNKNOWN

        # Carve [offset, offset + size) out of [start, end); the rest stays free. The bitmaps of
        # the bin we took from are fixed up last, since a remainder may land back in it.
        free_start = self._free_start
        free_end = self._free_end
        end = start + block_bytes
        if page_aligned:
            # From the head, page-aligned: [start, offset) lead | [offset, rest) used | tail.
            offset = (start + 4095) & -4096
            if offset == start:
                del free_start[start]
            else:
                free_start[start] = offset - start
                free_end[offset] = start
                self._bin_insert(start, offset - start)
            rest = offset + size
            if rest == end:
                rest_bytes = 0
                del free_end[end]
            else:
                rest_bytes = end - rest
                free_start[rest] = rest_bytes
                free_end[end] = rest
        else:
            # From the tail, so the head of a big free region stays page-aligned.
            offset = end - size
            del free_end[end]
            if offset == start:
                rest_bytes = 0
                del free_start[start]
            else:
                rest = start
                rest_bytes = offset - start
                free_start[start] = rest_bytes
                free_end[offset] = start
        if rest_bytes:
            # Inlined _bin_insert(rest, rest_bytes).
            idx = _bin_index(rest_bytes)
            bin_ = bins[idx]
            bin_[rest] = rest_bytes
            if len(bin_) == 1:
                sl_bitmaps[idx >> 5] |= 1 << (idx & 31)
                self._fl_bitmap |= 1 << (idx >> 5)
            # No largest-block update: rest_bytes < block_bytes <= the cached largest.
        if not found_bin:
            fl = found >> 5
            sl_bitmaps[fl] &= ~(1 << (found & 31))
            if not sl_bitmaps[fl]:
                self._fl_bitmap &= ~(1 << fl)

        # Cheap checks of what a bug here would break silently (they run in production; the
        # O(n) check_invariants runs in tests, the soak and the fault tests).
        assert not offset & 63 and offset + size <= self._capacity_bytes and offset not in self._allocated, \
            f"alloc carved [{offset}, +{size}) off a 64-byte boundary, past the end or over a live block"
        self._allocated[offset] = size
        self._used_bytes += size
        self._sorted_free_starts = None
        return offset

    def reserve(self, offset: int, nbytes: int) -> bool:
        """Mark exactly [offset, offset + rounded_size(nbytes)) used if all of it is free.

        Rebuilds state from a storage node's index after a master restart. Returns False, changing
        nothing, if any part of the range is allocated or outside the segment. The offset must be
        a multiple of 64 (ValueError otherwise); large blocks need not be page-aligned, because a
        restored block stays wherever the node has it.
        """
        size = self.rounded_size(nbytes)
        if type(offset) is not int:
            raise TypeError(f"offset must be an int, got {type(offset).__name__}")
        if offset & (self.SMALL_GRANULARITY_BYTES - 1):
            raise ValueError(
                f"offset must be a multiple of {self.SMALL_GRANULARITY_BYTES}, got {offset}"
            )
        end = offset + size
        if offset < 0 or end > self._capacity_bytes:
            return False
        # Find the free block holding offset. A rebuilding master calls reserve many times in a
        # row: the sorted list of free starts survives across those calls and is patched in place;
        # alloc and free mark it stale.
        starts = self._sorted_free_starts
        if starts is None:
            starts = self._sorted_free_starts = sorted(self._free_start)
        pos = bisect_right(starts, offset) - 1
        if pos < 0:
            return False
        block_start = starts[pos]
        block_end = block_start + self._free_start[block_start]
        if end > block_end:
            return False  # offset is in a used block, or the range runs into one
        self._bin_remove(block_start, block_end - block_start)
        if block_start < offset:
            self._free_start[block_start] = offset - block_start
            self._free_end[offset] = block_start
            self._bin_insert(block_start, offset - block_start)
            pos += 1
        else:
            del self._free_start[block_start]
            del starts[pos]
        if end < block_end:
            self._free_start[end] = block_end - end
            self._free_end[block_end] = end
            self._bin_insert(end, block_end - end)
            starts.insert(pos, end)
        else:
            del self._free_end[block_end]
        self._allocated[offset] = size
        self._used_bytes += size
        return True

    def free(self, offset: int) -> int:
        """Free the block allocated at `offset` and return its reserved size.

        KeyError if `offset` is not the start of a live allocation; nothing changes in that case.
        """
        if type(offset) is not int:
            raise TypeError(f"offset must be an int, got {type(offset).__name__}")
        size = self._allocated.pop(offset, None)
        if size is None:
            raise KeyError(offset)
        self._used_bytes -= size
        assert self._used_bytes >= 0, "free gave back more bytes than were allocated"
        self._sorted_free_starts = None
        free_start = self._free_start
        free_end = self._free_end
        bins = self._bins
        sl_bitmaps = self._sl_bitmaps
        end = offset + size
        left_start = free_end.pop(offset, None)
        right_bytes = free_start.pop(end, None)

        if right_bytes is not None:
            # Absorb the right neighbour [end, end + right_bytes): out of its bin.
            idx = _bin_index(right_bytes)
            bin_ = bins[idx]
            del bin_[end]
            if not bin_:
                sl_bitmaps[idx >> 5] &= ~(1 << (idx & 31))
                if not sl_bitmaps[idx >> 5]:
                    self._fl_bitmap &= ~(1 << (idx >> 5))
            end += right_bytes

        if left_start is not None:
            # Grow the left neighbour in place; it keeps its start.
            start = left_start
            left_bytes = free_start[start]
            merged_bytes = end - start
            left_idx = _bin_index(left_bytes)
        else:
            start = offset
            merged_bytes = end - offset
            left_idx = -1
        free_start[start] = merged_bytes
        free_end[end] = start

        idx = _bin_index(merged_bytes)
        bin_ = bins[idx]
        bin_[start] = merged_bytes
        if idx != left_idx:
            if len(bin_) == 1:
                sl_bitmaps[idx >> 5] |= 1 << (idx & 31)
                self._fl_bitmap |= 1 << (idx >> 5)
            if left_idx >= 0:
                left_bin = bins[left_idx]
                del left_bin[start]
                if not left_bin:
                    sl_bitmaps[left_idx >> 5] &= ~(1 << (left_idx & 31))
                    if not sl_bitmaps[left_idx >> 5]:
                        self._fl_bitmap &= ~(1 << (left_idx >> 5))
        # The largest-block cache needs no decrement for the absorbed neighbours: the merged
        # block is strictly bigger than either, so if one was the largest it is replaced here.
        if merged_bytes >= self._largest_bytes:
            if merged_bytes == self._largest_bytes:
                self._largest_count += 1
            else:
                self._largest_bytes = merged_bytes
                self._largest_count = 1
        return size

    def allocated_size(self, offset: int) -> int:
        """The reserved size of the live allocation at `offset`, 0 if there is none."""
        return self._allocated.get(offset, 0)

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def used_bytes(self) -> int:
        """Sum of reserved (rounded) sizes of live allocations."""
        return self._used_bytes

    @property
    def free_bytes(self) -> int:
        return self._capacity_bytes - self._used_bytes

    @property
    def allocation_count(self) -> int:
        return len(self._allocated)

    @property
    def free_block_count(self) -> int:
        """Number of free blocks: 1 when nothing is allocated; a fragmentation gauge."""
        return len(self._free_start)

    def largest_free_block_bytes(self) -> int:
        """Size of the largest free block, 0 if there is none.

        O(1) from a cache (the largest size and how many free blocks have it). When the last
        block of that size is taken the cache goes stale, and the next call finds the top
        non-empty bin from the bitmaps (O(levels)) and takes the max of that one bin.
        """
        largest = self._largest_bytes
        if largest != _LARGEST_UNKNOWN:
            return largest
        if not self._fl_bitmap:
            largest = count = 0
        else:
            fl = self._fl_bitmap.bit_length() - 1
            sl = self._sl_bitmaps[fl].bit_length() - 1
            sizes = list(self._bins[(fl << _SL_LOG2) | sl].values())
            largest = max(sizes)
            count = sizes.count(largest)
        self._largest_bytes = largest
        self._largest_count = count
        return largest

    def check_invariants(self) -> None:
        """O(n) self-check for tests; raises AssertionError (also under python -O) on violation."""
        granule = self.SMALL_GRANULARITY_BYTES
        capacity = self._capacity_bytes
        _require(capacity % granule == 0 and capacity >= granule, "capacity not granular")
        used = 0
        for offset, size in self._allocated.items():
            _require(size > 0 and size % granule == 0, f"bad allocated size {size} at {offset}")
            _require(offset % granule == 0, f"allocated offset {offset} not granular")
            used += size
        _require(used == self._used_bytes, f"used_bytes {self._used_bytes} != sum {used}")

        free_start = self._free_start
        free_end = self._free_end
        _require(len(free_end) == len(free_start), "free_end and free_start sizes differ")
        free_total = 0
        for start, size in free_start.items():
            _require(size > 0 and size % granule == 0, f"bad free size {size} at {start}")
            _require(start % granule == 0, f"free start {start} not granular")
            _require(free_end.get(start + size) == start, f"free_end lacks block {start}")
            _require(start not in self._allocated, f"block {start} both free and allocated")
            free_total += size
        _require(free_total == capacity - used, f"free {free_total} != capacity - used {used}")

        # Allocated and free blocks tile [0, capacity); no two free blocks touch.
        blocks = sorted(
            [(s, n, False) for s, n in self._allocated.items()]
            + [(s, n, True) for s, n in free_start.items()]
        )
        cursor = 0
        previous_free = False
        for start, size, is_free in blocks:
            _require(start == cursor, f"gap or overlap at {cursor} (next block at {start})")
            _require(not (is_free and previous_free), f"adjacent free blocks at {start}")
            cursor = start + size
            previous_free = is_free
        _require(cursor == capacity, f"blocks end at {cursor}, capacity is {capacity}")

        # Every free block in exactly its bin; bitmaps say exactly which bins are non-empty.
        binned = 0
        fl_bitmap = 0
        for idx, bin_ in enumerate(self._bins):
            fl, sl = idx >> _SL_LOG2, idx & _SL_MASK
            _require(bool(self._sl_bitmaps[fl] >> sl & 1) == bool(bin_), f"bitmap bit {idx} wrong")
            for start, size in bin_.items():
                _require(free_start.get(start) == size, f"binned block {start} is not free")
                _require(_bin_index(size) == idx, f"block {start} ({size} B) in wrong bin {idx}")
            binned += len(bin_)
            if bin_:
                fl_bitmap |= 1 << fl
        _require(binned == len(free_start), "free blocks missing from the bins")
        _require(fl_bitmap == self._fl_bitmap, "first-level bitmap disagrees with the bins")

        if self._largest_bytes != _LARGEST_UNKNOWN:
            sizes = list(free_start.values())
            largest = max(sizes, default=0)
            _require(self._largest_bytes == largest, "largest free block cache is wrong")
            _require(self._largest_count == sizes.count(largest), "largest count is wrong")
        if self._sorted_free_starts is not None:
            _require(self._sorted_free_starts == sorted(free_start), "reserve index is stale")

    def __repr__(self) -> str:
        return (
            f"SegmentAllocator(capacity_bytes={self._capacity_bytes}, used_bytes={self._used_bytes},"
            f" allocations={len(self._allocated)}, free_blocks={len(self._free_start)})"
        )

    # ------------------------------------------------------------------ internals

    def _good_fit_scan(
        self, size: int, page_aligned: bool, guaranteed_idx: int
    ) -> tuple[int, int, int]:
        """Bounded look below the guaranteed-fit bin for a block that happens to fit.

        Blocks there may be smaller than the request, so each is checked, with the padding a
        page-aligned request needs. At most GOOD_FIT_SCAN_LIMIT misses, over at most three bins
        (the request's own, and for page-aligned requests the ones its padding reaches).
        Returns (bin index, start, size), or (-1, 0, 0).
        """
        bins = self._bins
        misses_left = self.GOOD_FIT_SCAN_LIMIT
        for idx in range(_bin_index(size), min(guaranteed_idx, len(bins))):
            bin_ = bins[idx]
            for start in reversed(bin_):  # newest first, like popitem()
                block_bytes = bin_[start]
                pad = (-start & 4095) if page_aligned else 0
                if block_bytes >= size + pad:
                    return idx, start, block_bytes
                misses_left -= 1
                if not misses_left:
                    return -1, 0, 0
        return -1, 0, 0

    def _bin_insert(self, start: int, size: int) -> None:
        """Put free block [start, start + size) in its bin (free_start/free_end are the caller's)."""
        idx = _bin_index(size)
        bin_ = self._bins[idx]
        bin_[start] = size
        if len(bin_) == 1:
            self._sl_bitmaps[idx >> _SL_LOG2] |= 1 << (idx & _SL_MASK)
            self._fl_bitmap |= 1 << (idx >> _SL_LOG2)
        if size >= self._largest_bytes:
            if size == self._largest_bytes:
                self._largest_count += 1
            else:
                self._largest_bytes = size
                self._largest_count = 1

    def _bin_remove(self, start: int, size: int) -> None:
        """Take free block [start, start + size) out of its bin (free_start/free_end: caller's)."""
        idx = _bin_index(size)
        bin_ = self._bins[idx]
        del bin_[start]
        if not bin_:
            fl = idx >> _SL_LOG2
            self._sl_bitmaps[fl] &= ~(1 << (idx & _SL_MASK))
            if not self._sl_bitmaps[fl]:
                self._fl_bitmap &= ~(1 << fl)
        if size == self._largest_bytes:
            self._largest_count -= 1
            if not self._largest_count:
                self._largest_bytes = _LARGEST_UNKNOWN


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
