"""Value ids in the node's index and journal (storage_node/index.py `seal_copy`, `set_value_id`,
journal record kind 4): a copy of a value (a tier move, a repair copy) gets a newer alloc id
than the put that wrote the value; the node keeps that put's id beside it, journals it with
the copy's SEALED record, replays it after a restart and reports it (ReportedObject
.value_alloc_id), so a rebuilt master orders a key's values by put (the master's side:
tests/unit/test_master_tiers.py::test_a_moved_copy_keeps_its_values_version_through_two_restarts)."""

from __future__ import annotations

from pathlib import Path

from test_rebuild_node import write

from cellar.storage_node import journal as journal_module
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.journal import IndexJournal, journal_path, replay
from cellar.storage_node.mount_report import report_batches


def _value_ids(index: ObjectIndex) -> dict[int, int]:
    return {e.alloc_id: e.value_id for e in index.prepare_report(0)}


def test_a_moved_copy_keeps_the_put_of_its_value_through_a_restart(tmp_path: Path) -> None:
    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal)
    write(index, 10, 0, 100)                   # the put's own range: no value id
    source = index.get(10)
    assert source is not None and index.seal_copy(source, 20, 1, 4096)  # demoted
    moved = index.get(20)
    assert moved is not None and index.seal_copy(moved, 30, 1, 8192)   # promoted again
    assert _value_ids(index) == {10: 0, 20: 10, 30: 10}  # a copy of a copy: still put 10's

    journal.close()  # a restart replays them (the restore's compaction keeps them)
    again, entries = IndexJournal.open(journal.path)
    assert {e.alloc_id: e.value_id for e in entries} == {10: 0, 20: 10, 30: 10}
    restored = ObjectIndex(journal=again)
    restored.restore(entries, {1: 1 << 20})
    assert _value_ids(restored) == {10: 0, 20: 10, 30: 10}
    assert {a: e.value_id for a, e in replay(again.path.read_bytes())[0].items()} == {
        10: 0, 20: 10, 30: 10}
    reported = {e.alloc_id: e.value_alloc_id
                for _, batch, _ in report_batches(restored.prepare_report(0), [1]) for e in batch}
    assert reported == {10: 0, 20: 10, 30: 10}


def test_a_repair_copy_takes_its_value_id_before_it_is_sealed(tmp_path: Path) -> None:
    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal)
    write(index, 40, 0, 100, seal=False)       # the copier admitted the target range
    index.set_value_id(40, 12)                 # CopyTask.value_alloc_id
    index.set_value_id(40, 41)                 # not older than the copy: ignored
    index.record_written(40, 50, 100)          # the last bytes landed: sealed, journaled
    index.set_value_id(40, 11)                 # sealed: ignored
    write(index, 50, 4096, 100)
    index.set_value_id(50, 7)                  # a sealed put: ignored
    assert _value_ids(index) == {40: 12, 50: 0}
    journal.close()
    _, entries = IndexJournal.open(journal.path)
    assert {e.alloc_id: e.value_id for e in entries} == {40: 12, 50: 0}


def test_a_value_id_record_not_older_than_its_copy_is_ignored(tmp_path: Path) -> None:
    path = journal_path(tmp_path, "n1")
    journal, _ = IndexJournal.open(path)
    index = ObjectIndex(journal=journal)
    write(index, 5, 0, 100)
    journal.close()
    records = b""
    for value_id in (5, 9, 0):  # the copy's own id, a newer one, none: not a copy's value
        body = journal_module._ID_PAIR.pack(journal_module.KIND_VALUE_ID, 5, value_id)
        records += journal_module._framed(body)
    path.write_bytes(path.read_bytes() + records)
    live, valid, _records = replay(path.read_bytes())
    assert valid == len(path.read_bytes()) and live[5].value_id == 0
