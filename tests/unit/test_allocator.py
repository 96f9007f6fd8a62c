"""Unit tests for cellar.master.state.allocator.SegmentAllocator (pure logic, no I/O).

The random tests drive the allocator and a deliberately simple model (a sorted list of used
intervals) side by side and compare them after every operation; check_invariants() runs every few
dozen operations. The utilisation tests pin the packing promise for uniform KV page sizes.
"""

from __future__ import annotations

import random
from bisect import bisect_right, insort

import pytest

from cellar.master.state.allocator import SegmentAllocator, _bin_index, _bin_index_round_up

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
THRESHOLD = SegmentAllocator.PAGE_ALIGN_THRESHOLD_BYTES
PAGE = SegmentAllocator.PAGE_BYTES
GRANULE = SegmentAllocator.SMALL_GRANULARITY_BYTES


class UsedModel:
    """Used intervals kept as a sorted list of starts plus start -> end."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.starts: list[int] = []
        self.end_of: dict[int, int] = {}
        self.used_bytes = 0

    def overlaps(self, start: int, end: int) -> bool:
        i = bisect_right(self.starts, start) - 1
        if i >= 0 and self.end_of[self.starts[i]] > start:
            return True
        return i + 1 < len(self.starts) and self.starts[i + 1] < end

    def add(self, start: int, size: int) -> None:
        assert start >= 0 and start + size <= self.capacity_bytes, (start, size)
        assert not self.overlaps(start, start + size), (start, size)
        insort(self.starts, start)
        self.end_of[start] = start + size
        self.used_bytes += size

    def remove(self, start: int) -> int:
        size = self.end_of.pop(start) - start
        del self.starts[bisect_right(self.starts, start) - 1]
        self.used_bytes -= size
        return size

    def largest_gap(self) -> int:
        largest = 0
        cursor = 0
        for start in self.starts:
            largest = max(largest, start - cursor)
            cursor = self.end_of[start]
        return max(largest, self.capacity_bytes - cursor)


def snapshot(allocator: SegmentAllocator) -> tuple:
    """Everything observable about the allocator's state, to prove a failed call changed nothing."""
    return (
        allocator.used_bytes,
        allocator.free_bytes,
        allocator.allocation_count,
        allocator.free_block_count,
        allocator.largest_free_block_bytes(),
        sorted(allocator._allocated.items()),
        sorted(allocator._free_start.items()),
    )


def draw_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.45:
        return rng.randint(1, 4 * KIB)
    if r < 0.75:
        return rng.randint(4 * KIB, THRESHOLD - 1)
    if r < 0.8:
        return rng.choice([THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 64, 65, 63])
    return rng.randint(THRESHOLD, 3 * MIB)


def check_against_model(allocator: SegmentAllocator, model: UsedModel) -> None:
    allocator.check_invariants()
    assert allocator.used_bytes == model.used_bytes
    assert allocator.free_bytes == allocator.capacity_bytes - model.used_bytes
    assert allocator.allocation_count == len(model.starts)
    assert allocator.largest_free_block_bytes() == model.largest_gap()


# ---------------------------------------------------------------- sizes and bins


def test_rounded_size_rules() -> None:
    assert SegmentAllocator.rounded_size(1) == 64
    assert SegmentAllocator.rounded_size(64) == 64
    assert SegmentAllocator.rounded_size(65) == 128
    assert SegmentAllocator.rounded_size(THRESHOLD - 1) == THRESHOLD
    assert SegmentAllocator.rounded_size(THRESHOLD - 65) == THRESHOLD - 64
    assert SegmentAllocator.rounded_size(THRESHOLD) == THRESHOLD
    assert SegmentAllocator.rounded_size(THRESHOLD + 1) == THRESHOLD + PAGE
    rng = random.Random(7)
    for _ in range(2000):
        nbytes = rng.randint(1, 64 * MIB)
        size = SegmentAllocator.rounded_size(nbytes)
        assert size >= nbytes
        assert size % (PAGE if nbytes >= THRESHOLD else GRANULE) == 0
        assert size - nbytes < (PAGE if nbytes >= THRESHOLD else GRANULE)
        # Rounding is idempotent, so an index can be replayed with reserved sizes.
        assert SegmentAllocator.rounded_size(size) == size


