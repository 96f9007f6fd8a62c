"""Soft pins in the node's index and journal (storage_node/index.py `set_soft_pins`, journal
record kind 5): kept only for SEALED allocations of the named segment, journaled, replayed
after a restart, kept by a compaction and a tier move's copy, and reported
(ReportedObject.soft_pin_until_ms), so a rebuilt master pins the object again (the master's
side: tests/unit/test_master_soft_pin_notes.py; real processes:
tests/faults/test_master_restart.py::test_a_soft_pin_outlives_a_master_kill)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from test_rebuild_node import journaled_index, write

from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.journal import IndexJournal, replay
from cellar.storage_node.mount_report import report_batches

FOREVER = (1 << 64) - 1


def note(alloc_id: int, until_ms: int, segment_id: int = 1) -> SimpleNamespace:
    return SimpleNamespace(segment_id=segment_id, alloc_id=alloc_id, until_ms=until_ms)


def _pins(entries: object) -> dict[int, int]:
    return {e.alloc_id: e.soft_pin_until_ms for e in entries}  # type: ignore[attr-defined]


def test_pins_are_kept_for_sealed_allocations_and_outlive_a_restart(tmp_path: Path) -> None:
    journal, index = journaled_index(tmp_path)  # 3 is still WRITING
    write(index, 4, 12288, 100)
    kept = index.set_soft_pins([
        note(1, 1_700_000_060_000), note(2, FOREVER),
        note(3, FOREVER),                  # not sealed
        note(9, FOREVER),                  # unknown
        note(4, FOREVER, segment_id=7),    # another segment
        note(4, 0),                        # no lapse given
    ])
    assert kept == 2
    assert _pins(index.prepare_report(0)) == {1: 1_700_000_060_000, 2: FOREVER, 4: 0}
    source = index.get(2)
    assert source is not None and index.seal_copy(source, 5, 1, 16384)  # a move keeps it

    journal.close()  # a restart replays them; the restore's compaction keeps them
    again, entries = IndexJournal.open(journal.path)
    expected = {1: 1_700_000_060_000, 2: FOREVER, 4: 0, 5: FOREVER}
    assert _pins(entries) == expected
    restored = ObjectIndex(journal=again)
    restored.restore(entries, {1: 1 << 20})
    assert _pins(replay(again.path.read_bytes())[0].values()) == expected
    reported = {e.alloc_id: e.soft_pin_until_ms
                for _, batch, _ in report_batches(restored.prepare_report(0), [1]) for e in batch}
    assert reported == expected
