"""Memory copies for the shm transport: bounded pieces, a deadline, optional fused hashing.

What it owns
    Running one batch's copies (`CopyJob`: one op, its parts on the caller's side, one
    contiguous span of a mapped segment on the other) in runs of at most PIECE_BYTES, each run
    one call of the native helper `_copyv.copy_pieces` (GIL released; `ctypes.memmove` per
    piece without it), checking the batch deadline before every run. An op whose runs did not
    all go before the deadline is not `done` (the transport fails it with ST_TIMEOUT; a write is
    then never committed). On the calling thread, jobs that completed are handed to the
    caller's `on_done` in order while later ones are still copied (`_Reporter`: shm sends
    their COMMITs meanwhile, transfer/shm_commits.py).

Why pieces and a deadline
    The cancellation guarantee (`base`): when a read returns, no byte of its destinations is
    written afterwards. A copy is synchronous, so the only way to honour a deadline is to stop
    between pieces; and `run` returns only after every copy it started (on either thread) has
    ended, so nothing runs on after the transport returned. PIECE_BYTES of 4 MiB is ~0.5 ms of
    memcpy here: the most a deadline can be overrun by.

Why fused hashing, and why of the segment's side
    A read whose caller will verify its xxh3_64 (`want_checksum`) is copied FUSED_CHUNK_BYTES at
    a time and each FUSED_CHUNK_BYTES of it hashed right after it was copied, while it is still
    in cache: the value's bytes cross the memory bus once, not twice. Such an op is copied in
    order on one thread. What is hashed is the segment's side of the copy, one contiguous span
    per op, so a scatter-gather read of 64 KiB parts (SGLang's layer_first pages) still hashes
    in 256 KiB calls: xxhash releases the GIL only for long inputs (about 100 KiB and more,
    measured here), and per-part calls made the two copy threads take turns on it (4096 x
    64 KiB: 48 ms on the main thread alone vs 28 ms for 128 x 2 MiB). It checks the same thing:
    the bytes just copied out of the span are the span's bytes after the copy, and an object
    under a pin is never rewritten, so a stale or reused range still fails the caller's check
    (it would have to change and change back during the copy to pass).

Why the fused loop stays in Python (measured 2026-12-03): a native job (every chunk's memmoves
and its xxh3 in one C call, the GIL released once, xxh3 compiled in from Debian's xxhash.h) read
16 x 1 MiB and 16 x 4 MiB 8-20% slower than this loop in an alternated A/B: the header's portable
build hashes with SSE2 at ~28 GB/s, the `xxhash` package dispatches to AVX2 at 42-50 GB/s, and
the GIL hand-offs it saved were not what the batch waited on.

Why two threads for large batches (measured on the 2-core machines here)
    One core's memcpy reaches about 6-11 GB/s. Batches of `parallel_min_bytes` or more are split
    in two halves by bytes: a helper thread copies the first half, the calling thread the second.
    16 x 4-16 MiB went from 6.5 to 10.4-11 GB/s with the second core idle, no gain (within
    +-10%) with it busy, nothing at 1 MiB objects. Source and destination page offsets need no
    staging copy (bench/limits.py: memcpy_aligned vs memcpy_dst_plus16 ran as fast).

Why file writes stay on one thread (measured 2026-12-05, alternated in one process)
    A batch of writes into a disk-backed file (`CopyJob.file`, the disk tier) is not split
    over the two threads: a buffered write holds the file's inode lock (ext4), so a second
    thread writing the same file waits for the first, spinning on the lock on a core the
    master and node need. Split, 16 x 1 MiB spilled puts cost the client 729 us of CPU per key
    put and read back; on one thread, with the hashing moved to the helper (it reads the
    caller's views, which the writes only read too), 584 us, at the same rate (3.11 vs 3.19
    GB/s, medians of 8 alternated rounds). Two threads writing two files ran no faster than
    one either: the page cache's copy is what bounds the rate here.

It never copies outside the views it is given (callers bound them first) and never copies a
view by Python slicing assignment (that holds the GIL for the whole copy).
"""

from __future__ import annotations

import ctypes
import os
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import xxhash

from cellar.transfer.lazy_pool import LazyPool