def _bin_min_bytes(idx: int) -> int:
    fl, sl = idx >> 5, idx & 31
    granules = idx if fl == 0 else (32 + sl) << (fl - 1)
    return granules * GRANULE


def test_bin_mapping_guarantees_fit() -> None:
    rng = random.Random(3)
    sizes = [g * GRANULE for g in range(1, 1 << 14)]
    sizes += [rng.randint(1, 1 << 40) * GRANULE for _ in range(5000)]
    for size in sizes:
        idx = _bin_index(size)
        assert _bin_min_bytes(idx) <= size < _bin_min_bytes(idx + 1)
        up = _bin_index_round_up(size)
        # Every block in the guaranteed bin (or above) fits, and it is at most one bin up.
        assert _bin_min_bytes(up) >= size
        assert idx <= up <= idx + 1
        assert (up == idx) == (_bin_min_bytes(idx) == size)


# ---------------------------------------------------------------- construction and bad input


def test_capacity_rounds_down_and_rejects_tiny() -> None:
    assert SegmentAllocator(100).capacity_bytes == 64
    assert SegmentAllocator(GIB + 63).capacity_bytes == GIB
    for bad in (0, 63, -4096):
        with pytest.raises(ValueError):
            SegmentAllocator(bad)
    with pytest.raises(TypeError):
        SegmentAllocator(1.5e9)  # type: ignore[arg-type]


def test_fresh_allocator_is_one_free_block() -> None:
    allocator = SegmentAllocator(256 * MIB + 100)
    allocator.check_invariants()
    assert allocator.capacity_bytes == 256 * MIB + 64
    assert allocator.used_bytes == 0
    assert allocator.free_bytes == allocator.capacity_bytes
    assert allocator.allocation_count == 0
    assert allocator.free_block_count == 1
    assert allocator.largest_free_block_bytes() == allocator.capacity_bytes


def test_bad_sizes_raise() -> None:
    allocator = SegmentAllocator(MIB)
    before = snapshot(allocator)
    for bad in (0, -1, -(1 << 40)):
        with pytest.raises(ValueError):
            allocator.alloc(bad)
        with pytest.raises(ValueError):
            SegmentAllocator.rounded_size(bad)
        with pytest.raises(ValueError):
            allocator.reserve(0, bad)
    for bad_type in (1.0, "64", None):
        with pytest.raises(TypeError):
            allocator.alloc(bad_type)  # type: ignore[arg-type]
    assert snapshot(allocator) == before


def test_too_large_returns_none() -> None:
    allocator = SegmentAllocator(4 * MIB)
    before = snapshot(allocator)
    assert allocator.alloc(4 * MIB + 1) is None
    assert allocator.alloc(1 << 80) is None
    assert snapshot(allocator) == before
    assert allocator.alloc(4 * MIB) == 0  # the whole segment, page-aligned at 0
    assert allocator.free_bytes == 0
    assert allocator.largest_free_block_bytes() == 0
    assert allocator.alloc(1) is None
    allocator.check_invariants()
    assert allocator.free(0) == 4 * MIB
    assert allocator.largest_free_block_bytes() == 4 * MIB


