"""Engine hashes in the node's index and journal (storage_node/index.py `set_engine_hashes`,
journal record kind 3): kept only for SEALED allocations of the named segment with a valid
encoding, journaled, replayed after a restart, carried by a tier move's copy and kept by a
compaction; a torn or hostile hash record ends the replay as any other. The same with real
processes: tests/faults/test_master_restart.py::test_engine_hashes_outlive_node_and_master_kills."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from test_rebuild_node import journaled_index, write

from cellar.proto import engine_hash
from cellar.storage_node import journal as journal_module
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.journal import IndexJournal, journal_path, replay

HASH = engine_hash.encode(-1234567890123)
DIGEST = engine_hash.encode(bytes(range(32)))


def note(alloc_id: int, value: bytes, segment_id: int = 1) -> SimpleNamespace:
    return SimpleNamespace(segment_id=segment_id, alloc_id=alloc_id, engine_hash=value)


def test_hashes_are_kept_for_sealed_allocations_only(tmp_path: Path) -> None:
    journal, index = journaled_index(tmp_path)
    kept = index.set_engine_hashes([
        note(1, HASH), note(2, DIGEST),
        note(3, HASH),                 # not sealed
        note(9, HASH),                 # unknown
        note(2, HASH, segment_id=7),   # another segment
        note(1, b"\x07junk"),          # not an encoding
        note(1, b"\x02" + b"x" * 40),  # over 33 bytes
    ])
    assert kept == 2
    assert index.get(1).engine_hash == HASH and index.get(2).engine_hash == DIGEST
    assert index.get(3).engine_hash == b""
    assert {e.alloc_id: e.engine_hash for e in index.prepare_report(0)} == {1: HASH, 2: DIGEST}

    # a restart replays them; its compaction keeps them
    journal.close()
    again, entries = IndexJournal.open(journal.path)
    assert {e.alloc_id: e.engine_hash for e in entries} == {1: HASH, 2: DIGEST}
    assert {a: e.engine_hash for a, e in replay(again.path.read_bytes())[0].items()} == {
        1: HASH, 2: DIGEST}


def test_a_tier_move_copy_keeps_the_hash(tmp_path: Path) -> None:
    index = ObjectIndex()
    write(index, 1, 0, 100)
    index.set_engine_hashes([note(1, HASH)])
    source = index.get(1)
    assert source is not None and index.seal_copy(source, 2, 1, 4096)
    assert index.get(2).engine_hash == HASH


def test_a_hostile_hash_record_ends_the_replay(tmp_path: Path) -> None:
    path = journal_path(tmp_path, "n1")
    journal, _ = IndexJournal.open(path)
    index = ObjectIndex(journal=journal)
    write(index, 1, 0, 100)
    write(index, 2, 4096, 100)
    journal.close()
    # a record of kind 3 that says 200 hash bytes, then a good SEALED record after it
    body = journal_module._ENGINE_HASH.pack(journal_module.KIND_ENGINE_HASH, 1, 200) + b"h" * 200
    bad = journal_module._framed(body)
    data = path.read_bytes()
    path.write_bytes(data + bad + data[len(journal_module.MAGIC):])
    live, valid, _records = replay(path.read_bytes())
    assert valid == len(data) and sorted(live) == [1, 2]
    assert all(e.engine_hash == b"" for e in live.values())