PIECE_BYTES = 4 << 20          # the longest uninterrupted memcpy (deadline granularity)
FUSED_CHUNK_BYTES = 256 << 10  # reads hashed as they land: copy and hash this much at a time
PARALLEL_MIN_BYTES = 8 << 20   # batches copying less than this stay on the calling thread


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def buffer_address(view: memoryview) -> int:
    """Address of the first byte of a C-contiguous buffer (read-only ones too). Valid while
    the caller holds `view`."""
    pb = _PyBuffer()
    _get_buffer(view, ctypes.byref(pb), 0)  # PyBUF_SIMPLE; raises on failure
    try:
        return int(pb.buf or 0)
    finally:
        _release_buffer(ctypes.byref(pb))


@dataclass(slots=True)
class CopyJob:
    """One op's copies between the caller's views and one contiguous span of a segment: a
    read copies the span out into `views` in order, a write (`to_span`) the views into it.
    `done` once every byte was copied."""

    views: Sequence[memoryview]     # the caller's side, in order (flat bytes)
    span: memoryview                # the segment's side: contiguous, as long as all views
    span_address: int               # address of span[0] (the mapping's base + offset)
    to_span: bool = False
    hashed: bool = False            # fuse an xxh3_64 of the span's bytes, in order
    # A write into a disk-backed file: pwritev to this descriptor at `file_offset` (the span's
    # place in the file) instead of a memcpy into the mapping (why: `_write_file`); -1: memcpy.
    file: int = -1
    file_offset: int = 0
    done: bool = False
    digest: int | None = None
    error: str | None = None        # why a file write failed (the op fails, nothing committed)
    _pieces: list[bool] = field(default_factory=list)  # per work item of this job: ran

    @property
    def nbytes(self) -> int:
        return len(self.span)


# A run: (int64 triples (dst address, src address, bytes), span offset to hash up to after
# it or -1, bytes). At most one step long: the deadline is checked before every run.
_Run = tuple[array | bytes, int, int]
# A unit of work: (job, its runs, index in job._pieces). A hashed job is one item (its runs
# must go in order, on one thread).
_Item = tuple[CopyJob, list[_Run], int]


def _address(view: memoryview) -> int:
    """`buffer_address`, four times cheaper for a writable view (a scatter-gather batch asks
    for thousands: one per part)."""
    if view.readonly:
        return buffer_address(view)
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _runs(job: CopyJob) -> list[_Run]:
    """The job's memmoves cut into runs of exactly one step (the last one shorter): PIECE_BYTES,
    or FUSED_CHUNK_BYTES for a hashed job, whose span is hashed after each run whatever the
    parts' sizes (the span is contiguous, so 64 KiB scatter-gather parts still hash in 256 KiB
    calls, which release the GIL: per part they would not, and two copy threads would
    serialise on it). Cut by the native helper when it is built (~10x faster), else by
    `_runs_py`: the same runs."""
    step = FUSED_CHUNK_BYTES if job.hashed else PIECE_BYTES
    cut = _runs_py if _cut_runs is None else _cut_runs
    runs, total = cut(job.views, job.span_address, job.to_span, step, job.hashed)
    if total != len(job.span):  # callers size the span from the views: a broken invariant
        raise ValueError(f"a copy job's views hold {total} bytes, its span {len(job.span)}")
    return runs


def _runs_py(views: Sequence[memoryview], seg: int, to_span: bool, step: int,
             hashed: bool) -> tuple[list[_Run], int]:
    """`_copyv.cut_runs` in Python: (runs, total bytes of the views)."""
    runs: list[_Run] = []
    table = array("q")
    pos = run_bytes = 0
    for view in views:
        n, off = len(view), 0
        a = _address(view) if n else 0
        while off < n:
            m = min(step - run_bytes, n - off)
            table.extend((seg + pos, a + off, m) if to_span else (a + off, seg + pos, m))
            pos, off, run_bytes = pos + m, off + m, run_bytes + m
            if run_bytes == step:
                runs.append((table, pos if hashed else -1, run_bytes))
                table, run_bytes = array("q"), 0
    if run_bytes:
        runs.append((table, pos if hashed else -1, run_bytes))
    return runs, pos