def test_free_unknown_offset_raises_and_changes_nothing() -> None:
    allocator = SegmentAllocator(8 * MIB)
    small = allocator.alloc(1000)
    large = allocator.alloc(THRESHOLD)
    assert small is not None and large is not None
    allocator.free(small)
    before = snapshot(allocator)
    for bad in (small, large + 64, large + PAGE, 8 * MIB, -64, 1 << 70, 64):
        with pytest.raises(KeyError):
            allocator.free(bad)
        assert snapshot(allocator) == before
    for bad_type in (float(large), str(large), None, True):
        with pytest.raises(TypeError):
            allocator.free(bad_type)  # type: ignore[arg-type]
        assert snapshot(allocator) == before
    allocator.check_invariants()
    assert allocator.free(large) == THRESHOLD
    with pytest.raises(KeyError):
        allocator.free(large)  # double free
    assert allocator.free_block_count == 1


def test_reserve_over_used_or_out_of_range_changes_nothing() -> None:
    allocator = SegmentAllocator(4 * MIB)
    assert allocator.reserve(MIB, 64 * KIB)
    allocator.check_invariants()
    before = snapshot(allocator)
    for offset, nbytes in (
        (MIB, 64),  # same start
        (MIB + 64 * KIB - 64, 64),  # last granule of the used block
        (MIB - 64, 128),  # runs into it from the left
        (MIB - 64 * KIB, 256 * KIB),  # covers it
        (0, 4 * MIB),  # the whole segment
        (-64, 64),  # out of range
        (4 * MIB, 64),
        (4 * MIB - 64, 128),
    ):
        assert allocator.reserve(offset, nbytes) is False, (offset, nbytes)
        assert snapshot(allocator) == before
    with pytest.raises(ValueError):
        allocator.reserve(100, 64)  # not a multiple of 64
    with pytest.raises(TypeError):
        allocator.reserve(64.0, 64)  # type: ignore[arg-type]
    assert snapshot(allocator) == before
    # Right next to it on both sides is fine, and leaves no free fragment between.
    assert allocator.reserve(MIB - 64, 64)
    assert allocator.reserve(MIB + 64 * KIB, 100)
    allocator.check_invariants()
    assert allocator.free_block_count == 2


def test_reserve_index_follows_alloc_and_free() -> None:
    allocator = SegmentAllocator(8 * MIB)
    assert allocator.reserve(0, 64 * KIB)
    assert allocator.reserve(MIB, 64 * KIB)
    large = allocator.alloc(THRESHOLD)  # carved from the head: a free block changes its start
    assert large == 64 * KIB
    allocator.check_invariants()
    assert allocator.reserve(large, 64) is False
    assert allocator.reserve(large + THRESHOLD, 64)
    allocator.free(MIB)
    assert allocator.reserve(MIB + 64, 64)
    allocator.check_invariants()
    assert allocator.reserve(MIB, 128) is False


# ---------------------------------------------------------------- placement rules


def test_large_requests_are_page_aligned_even_from_unaligned_blocks() -> None:
    allocator = SegmentAllocator(MIB)
    assert allocator.reserve(64, 64)  # free blocks are now [0, 64) and [128, 1 MiB)
    offset = allocator.alloc(THRESHOLD)
    assert offset == PAGE  # the leading fragment [128, 4096) went back to the free lists
    allocator.check_invariants()
    assert allocator.free_block_count == 3
    odd = allocator.alloc(THRESHOLD + 1)
    assert odd is not None and odd % PAGE == 0
    assert allocator.used_bytes == 64 + THRESHOLD + THRESHOLD + PAGE
    allocator.free(offset)
    allocator.free(odd)
    allocator.free(64)
    allocator.check_invariants()
    assert allocator.free_block_count == 1


