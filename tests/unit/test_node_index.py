"""ObjectIndex: interval merging, sealing at exactly full coverage, tombstones, freeing."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace

import pytest

from cellar.storage_node.index import (
    TOMBSTONE_GRACE_MS,
    AllocState,
    ObjectIndex,
    ReadRefused,
    WriteRefused,
)
from cellar.storage_node.index_records import SegmentUsage, merge_ranges

SEG = 7


def admit(index: ObjectIndex, alloc: int, offset: int = 0, size: int = 100, *,
          key: str = "k", expiry: int = 10_000, segment: int = SEG, checksum: int = 1) -> None:
    index.admit_write(alloc_id=alloc, segment_id=segment, object_offset=offset, object_size=size,
                      tenant="t", key=key, checksum=checksum, epoch=1, grant_expiry_ms=expiry)


def freed(alloc: int, offset: int = 0, length: int = 100, segment: int = SEG) -> SimpleNamespace:
    return SimpleNamespace(segment_id=segment, alloc_id=alloc, offset=offset, length=length)


def test_merge_intervals() -> None:
    ranges: list[tuple[int, int]] = []
    assert merge_ranges(ranges, 10, 20) == 10
    assert merge_ranges(ranges, 30, 40) == 10
    assert merge_ranges(ranges, 15, 25) == 5          # overlaps the first
    assert ranges == [(10, 25), (30, 40)]
    assert merge_ranges(ranges, 25, 30) == 5          # adjacent on both sides: one range
    assert ranges == [(10, 40)]
    assert merge_ranges(ranges, 10, 40) == 0          # retried chunk
    assert merge_ranges(ranges, 0, 50) == 20
    assert ranges == [(0, 50)]
    assert merge_ranges(ranges, 60, 60) == 0          # empty
    assert ranges == [(0, 50)]


def test_merge_random_matches_set() -> None:
    rng = random.Random(1)
    for _ in range(200):
        ranges: list[tuple[int, int]] = []
        covered: set[int] = set()
        for _ in range(30):
            a = rng.randrange(0, 200)
            b = a + rng.randrange(0, 30)
            added = merge_ranges(ranges, a, b)
            new = set(range(a, b)) - covered
            assert added == len(new)
            covered |= new
            assert all(e1 < s2 for (_, e1), (s2, _) in zip(ranges, ranges[1:], strict=False))
        assert sum(e - s for s, e in ranges) == len(covered)


def test_seals_exactly_at_full_coverage_with_retries() -> None:
    index = ObjectIndex()
    admit(index, 1, offset=4096, size=100)
    assert not index.record_written(1, 0, 40)
    assert not index.record_written(1, 0, 40)    # retried chunk: no double count
    assert not index.record_written(1, 60, 100)
    entry = index.get(1)
    assert entry is not None and entry.state is AllocState.WRITING
    assert entry.received_bytes == 80
    assert index.record_written(1, 30, 60)       # closes the gap
    entry = index.get(1)
    assert entry is not None and entry.state is AllocState.SEALED
    assert entry.received_bytes == 100 and entry.ranges == []
    assert not index.record_written(1, 0, 10)    # late duplicate does nothing


def test_sealed_refuses_writes() -> None:
    index = ObjectIndex()
    admit(index, 1)
    index.record_written(1, 0, 100)
    with pytest.raises(WriteRefused) as exc:
        admit(index, 1)
    assert exc.value.reason == WriteRefused.SEALED


def test_zero_length_object_seals_on_first_write() -> None:
    index = ObjectIndex()
    admit(index, 1, size=0)
    assert index.record_written(1, 0, 0)
    with pytest.raises(WriteRefused):
        admit(index, 1, size=0)


def test_conflicting_meta_refused() -> None:
    index = ObjectIndex()
    admit(index, 1, key="a")
    with pytest.raises(WriteRefused) as exc:
        admit(index, 1, key="b")
    assert exc.value.reason == WriteRefused.CONFLICT
    with pytest.raises(WriteRefused):
        admit(index, 1, key="a", size=99)
    with pytest.raises(WriteRefused):
        admit(index, 1, key="a", checksum=2)
    admit(index, 1, key="a", expiry=20_000)     # same allocation, later grant: fine
    entry = index.get(1)
    assert entry is not None and entry.write_grant_expiry_ms == 20_000


def test_apply_freed_tombstones_until_expiry() -> None:
    index = ObjectIndex(allowed_skew_ms=1000)
    admit(index, 1, expiry=10_000)
    index.record_written(1, 0, 100)
    assert index.apply_freed([freed(1)], now_ms=5_000) == 1
    assert index.get(1) is None and index.is_tombstoned(1)
    with pytest.raises(WriteRefused) as exc:
        admit(index, 1, expiry=10_000)
    assert exc.value.reason == WriteRefused.FREED
    # still refused right up to expiry + skew + grace
    assert index.purge(10_000 + 1000 + TOMBSTONE_GRACE_MS) == 0
    assert index.is_tombstoned(1)
    assert index.purge(10_000 + 1000 + TOMBSTONE_GRACE_MS + 1) == 1
    assert not index.is_tombstoned(1)
    assert index.counts()["tombstones"] == 0


def test_apply_freed_is_idempotent_and_ignores_unknown() -> None:
    index = ObjectIndex()
    admit(index, 1)
    assert index.apply_freed([freed(1), freed(1), freed(99)], now_ms=0) == 1
    assert index.apply_freed([freed(1)], now_ms=0) == 0
    assert index.counts() == {"entries": 0, "sealed": 0, "writing": 0, "tombstones": 1}


def test_new_allocation_overlapping_an_entry_tombstones_it() -> None:
    """The master reused a sealed object's range before its FreedRange reached us."""
    index = ObjectIndex()
    admit(index, 1, offset=0, size=100, expiry=50_000)
    index.record_written(1, 0, 100)
    admit(index, 2, offset=50, size=100)           # overlaps the tail of alloc 1
    assert index.get(1) is None and index.is_tombstoned(1)
    with pytest.raises(WriteRefused):
        admit(index, 1, offset=0, size=100)         # the old writer stays locked out
    admit(index, 3, offset=150, size=10)           # adjacent, not overlapping: both live
    admit(index, 4, offset=0, size=50)             # adjacent to 2 on the left
    assert index.get(2) is not None and index.get(3) is not None and index.get(4) is not None
    admit(index, 5, offset=0, size=200)            # swallows 2, 3 and 4
    assert {e.alloc_id for e in index.snapshot()} == {5}
    admit(index, 6, offset=0, size=10, segment=SEG + 1)   # other segment: independent
    assert {e.alloc_id for e in index.snapshot()} == {5, 6}