def _items(jobs: Sequence[CopyJob]) -> list[_Item]:
    items: list[_Item] = []
    for job in jobs:
        job.done, job.digest, job.error, job._pieces = False, None, None, []
        if job.file >= 0:  # one item, written in order (its one run only sizes the split)
            job._pieces.append(False)
            items.append((job, [(b"", -1, job.nbytes)], 0))
            continue
        runs = _runs(job)
        if job.hashed:
            job._pieces.append(False)
            items.append((job, runs, 0))
            continue
        for run in runs:  # one item per run: a large batch splits over two threads by runs
            job._pieces.append(False)
            items.append((job, [run], len(job._pieces) - 1))
    return items


def _memmove_each(table: array | bytes) -> None:
    """`copy_pieces` without the native helper: one ctypes.memmove per piece."""
    memmove = ctypes.memmove
    triples = table if isinstance(table, array) else array("q", table)
    for i in range(0, len(triples), 3):
        memmove(triples[i], triples[i + 1], triples[i + 2])


_cut_runs: Callable[..., tuple[list[_Run], int]] | None = None
try:  # the native helper (setup.py builds it when a C compiler is there)
    from cellar.transfer import _copyv

    _copy_pieces: Callable[[array | bytes], None] = _copyv.copy_pieces
    _cut_runs = _copyv.cut_runs
except ImportError:  # pragma: no cover - depends on the install
    _copy_pieces = _memmove_each
NATIVE = _copy_pieces is not _memmove_each


def _run_items(items: Sequence[_Item], deadline: float, hash_files: bool = True,
               after: Callable[[], None] | None = None) -> None:
    """Run `items` in order until the deadline; `after()` once each has run (see `_Reporter`)."""
    copy_pieces = _copy_pieces
    clock = time.monotonic
    for job, runs, k in items:
        if after is not None:  # what ran before it
            after()
        if job.file >= 0:
            if _write_file(job, deadline, hash_files):
                job._pieces[k] = True
            elif job.error is None:
                return  # past the deadline: the rest of the batch is not copied
            continue  # a failed write fails its own op (`error`), not the ops after it
        h = xxhash.xxh3_64() if job.hashed else None
        hashed_to = 0
        for table, mark, _ in runs:
            if clock() > deadline:
                return  # the rest of the batch is not copied: those ops time out
            copy_pieces(table)
            if h is not None:
                h.update(job.span[hashed_to:mark])  # just copied: still in cache
                hashed_to = mark
        if h is not None:
            job.digest = h.intdigest()
        job._pieces[k] = True


class _Reporter:
    """Hands each job that is complete (every piece ran, its digest made when hashed) to
    `on_done`, in the batch's order, on the calling thread: a writer sends a job's COMMIT
    while the jobs after it are still being copied (transfer/shm_commits.py). A job that
    failed is passed over; one not complete yet stops the sweep until the next call."""

    __slots__ = ("jobs", "on_done", "next")

    def __init__(self, jobs: Sequence[CopyJob], on_done: Callable[[CopyJob], None]) -> None:
        self.jobs = jobs
        self.on_done = on_done
        self.next = 0

    def __call__(self) -> None:
        jobs = self.jobs
        while self.next < len(jobs):
            job = jobs[self.next]
            if job.error is None:
                if not all(job._pieces) or (job.hashed and job.digest is None):
                    return
                self.on_done(job)
            self.next += 1


def _hash_views(jobs: Sequence[CopyJob]) -> None:
    """Each job's digest: the xxh3_64 of its views (the caller's side), in order."""
    for job in jobs:
        h = xxhash.xxh3_64()
        for view in job.views:
            h.update(view)
        job.digest = h.intdigest()


IOV_PARTS = 512  # buffers per pwritev call (the kernel takes at most IOV_MAX, 1024)


def _write_file(job: CopyJob, deadline: float, hashing: bool = True) -> bool:
    """Write the job's views into its file with pwritev, PIECE_BYTES (FUSED_CHUNK_BYTES when
    hashed here, each chunk hashed right after, from cache) at a time, checking the deadline
    before each; False if the deadline passed or a write failed (`job.error`). Without
    `hashing` a hashed job's digest is left to the caller (`Copier._write_files`).

    Why not memcpy into the mapping: a store into a page of a disk-backed MAP_SHARED mapping
    that was never written, or was written back since, takes a page fault through the
    filesystem (ext4's page_mkwrite, block accounting, 4 KiB at a time): 16 x 1 MiB spilled
    puts ran 1.5 GB/s into fresh ranges against 4.8 into ranges just rewritten, where pwrite
    takes the page cache's write path (large folios) at the file's buffered write speed."""
    hashed = job.hashed and hashing
    step = FUSED_CHUNK_BYTES if hashed else PIECE_BYTES
    h = xxhash.xxh3_64() if hashed else None
    position = job.file_offset
    for chunk, size in _chunks(job.views, step):
        if time.monotonic() > deadline:
            return False
        try:
            pwritev_all(job.file, chunk, position)
        except OSError as exc:
            job.error = f"write into the segment file: {exc.strerror or exc}"
            return False
        if h is not None:
            for part in chunk:
                h.update(part)
        position += size
    if h is not None:
        job.digest = h.intdigest()
    return True