def test_scan_counts_alignment_padding() -> None:
    capacity_bytes = PAGE + THRESHOLD + 64
    allocator = SegmentAllocator(capacity_bytes)
    # Leave one free block [64, 256 KiB + 128): big enough for 256 KiB, but not once its start
    # is padded up to a page boundary.
    assert allocator.reserve(0, 64)
    assert allocator.reserve(THRESHOLD + 128, capacity_bytes - THRESHOLD - 128)
    assert allocator.free_block_count == 1
    before = snapshot(allocator)
    assert allocator.alloc(THRESHOLD) is None
    assert snapshot(allocator) == before
    # Widen it to [64, 4096 + 256 KiB): now it fits exactly at 4096.
    allocator.free(THRESHOLD + 128)
    assert allocator.reserve(PAGE + THRESHOLD, 64)
    assert allocator.alloc(THRESHOLD) == PAGE
    allocator.check_invariants()
    assert allocator.free_block_count == 1  # the leading fragment [64, 4096)


def test_small_requests_carve_the_tail_and_keep_the_head_aligned() -> None:
    allocator = SegmentAllocator(4 * MIB)
    small = allocator.alloc(100)
    assert small == 4 * MIB - 128
    large = allocator.alloc(THRESHOLD)
    assert large == 0
    allocator.check_invariants()


def test_exact_fit_holes_are_found_by_the_bounded_scan() -> None:
    # 100 KiB + 64 is not on a bin boundary, so a hole of exactly that size sits below the
    # guaranteed-fit bin; only the fallback scan can hand it out.
    size = 100 * KIB + 64
    assert _bin_index_round_up(size) == _bin_index(size) + 1
    allocator = SegmentAllocator(64 * MIB)
    offsets = []
    while (offset := allocator.alloc(size)) is not None:
        offsets.append(offset)
    full = allocator.used_bytes
    for offset in offsets[::2]:
        allocator.free(offset)
    allocator.check_invariants()
    refilled = 0
    while allocator.alloc(size) is not None:
        refilled += 1
    assert refilled == len(offsets[::2])
    assert allocator.used_bytes == full
    allocator.check_invariants()


