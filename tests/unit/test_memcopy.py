"""memcopy.Copier: exact bytes part by part, fused hashing, and the deadline between pieces."""

from __future__ import annotations

import os
import threading
import time

import pytest
from xxhash import xxh3_64_intdigest

from cellar.transfer import memcopy
from cellar.transfer.memcopy import FUSED_CHUNK_BYTES, PIECE_BYTES, Copier, CopyJob


def _job(sizes: list[int], hashed: bool = False) -> tuple[CopyJob, list[bytes], list[bytearray]]:
    """A read: one span (the segment's side) copied out into parts of `sizes`."""
    srcs = [os.urandom(n) for n in sizes]
    span = bytearray(b"".join(srcs))
    dsts = [bytearray(n) for n in sizes]
    view = memoryview(span)
    return CopyJob([memoryview(d) for d in dsts], view, memcopy.buffer_address(view),
                   hashed=hashed), srcs, dsts


@pytest.fixture(params=["native", "ctypes"])
def copies_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the native helper (when this install built it) and without."""
    if request.param == "native" and not memcopy.NATIVE:
        pytest.skip("the native copy helper was not built in this install")
    if request.param == "ctypes":
        monkeypatch.setattr(memcopy, "_copy_pieces", memcopy._memmove_each)
        monkeypatch.setattr(memcopy, "_cut_runs", None)
    return str(request.param)


def test_the_native_helper_is_built_where_a_compiler_is() -> None:
    """CI and `make venv` have gcc: the fast path must not silently fall back there."""
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    assert memcopy.NATIVE


def test_the_native_helper_refuses_a_malformed_table() -> None:
    if not memcopy.NATIVE:
        pytest.skip("the native copy helper was not built in this install")
    from array import array

    with pytest.raises(ValueError, match="int64 triples"):
        memcopy._copy_pieces(array("q", [1, 2]))
    with pytest.raises(ValueError, match="negative"):
        memcopy._copy_pieces(array("q", [1, 2, -5]))


@pytest.mark.parametrize("parallel_min_bytes", [1 << 40, 1])  # one thread / split over two
def test_exact_bytes_and_digests(parallel_min_bytes: int, copies_by: str) -> None:
    copier = Copier(parallel_min_bytes)
    try:
        jobs = [_job([0, 5, PIECE_BYTES + 3, 70_000]), _job([300_000, 1, 0], hashed=True),
                _job([], hashed=True), _job([2 * PIECE_BYTES]),
                _job([64 << 10] * 9 + [7, FUSED_CHUNK_BYTES + 1], hashed=True)]
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
        monkeypatch: pytest.MonkeyPatch, copies_by: str) -> None:
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


def test_a_write_fills_the_span_from_its_parts_in_order(copies_by: str) -> None:
    parts = [os.urandom(n) for n in (3, 64 << 10, 0, 1000)]
    span = bytearray(sum(map(len, parts)))
    view = memoryview(span)
    job = CopyJob([memoryview(p) for p in parts], view, memcopy.buffer_address(view),
                  to_span=True, hashed=True)
    copier = Copier()
    copier.run([job], deadline=float("inf"))
    assert job.done and bytes(span) == b"".join(parts)
    assert job.digest == xxh3_64_intdigest(b"".join(parts))
    copier.close()


def test_views_longer_than_the_span_are_refused_before_any_copy() -> None:
    view = memoryview(bytearray(10))
    job = CopyJob([memoryview(b"x" * 11)], view, memcopy.buffer_address(view))
    with pytest.raises(ValueError, match="views hold 11 bytes"):
        Copier().run([job], deadline=float("inf"))
    assert bytes(view) == bytes(10)


@pytest.mark.parametrize("hashed", [False, True])
@pytest.mark.parametrize("to_span", [False, True])
def test_the_native_cut_is_the_python_cut(hashed: bool, to_span: bool) -> None:
    """Same runs, same tables, same marks: parts that straddle runs, empty parts, a part
    longer than several runs, read-only parts."""
    if not memcopy.NATIVE:
        pytest.skip("the native copy helper was not built in this install")
    sizes = [0, 5, FUSED_CHUNK_BYTES - 5, 3, PIECE_BYTES + FUSED_CHUNK_BYTES * 3 + 1, 0, 64 << 10]
    srcs = [os.urandom(n) for n in sizes]
    views = [memoryview(b) if k % 2 else memoryview(bytearray(b)) for k, b in enumerate(srcs)]
    span = memoryview(bytearray(sum(sizes)))
    job = CopyJob(views, span, memcopy.buffer_address(span), to_span=to_span, hashed=hashed)
    step = FUSED_CHUNK_BYTES if hashed else PIECE_BYTES
    native = memcopy._runs(job)
    python, total = memcopy._runs_py(views, job.span_address, to_span, step, hashed)
    assert total == len(span)
    assert [(bytes(t), mark, n) for t, mark, n in native] == \
        [(bytes(t), mark, n) for t, mark, n in python]
    assert len(native) >= 2  # several runs, cut at the same places


def test_a_deadline_already_passed_copies_nothing() -> None:
    copier = Copier()
    job, _, dsts = _job([10, 20])
    copier.run([job], deadline=0.0)
    assert not job.done and dsts == [bytearray(10), bytearray(20)]
    copier.close()


@pytest.mark.parametrize("hashed", [True, False])
def test_a_file_write_lands_at_its_offset_through_short_writes(
        tmp_path, monkeypatch: pytest.MonkeyPatch, hashed: bool) -> None:
    """A write into a disk-backed file (`CopyJob.file`) is pwritev'd at `file_offset`, part by
    part in order, each short write resumed where it stopped; hashed, its digest is the
    bytes'. The kernel may write less than asked: here every call writes at most 100,000."""
    parts = [os.urandom(n) for n in (3, FUSED_CHUNK_BYTES + 5, 0, 70_000, PIECE_BYTES // 2)]
    data = b"".join(parts)
    path = tmp_path / "segment.bin"
    path.write_bytes(bytes(4096 + len(data) + 4096))
    real_pwritev, calls = os.pwritev, []

    def short_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls.append(len(buffers))
        budget, kept = 100_000, []
        for b in buffers:
            if budget <= 0:
                break
            kept.append(b[:budget])
            budget -= len(kept[-1])
        return real_pwritev(fd, kept, offset)

    monkeypatch.setattr(memcopy.os, "pwritev", short_pwritev)
    fd = os.open(path, os.O_RDWR)
    try:
        span = memoryview(bytearray(len(data)))  # the mapping's side: never written here
        job = CopyJob([memoryview(p) for p in parts], span, memcopy.buffer_address(span),
                      to_span=True, hashed=hashed, file=fd, file_offset=4096)
        copier = Copier()
        copier.run([job], deadline=float("inf"))
        copier.close()
    finally:
        os.close(fd)
    assert job.done and job.error is None
    assert path.read_bytes() == bytes(4096) + data + bytes(4096)
    assert job.digest == (xxh3_64_intdigest(data) if hashed else None)
    assert len(calls) > len(data) // 100_000  # the short writes were resumed, not dropped
    assert bytes(span) == bytes(len(data))  # nothing went through the mapping's side


def test_a_large_batch_of_file_writes_stays_on_one_thread_and_is_hashed_beside_it(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch past `parallel_min_bytes` whose jobs all write one file is written by the
    calling thread alone (two writers of one file queue on its inode lock), while the helper
    hashes: every byte lands where it should and every digest is its value's."""
    values = [os.urandom(n) for n in (FUSED_CHUNK_BYTES * 3 + 1, 4096, FUSED_CHUNK_BYTES)]
    offsets = [8192, 8192 + len(values[0]) + 512, 4 * FUSED_CHUNK_BYTES + 16384]
    path = tmp_path / "segment.bin"
    path.write_bytes(bytes(offsets[-1] + len(values[-1]) + 4096))
    real_pwritev, writers = os.pwritev, set()

    def recorded_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        writers.add(threading.get_ident())
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(memcopy.os, "pwritev", recorded_pwritev)
    fd = os.open(path, os.O_RDWR)
    try:
        jobs = []
        for value, offset in zip(values, offsets, strict=True):
            span = memoryview(bytearray(len(value)))
            jobs.append(CopyJob([memoryview(value)], span, memcopy.buffer_address(span),
                                to_span=True, hashed=True, file=fd, file_offset=offset))
        copier = Copier(parallel_min_bytes=1)
        copier.run(jobs, deadline=float("inf"))
        copier.close()
    finally:
        os.close(fd)
    assert writers == {threading.get_ident()}
    data = path.read_bytes()
    for job, value, offset in zip(jobs, values, offsets, strict=True):
        assert job.done and job.error is None
        assert data[offset:offset + len(value)] == value
        assert job.digest == xxh3_64_intdigest(value)


def test_a_failed_file_write_fails_its_job_with_the_reason(tmp_path) -> None:
    """...and only its own: the job after it in the batch is still written (before, the
    failure ended the batch's loop, and that job reported a deadline it never met)."""
    fd = os.open(tmp_path / "ro.bin", os.O_RDONLY | os.O_CREAT)  # writes refused: EBADF
    try:
        span = memoryview(bytearray(10))
        job = CopyJob([memoryview(b"0123456789")], span, memcopy.buffer_address(span),
                      to_span=True, file=fd)
        after_span = memoryview(bytearray(10))
        after = CopyJob([memoryview(b"abcdefghij")], after_span,
                        memcopy.buffer_address(after_span), to_span=True)
        copier = Copier()
        copier.run([job, after], deadline=float("inf"))
        copier.close()
    finally:
        os.close(fd)
    assert not job.done and job.error is not None and "segment file" in job.error
    assert after.done and after.error is None and bytes(after_span) == b"abcdefghij"


@pytest.mark.parametrize("to_file", [False, True])
def test_on_done_reports_complete_jobs_in_order_while_later_ones_wait(
        tmp_path, monkeypatch: pytest.MonkeyPatch, to_file: bool) -> None:
    """`Copier.run(..., on_done)` hands over each job once it is copied and hashed, in the
    batch's order, on the calling thread, before the jobs after it are copied (a writer then
    commits it meanwhile); a failed file write (job 1's) is passed over; the last job is left
    to the caller.
    With files the helper hashes (parallel_min_bytes=1): a reported job's digest is there;
    each write here first waits for the helper to have hashed the jobs before it (on a busy
    machine the helper may start after the last write, and then the caller takes up all)."""
    size = 3 * FUSED_CHUNK_BYTES
    values = [os.urandom(size) for _ in range(4)]
    path = tmp_path / "segment.bin"
    path.write_bytes(bytes(4 * size))
    fd = os.open(path, os.O_RDWR)
    bad = os.open(tmp_path / "ro.bin", os.O_RDONLY | os.O_CREAT)  # job 1's writes: EBADF
    spans = [memoryview(bytearray(size)) for _ in values]
    try:
        jobs = [CopyJob([memoryview(v)], span, memcopy.buffer_address(span), to_span=True,
                        hashed=True, file=(bad if i == 1 else fd) if to_file else -1,
                        file_offset=i * size)
                for i, (v, span) in enumerate(zip(values, spans, strict=True))]
        reported: list[tuple[int, int | None, bool, int]] = []
        real_pwritev = os.pwritev

        def pwritev_after_the_hashes(f: int, buffers: list[memoryview], offset: int) -> int:
            until = time.monotonic() + 10
            while any(job.digest is None for job in jobs[:offset // size]) \
                    and time.monotonic() < until:
                time.sleep(0.001)
            return real_pwritev(f, buffers, offset)

        monkeypatch.setattr(memcopy.os, "pwritev", pwritev_after_the_hashes)

        def on_done(job: CopyJob) -> None:
            last_landed = (os.pread(fd, size, 3 * size) == values[3]) if to_file \
                else bytes(spans[3]) == values[3]
            reported.append((jobs.index(job), job.digest, last_landed, threading.get_ident()))

        copier = Copier(parallel_min_bytes=1 if to_file else 1 << 40)
        copier.run(jobs, deadline=float("inf"), on_done=on_done)
        copier.close()
    finally:
        os.close(fd)
        os.close(bad)
    me = threading.get_ident()
    assert [r[0] for r in reported] == ([0, 2] if to_file else [0, 1, 2])
    for i, digest, last_landed, thread in reported:
        assert digest == xxh3_64_intdigest(values[i]) and not last_landed and thread == me
    assert jobs[3].done and jobs[3].digest == xxh3_64_intdigest(values[3])