def _chunks(views: Sequence[memoryview], step: int) -> Iterator[tuple[list[memoryview], int]]:
    """The views cut into consecutive chunks of `step` bytes (the last shorter): (parts, bytes)."""
    chunk: list[memoryview] = []
    size = 0
    for view in views:
        n, off = len(view), 0
        while off < n:
            m = min(step - size, n - off)
            chunk.append(view[off:off + m])
            size, off = size + m, off + m
            if size == step:
                yield chunk, size
                chunk, size = [], 0
    if chunk:
        yield chunk, size


def pwritev_all(fd: int, parts: list[memoryview], position: int) -> None:
    """pwritev every byte of `parts` at `position` (a short write goes on where it stopped)."""
    first, head = 0, 0  # the next part to write, and how much of it is written already
    while first < len(parts):
        batch = [parts[first][head:], *parts[first + 1:first + IOV_PARTS]]
        wrote = os.pwritev(fd, batch, position)
        if wrote <= 0:
            raise OSError(f"pwritev wrote {wrote} bytes")
        position += wrote
        wrote += head
        while first < len(parts) and wrote >= len(parts[first]):
            wrote -= len(parts[first])
            first += 1
        head = wrote


class Copier:
    """Runs batches of CopyJobs; thread-safe (one small helper pool shared by all batches)."""

    def __init__(self, parallel_min_bytes: int = PARALLEL_MIN_BYTES) -> None:
        self.parallel_min_bytes = parallel_min_bytes
        self._pool = LazyPool(1, "cellar-shm-copy")

    def run(self, jobs: Sequence[CopyJob], deadline: float,
            on_done: Callable[[CopyJob], None] | None = None) -> None:
        """Copy every job until the deadline (time.monotonic()); sets each job's `done` (and
        `digest` for hashed ones). Returns only when no copy it started is still running.
        `on_done(job)`, on this thread, as jobs complete while later ones are still copied
        (`_Reporter`); jobs it was not called for by the return (the last ones, and every job
        of a batch split over two threads) are the caller's to take up."""
        items = _items(jobs)
        total = sum(job.nbytes for job in jobs)
        executor = (self._pool.get() if total >= self.parallel_min_bytes and len(items) > 1
                    else None)
        after = None if on_done is None else _Reporter(jobs, on_done)
        if executor is not None and all(job.file >= 0 for job in jobs):
            self._write_files(items, executor, deadline, after)
        elif executor is None:
            _run_items(items, deadline, after=after)
        else:
            half, acc, cut = total // 2, 0, len(items)
            for k, (_, runs, _) in enumerate(items):
                if acc >= half:
                    cut = k
                    break
                acc += sum(r[2] for r in runs)
            fut = executor.submit(_run_items, items[:cut], deadline)
            try:
                _run_items(items[cut:], deadline)
            finally:
                fut.result()  # the guarantee: the helper's copies have ended too
        for job in jobs:
            job.done = all(job._pieces)

    @staticmethod
    def _write_files(items: list[_Item], executor: ThreadPoolExecutor, deadline: float,
                     after: Callable[[], None] | None = None) -> None:
        """A large batch of file writes: every pwritev on the calling thread, the hashing on
        the helper (see "Why file writes stay on one thread" above), a job's digest set as
        soon as it is made (`after` may find it then)."""
        fut = executor.submit(_hash_views, [job for job, _, _ in items if job.hashed])
        try:
            _run_items(items, deadline, hash_files=False, after=after)
        finally:
            fut.result()  # a digest is read only once the whole batch ran

    def close(self) -> None:
        self._pool.close()
