"""memcopy.Copier: exact bytes part by part, fused hashing, and the deadline between pieces."""

from __future__ import annotations

import os

import pytest
from xxhash import xxh3_64_intdigest

from cellar.transfer import memcopy
from cellar.transfer.memcopy import PIECE_BYTES, Copier, CopyJob


def _job(sizes: list[int], hashed: bool = False) -> tuple[CopyJob, list[bytes], list[bytearray]]:
    srcs = [os.urandom(n) for n in sizes]
    dsts = [bytearray(n) for n in sizes]
    return CopyJob([(memoryview(d), memoryview(s)) for d, s in zip(dsts, srcs, strict=True)],
                   hashed=hashed), srcs, dsts


@pytest.mark.parametrize("parallel_min_bytes", [1 << 40, 1])  # one thread / split over two
def test_exact_bytes_and_digests(parallel_min_bytes: int) -> None:
    copier = Copier(parallel_min_bytes)
    try:
        jobs = [_job([0, 5, PIECE_BYTES + 3, 70_000]), _job([300_000, 1, 0], hashed=True),
                _job([], hashed=True), _job([2 * PIECE_BYTES])]
        copier.run([j for j, _, _ in jobs], deadline=float("inf"))
        for job, srcs, dsts in jobs:
            assert job.done
            assert [bytes(d) for d in dsts] == srcs
            if job.hashed:
                assert job.digest == xxh3_64_intdigest(b"".join(srcs))
            else:
                assert job.digest is None
    finally:
        copier.close()


def test_deadline_stops_between_pieces_and_later_ops_are_not_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(1000))
    monkeypatch.setattr(memcopy.time, "monotonic", lambda: float(next(ticks)))
    copier = Copier(1 << 40)
    first, srcs1, dsts1 = _job([3 * PIECE_BYTES])   # pieces at clock 0, 1, 2
    second, _, dsts2 = _job([100])                   # would run at clock 3
    copier.run([first, second], deadline=2.5)
    assert first.done and [bytes(d) for d in dsts1] == srcs1
    assert not second.done and dsts2 == [bytearray(100)]  # never touched

    ticks2 = iter(range(1000))
    monkeypatch.setattr(memcopy.time, "monotonic", lambda: float(next(ticks2)))
    partial, srcs, dsts = _job([4 * PIECE_BYTES])
    copier.run([partial], deadline=1.5)  # two of its four pieces
    assert not partial.done
    assert bytes(dsts[0][:2 * PIECE_BYTES]) == srcs[0][:2 * PIECE_BYTES]
    assert bytes(dsts[0][2 * PIECE_BYTES:]) == bytes(2 * PIECE_BYTES)
    copier.close()


def test_a_deadline_already_passed_copies_nothing() -> None:
    copier = Copier()
    job, _, dsts = _job([10, 20])
    copier.run([job], deadline=0.0)
    assert not job.done and dsts == [bytearray(10), bytearray(20)]
    copier.close()
