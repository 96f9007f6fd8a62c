"""Deferred journal appends: seals from the data path reach the file at the next flush, which
the data server runs before its replies leave; every other append keeps the call order."""

from __future__ import annotations

import socket
from pathlib import Path

from test_rebuild_node import NOW_MS, _Freed, write

from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.journal import IndexJournal, journal_path, replay
from cellar.transfer._sockio import Outbox


def live_ids(path: Path) -> list[int]:
    return sorted(replay(path.read_bytes())[0])


def test_deferred_seals_wait_for_flush(tmp_path: Path) -> None:
    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal, defer_journal=True)
    write(index, 1, 0, 100)
    write(index, 2, 4096, 100)
    assert journal.queued and live_ids(journal.path) == []
    index.flush_journal()
    assert not journal.queued and live_ids(journal.path) == [1, 2]
    index.flush_journal()  # nothing queued: no write
    assert live_ids(journal.path) == [1, 2]


def test_other_appends_write_the_queue_first_in_order(tmp_path: Path) -> None:
    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal, defer_journal=True)
    write(index, 1, 0, 100)
    write(index, 2, 4096, 100)
    index.apply_freed([_Freed(1, 1, 0, 100)], NOW_MS)  # a drop is written at once, after them
    assert not journal.queued and live_ids(journal.path) == [2]
    write(index, 3, 8192, 100)
    journal.close()  # closing (keeping the file) flushes too
    _, entries = IndexJournal.open(journal.path)
    assert sorted(e.alloc_id for e in entries) == [2, 3]


def test_without_defer_every_seal_is_written_at_once(tmp_path: Path) -> None:
    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal)
    write(index, 1, 0, 100)
    assert not journal.queued and live_ids(journal.path) == [1]


def test_outbox_runs_before_send_before_replies_leave() -> None:
    a, b = socket.socketpair()
    events: list[str] = []
    try:
        outbox = Outbox(a, before_send=lambda: events.append("flushed"))
        outbox.flush()  # nothing queued: nothing to make durable
        assert events == []
        outbox.add(b"reply")
        assert events == []
        outbox.flush()
        assert events == ["flushed"] and b.recv(16) == b"reply"
    finally:
        a.close()
        b.close()


def test_drops_of_one_call_are_written_together(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import cellar.storage_node.journal as jmod

    journal, _ = IndexJournal.open(journal_path(tmp_path, "n1"))
    index = ObjectIndex(journal=journal)
    for i in range(1, 11):
        write(index, i, i * 4096, 100)
    writes: list[bytes] = []
    real = jmod._write_all
    monkeypatch.setattr(jmod, "_write_all", lambda fd, data: (writes.append(data), real(fd, data)))
    index.apply_freed([_Freed(1, i, i * 4096, 100) for i in range(1, 8)], NOW_MS)
    assert len(writes) == 1  # seven DROPPED records, one write()
    assert live_ids(journal.path) == [8, 9, 10]