def test_clear_keeps_tombstones() -> None:
    index = ObjectIndex()
    admit(index, 1, expiry=1_000)
    admit(index, 2, offset=100, expiry=2_000)
    index.clear(now_ms=0)
    assert len(index) == 0
    assert index.is_tombstoned(1) and index.is_tombstoned(2)
    index.clear(now_ms=10_000_000)
    assert index.counts()["tombstones"] == 0


def test_snapshot_and_usage() -> None:
    index = ObjectIndex()
    admit(index, 1, offset=0, size=100, key="a")
    index.record_written(1, 0, 100)
    admit(index, 2, offset=100, size=50, key="b")
    index.record_written(2, 0, 20)
    snap = {e.alloc_id: e for e in index.snapshot()}
    assert snap[1].key == "a" and snap[1].state is AllocState.SEALED
    assert snap[2].state is AllocState.WRITING and snap[2].received_bytes == 20
    snap[2].ranges.append((0, 50))                 # copies: the index is unaffected
    entry = index.get(2)
    assert entry is not None and entry.ranges == [(0, 20)]
    usage = index.usage()[SEG]
    assert (usage.objects, usage.sealed_objects, usage.sealed_bytes, usage.writing_bytes) == (
        2, 1, 100, 20)


def test_concurrent_chunks_seal_once() -> None:
    index = ObjectIndex()
    size, chunk = 1 << 20, 4096
    admit(index, 1, size=size)
    seals = []

    def worker(parts: list[int]) -> None:
        for start in parts:
            if index.record_written(1, start, start + chunk):
                seals.append(start)

    starts = list(range(0, size, chunk))
    random.Random(2).shuffle(starts)
    threads = [threading.Thread(target=worker, args=(starts[i::4] + starts[:8],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seals) == 1
    entry = index.get(1)
    assert entry is not None and entry.state is AllocState.SEALED


def _claim(index: ObjectIndex, alloc: int, offset: int = 0, size: int = 100,
           expiry: int = 10_000) -> None:
    index.claim(alloc_id=alloc, segment_id=SEG, object_offset=offset, object_size=size,
                grant_expiry_ms=expiry)


def test_a_claim_drops_the_older_entries_its_range_overlaps_and_records_nothing() -> None:
    """A shm/rdma writer's CLAIM (before its copy): the older sealed entries in its range go
    (a read under their grants is refused from then on), nothing else changes, and the COMMIT
    that follows admits the object as usual."""
    index = ObjectIndex()
    admit(index, 1, offset=0, size=100)
    index.record_written(1, 0, 100)
    admit(index, 2, offset=100, size=100)
    index.record_written(2, 0, 100)
    assert index.admit_read(alloc_id=1, segment_id=SEG, object_offset=0, length=100,
                            grant_expiry_ms=10_000) == ("t", "k")
    _claim(index, 5, offset=50, size=100)  # overlaps both
    assert index.get(1) is None and index.get(2) is None and index.get(5) is None
    for alloc, offset in ((1, 0), (2, 100)):
        with pytest.raises(ReadRefused):
            index.admit_read(alloc_id=alloc, segment_id=SEG, object_offset=offset, length=100,
                             grant_expiry_ms=10_000)
    admit(index, 5, offset=50, size=100, checksum=9)  # the COMMIT: any checksum, once
    assert index.record_written(5, 0, 100) is not None
    _claim(index, 5, offset=50, size=100)  # a retried write's claim: the COMMIT decides
    assert index.get(5) is not None and index.get(5).state is AllocState.SEALED


def test_a_claim_under_a_dead_grant_is_refused_and_drops_nothing() -> None:
    index = ObjectIndex()
    admit(index, 7, offset=0, size=100)
    index.record_written(7, 0, 100)
    with pytest.raises(WriteRefused) as exc:
        _claim(index, 3, offset=0, size=100)  # older than the allocation living there
    assert exc.value.reason == WriteRefused.FREED
    assert index.get(7) is not None
    index.apply_freed([freed(7)], now_ms=0)
    with pytest.raises(WriteRefused) as exc:
        _claim(index, 7, offset=0, size=100)  # a freed allocation
    assert exc.value.reason == WriteRefused.FREED
    _claim(index, 8, offset=0, size=100)  # in a free range: nothing to drop, nothing kept
    assert index.get(8) is None


def _recount(index: ObjectIndex) -> dict[int, SegmentUsage]:
    """`usage` counted afresh from a snapshot of every entry."""
    rows: dict[int, list[int]] = {}
    for entry in index.snapshot():
        row = rows.setdefault(entry.segment_id, [0, 0, 0, 0])
        row[0] += 1
        if entry.state is AllocState.SEALED:
            row[1] += 1
            row[2] += entry.length
        else:
            row[3] += entry.received_bytes
    return {segment: SegmentUsage(*row) for segment, row in rows.items()}


def test_usage_kept_as_entries_change_matches_a_recount() -> None:
    """`usage` and `counts` read counters kept at every change (no walk of the entries per
    scrape); after each of 3,000 random changes of every kind they equal a fresh count."""
    rng = random.Random(11)
    index = ObjectIndex()
    segments = (SEG, SEG + 1)
    next_alloc = 1
    for step in range(3000):
        roll = rng.random()
        entries = index.snapshot()
        try:
            if roll < 0.35 or not entries:  # a new write, often over older entries
                segment = rng.choice(segments)
                admit(index, next_alloc, offset=rng.randrange(0, 4000, 50),
                      size=rng.choice((0, 50, 100, 200)), segment=segment, key=f"k{step}")
                next_alloc += 1
            elif roll < 0.65:  # bytes arrive, part of an object or all of it
                entry = rng.choice(entries)
                start = rng.randrange(0, entry.length + 1)
                index.record_written(entry.alloc_id, start,
                                     rng.randrange(start, entry.length + 1))
            elif roll < 0.75:  # the master frees one
                entry = rng.choice(entries)
                index.apply_freed([freed(entry.alloc_id, entry.offset, entry.length,
                                         entry.segment_id)], now_ms=0)
            elif roll < 0.85:  # a tier move's sealed copy into the other segment
                source = rng.choice([e for e in entries if e.state is AllocState.SEALED]
                                    or entries)
                if source.state is AllocState.SEALED and source.length:
                    index.seal_copy(source, next_alloc, rng.choice(segments),
                                    rng.randrange(0, 4000, 50))
                    next_alloc += 1
            elif roll < 0.92:
                index.drop_alloc_ids([rng.choice(entries).alloc_id])
            elif roll < 0.97:
                index.prepare_report(now_ms=0)  # a remount that rebuilds: WRITING ones go
            else:
                index.clear(now_ms=0)
        except WriteRefused:
            pass
        assert index.usage() == _recount(index), step
        assert index.counts()["sealed"] == sum(
            1 for e in index.snapshot() if e.state is AllocState.SEALED), step
    assert next_alloc > 500  # the run wrote, sealed and dropped a good many
