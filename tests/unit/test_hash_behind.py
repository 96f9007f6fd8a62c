"""HashBehind (client/hash_behind.py): put values hashed on helper threads behind a call."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from cellar.client import hash_behind
from cellar.client.hash_behind import HashBehind, split_by_bytes
from cellar.client.puts import PutEntry, hash_values
from cellar.transfer.base import hash_views

MiB = 1 << 20


def _entries(sizes: Sequence[int]) -> list[PutEntry]:
    return [PutEntry(f"k{i}", memoryview(bytes([i % 251]) * n), None)
            for i, n in enumerate(sizes)]


def test_a_batch_is_cut_where_half_of_its_unhashed_bytes_are_behind() -> None:
    entries = _entries([MiB, MiB, 2 * MiB, MiB, MiB])
    first, second = split_by_bytes(entries, 6 * MiB)
    assert [e.key for e in first] == ["k0", "k1", "k2"] and [e.key for e in second] == ["k3", "k4"]
    entries[0].checksum = 1  # hashed already: its bytes count for neither half
    first, second = split_by_bytes(entries, 5 * MiB)
    assert [e.key for e in first] == ["k0", "k1", "k2"]
    one = _entries([2 * MiB])  # one value is never cut
    assert split_by_bytes(one, 2 * MiB) == (one, ())


@pytest.mark.parametrize(("sizes", "threads"), [
    ([4 * MiB] * 8, 2),              # 32 MiB to hash: two helper threads, a half each
    ([MiB] * 8, 1),                  # 8 MiB: one helper thread
    ([MiB // 8] * 4, 0),             # under HASH_BEHIND_MIN_BYTES: left to the copy
])
def test_a_large_batch_is_hashed_on_two_threads_before_around_returns(
        monkeypatch: pytest.MonkeyPatch, sizes: list[int], threads: int) -> None:
    seen: list[tuple[str, list[str]]] = []
    lock = threading.Lock()

    def recording(entries: Sequence[PutEntry]) -> None:
        time.sleep(0.05)  # still hashing when the call returns: `around` must wait for it
        hash_values(entries)
        with lock:
            seen.append((threading.current_thread().name, [e.key for e in entries]))

    monkeypatch.setattr(hash_behind, "hash_values", recording)
    entries = _entries(sizes)
    behind = HashBehind()
    try:
        assert behind.around(entries, lambda: "reply") == "reply"
        assert len({name for name, _ in seen}) == threads
        hashed = sorted(key for _, keys in seen for key in keys)
        assert hashed == (sorted(e.key for e in entries) if threads else [])
        for e in entries:  # each value hashed once, to its own digest, before the return
            assert e.checksum == (hash_views((e.value,)) if threads else None)
    finally:
        behind.close()


def test_a_pool_closed_between_the_halves_leaves_the_rest_to_the_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A put racing `close`: the half submitted before is still waited for; the other stays
    unhashed (`plan_writes` hashes it inline), and the put does not fail."""
    behind = HashBehind()
    pool = behind._pool.get()
    assert pool is not None
    submit = pool.submit
    calls: list[int] = []

    def closing_after_one(fn, *args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return submit(fn, *args)

    monkeypatch.setattr(pool, "submit", closing_after_one)
    entries = _entries([4 * MiB] * 8)
    try:
        assert behind.around(entries, lambda: "reply") == "reply"
        assert [e.checksum is not None for e in entries] == [True] * 4 + [False] * 4
        assert entries[0].checksum == hash_views((entries[0].value,))
    finally:
        behind.close()