# ---------------------------------------------------------------- random sequences vs the model


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_alloc_free_reserve_against_model(seed: int) -> None:
    rng = random.Random(seed)
    capacity_bytes = 48 * MIB + rng.randrange(0, 4096)
    allocator = SegmentAllocator(capacity_bytes)
    model = UsedModel(allocator.capacity_bytes)
    live: list[int] = []
    failed_allocs = 0
    for step in range(6000):
        r = rng.random()
        if r < 0.52 or not live:
            nbytes = draw_size(rng)
            size = SegmentAllocator.rounded_size(nbytes)
            offset = allocator.alloc(nbytes)
            if offset is None:
                failed_allocs += 1
                # TLSF promise: if any free block reaches the guaranteed-fit bin, alloc succeeds.
                need = size + (PAGE - GRANULE if nbytes >= THRESHOLD else 0)
                largest = allocator.largest_free_block_bytes()
                assert _bin_index(largest) < _bin_index_round_up(need) or size > largest
            else:
                assert offset % GRANULE == 0
                if nbytes >= THRESHOLD:
                    assert offset % PAGE == 0 and size % PAGE == 0
                model.add(offset, size)  # asserts in bounds and no overlap
                live.append(offset)
        elif r < 0.95:
            offset = live.pop(rng.randrange(len(live)))
            assert allocator.free(offset) == model.remove(offset)
        else:
            nbytes = draw_size(rng)
            size = SegmentAllocator.rounded_size(nbytes)
            offset = rng.randrange(-4, capacity_bytes // GRANULE + 4) * GRANULE
            expected = (
                offset >= 0
                and offset + size <= allocator.capacity_bytes
                and not model.overlaps(offset, offset + size)
            )
            before = None if expected else snapshot(allocator)
            assert allocator.reserve(offset, nbytes) is expected
            if expected:
                model.add(offset, size)
                live.append(offset)
            else:
                assert snapshot(allocator) == before
        if step % 25 == 0:
            check_against_model(allocator, model)
    check_against_model(allocator, model)
    assert failed_allocs > 0, "the sequence should have run the segment full at some point"

    for offset in live:
        assert allocator.free(offset) == model.remove(offset)
    check_against_model(allocator, model)
    assert allocator.free_block_count == 1
    assert allocator.largest_free_block_bytes() == allocator.capacity_bytes
    assert allocator.used_bytes == 0


def test_rebuild_with_reserve_reproduces_the_same_layout() -> None:
    rng = random.Random(11)
    original = SegmentAllocator(64 * MIB)
    index: dict[int, int] = {}  # what a storage node would report: offset -> object size
    for _ in range(3000):
        if index and rng.random() < 0.4:
            offset = rng.choice(list(index))
            del index[offset]
            original.free(offset)
        else:
            nbytes = draw_size(rng)
            offset = original.alloc(nbytes)
            if offset is not None:
                index[offset] = nbytes
    original.check_invariants()

    for order in ("sorted", "shuffled"):
        entries = sorted(index.items())
        if order == "shuffled":
            rng.shuffle(entries)
        rebuilt = SegmentAllocator(64 * MIB)
        for i, (offset, nbytes) in enumerate(entries):
            assert rebuilt.reserve(offset, nbytes)
            assert not rebuilt.reserve(offset, nbytes)  # already used now
            if i % 500 == 0:
                rebuilt.check_invariants()
        rebuilt.check_invariants()
        assert snapshot(rebuilt) == snapshot(original)
        # Normal operation continues after a rebuild; the reserve index is dropped and rebuilt.
        extra = rebuilt.alloc(5000)
        assert extra is not None
        assert rebuilt.reserve(extra, 5000) is False
        rebuilt.free(extra)
        first = entries[0][0]
        rebuilt.free(first)
        assert rebuilt.reserve(first, entries[0][1])
        rebuilt.check_invariants()
        for offset, _ in entries:
            rebuilt.free(offset)
        assert rebuilt.free_block_count == 1
        assert rebuilt.largest_free_block_bytes() == rebuilt.capacity_bytes


# ---------------------------------------------------------------- utilisation


def _fill(allocator: SegmentAllocator, nbytes: int, live: list[int]) -> None:
    while (offset := allocator.alloc(nbytes)) is not None:
        live.append(offset)


def _assert_packed(allocator: SegmentAllocator, nbytes: int, live: list[int]) -> None:
    capacity = allocator.capacity_bytes
    assert allocator.allocation_count == len(live)
    assert allocator.used_bytes / capacity >= 0.95, allocator
    assert len(live) * nbytes / capacity >= 0.95, allocator


@pytest.mark.parametrize("delta", [17, -17])
@pytest.mark.parametrize("k", range(10, 25))
def test_uniform_sizes_pack_tightly(k: int, delta: int) -> None:
    nbytes = (1 << k) + delta
    size = SegmentAllocator.rounded_size(nbytes)
    # 256 MiB where that holds a few thousand blocks at most; smaller for small k (fast), and
    # bigger for k >= 23, where 256 MiB holds only 15 blocks of 16 MiB + 17: the leftover tail
    # alone would cap use at 15/16, whatever the allocator does. The odd 4000 B exercises the
    # round-down of capacity.
    capacity_bytes = max(min(256 * MIB, 4096 * size), 64 * size) + 4000
    allocator = SegmentAllocator(capacity_bytes)
    live: list[int] = []
    _fill(allocator, nbytes, live)
    _assert_packed(allocator, nbytes, live)
    allocator.check_invariants()

    rng = random.Random(k * 100 + delta)
    for _ in range(3):  # random frees, then refill, a few rounds
        rng.shuffle(live)
        victims = live[: len(live) // 2]
        del live[: len(live) // 2]
        for offset in victims:
            allocator.free(offset)
        _fill(allocator, nbytes, live)
        _assert_packed(allocator, nbytes, live)
    allocator.check_invariants()
    for offset in live:
        allocator.free(offset)
    assert allocator.free_block_count == 1
    assert allocator.largest_free_block_bytes() == allocator.capacity_bytes
