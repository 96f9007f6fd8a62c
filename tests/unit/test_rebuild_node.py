"""Node side of restart re-attach: the index journal (replay, torn tail, compaction), index
restore / report / write floor, segment file re-attach, and the background verifier."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import xxhash

from cellar.storage_node.index import AllocState, ObjectIndex, WriteRefused
from cellar.storage_node.journal import IndexJournal, JournalEntry, journal_path
from cellar.storage_node.segment import Segment
from cellar.storage_node.verifier import Verifier

NOW_MS = 1_800_000_000_000
TTL_MS = 30_000


def write(index: ObjectIndex, alloc_id: int, offset: int, length: int, *, key: str = "",
          checksum: int = 0, expiry_ms: int = NOW_MS + TTL_MS, seal: bool = True) -> None:
    index.admit_write(alloc_id=alloc_id, segment_id=1, object_offset=offset, object_size=length,
                      tenant="default", key=key or f"k{alloc_id}", checksum=checksum, epoch=5,
                      grant_expiry_ms=expiry_ms)
    index.record_written(alloc_id, 0, length if seal else length // 2)


def journaled_index(tmp_path: Path) -> tuple[IndexJournal, ObjectIndex]:
    """An index journaled under `tmp_path`: allocations 1 and 2 SEALED, 3 still WRITING."""
    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal)
    write(index, 1, 0, 100)
    write(index, 2, 4096, 100)
    write(index, 3, 8192, 100, seal=False)
    return journal, index


def test_journal_survives_a_restart_and_cuts_a_torn_tail(tmp_path: Path) -> None:
    path = journal_path(tmp_path, "n1")
    journal, entries = IndexJournal.open(path)
    assert entries == []
    index = ObjectIndex(journal=journal)
    write(index, 1, 0, 100, key="a")
    write(index, 2, 4096, 100, key="b")
    write(index, 3, 8192, 100, key="c", seal=False)  # WRITING: never journaled
    write(index, 4, 12288, 100, key="ключ")           # non-ASCII key
    index.apply_freed([_Freed(1, 2, 4096, 100)], NOW_MS)
    journal.close()
    with open(path, "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage")  # a torn record at the end
    journal2, entries = IndexJournal.open(path)
    assert sorted((e.alloc_id, e.key) for e in entries) == [(1, "a"), (4, "ключ")]
    # the torn tail was cut off and the file compacted: it replays identically
    journal2.close()
    _, again = IndexJournal.open(path)
    assert sorted(e.alloc_id for e in again) == [1, 4]


def test_journal_compacts_when_dead_records_dominate(tmp_path: Path, monkeypatch) -> None:
    import cellar.storage_node.journal as jmod

    monkeypatch.setattr(jmod, "COMPACT_MIN_DEAD", 10)
    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal)
    for i in range(1, 40):
        write(index, i, i * 4096, 100)
        index.apply_freed([_Freed(1, i, i * 4096, 100)], NOW_MS)
    write(index, 100, 0, 100)
    size_before = journal.path.stat().st_size
    assert index.maybe_compact()
    assert journal.path.stat().st_size < size_before / 10
    journal.close()
    _, entries = IndexJournal.open(journal.path)
    assert [e.alloc_id for e in entries] == [100]


def test_restore_report_and_refusals() -> None:
    index = ObjectIndex()
    restored = index.restore([
        JournalEntry(1, 1, 0, 100, 11, 5, NOW_MS, "default", "a"),
        JournalEntry(2, 1, 50, 100, 12, 5, NOW_MS, "default", "older-overlap"),  # overlaps a newer one
        JournalEntry(3, 1, 4096, 100, 13, 5, NOW_MS, "default", "b"),
        JournalEntry(4, 9, 0, 100, 14, 5, NOW_MS, "default", "unknown segment"),
        JournalEntry(5, 1, 1 << 20, 100, 15, 5, NOW_MS, "default", "past the end"),
    ], {1: 1 << 20})
    assert sorted(restored) == [2, 3]  # the newest (highest alloc id) wins an overlap
    write(index, 10, 8192, 100, seal=False)
    report = index.prepare_report(NOW_MS)
    assert sorted(e.alloc_id for e in report) == [2, 3]
    assert all(e.state is AllocState.SEALED for e in report)
    assert index.is_tombstoned(10)  # the WRITING entry was dropped
    assert index.drop_alloc_ids([3, 77]) == 1
    assert [e.alloc_id for e in index.snapshot()] == [2]


def test_write_floor_refuses_grants_issued_before_the_mount() -> None:
    index = ObjectIndex()
    index.refuse_writes_until_mount()
    with pytest.raises(WriteRefused):
        write(index, 1, 0, 100)
    index.set_mount(NOW_MS, TTL_MS)
    with pytest.raises(WriteRefused, match="before this node's current mount"):
        write(index, 2, 0, 100, expiry_ms=NOW_MS + TTL_MS - 1)  # issued 1 ms before the mount
    write(index, 3, 0, 100, expiry_ms=NOW_MS + TTL_MS)  # issued at the mount
    assert index.get(3) is not None


def test_segment_file_is_reattached_only_with_the_same_size(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, "n1", 0, 1 << 20)
    assert not seg.reattached
    seg.memory[100:105] = b"hello"
    seg.close(unlink=False)
    seg = Segment.create(tmp_path, "n1", 0, 1 << 20)
    assert seg.reattached and bytes(seg.memory[100:105]) == b"hello"
    seg.close(unlink=False)
    seg = Segment.create(tmp_path, "n1", 0, 2 << 20)
    assert not seg.reattached and bytes(seg.memory[100:105]) == b"\0" * 5
    seg.close(unlink=True)


def test_verifier_drops_corrupt_entries_and_queues_them_as_lost() -> None:
    seg = Segment.in_memory(1, 1 << 20)
    good, bad = b"g" * 5000, b"b" * 7000
    seg.memory[0:5000] = good
    seg.memory[8192:8192 + 7000] = bad
    index = ObjectIndex()
    restored = index.restore([
        JournalEntry(1, 1, 0, 5000, xxhash.xxh3_64_intdigest(good), 5, NOW_MS, "default", "good"),
        JournalEntry(2, 1, 8192, 7000, xxhash.xxh3_64_intdigest(b"x" * 7000), 5, NOW_MS,
                     "default", "bad"),
    ], {1: 1 << 20})
    verifier = Verifier({1: seg}, index, restored, rate_bytes_per_s=1 << 30)
    verifier.start()
    deadline = time.monotonic() + 10
    while not verifier.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert verifier.status() == {"total": 2, "verified": 1, "corrupt": 1, "done": True}
    assert index.get(2) is None and index.get(1) is not None
    assert verifier.take_lost() == [(1, 2, 8192, 7000)]
    assert verifier.take_lost() == []


class _Freed:
    def __init__(self, segment_id: int, alloc_id: int, offset: int, length: int) -> None:
        self.segment_id = segment_id
        self.alloc_id = alloc_id
        self.offset = offset
        self.length = length


def test_a_failing_journal_deletes_itself_and_the_node_keeps_working(tmp_path: Path,
                                                                      monkeypatch) -> None:
    import errno

    import cellar.storage_node.journal as jmod

    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal)
    write(index, 1, 0, 100)

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jmod, "_write_all", full)
    write(index, 2, 4096, 100)  # the seal still succeeds in memory
    assert journal.failed and not journal.path.exists()
    assert index.get(2) is not None and index.get(2).state is AllocState.SEALED
    index.apply_freed([_Freed(1, 1, 0, 100)], NOW_MS)  # no journal: nothing to append
    monkeypatch.undo()
    _, entries = IndexJournal.open(journal.path)
    assert entries == []  # a restart restores nothing rather than something stale
