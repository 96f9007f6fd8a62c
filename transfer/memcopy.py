"""Memory copies for the shm transport: bounded pieces, a deadline, optional fused hashing.

What it owns
    Running one batch's copies (`CopyJob`: one op, one (destination, source) pair per part) with
    `ctypes.memmove`, which releases the GIL, in pieces of at most PIECE_BYTES, checking the
    batch deadline before every piece. An op whose pieces did not all run before the deadline is
    not `done` (the transport fails it with ST_TIMEOUT; a write is then never committed).

Why pieces and a deadline
    The cancellation guarantee (`base`): when a read returns, no byte of its destinations is
    written afterwards. A copy is synchronous, so the only way to honour a deadline is to stop
    between pieces; and `run` returns only after every copy it started (on either thread) has
    ended, so nothing runs on after the transport returned. PIECE_BYTES of 4 MiB is ~0.5 ms of
    memcpy here: the most a deadline can be overrun by.

Why fused hashing
    A read whose caller will verify its xxh3_64 (`want_checksum`) is copied FUSED_CHUNK_BYTES at
    a time and each piece hashed right after it landed, while it is still in cache: the value's
    bytes cross the memory bus once, not twice. Such an op is copied in order on one thread.

Why two threads for large batches (measured on the 2-core machines here)
    One core's memcpy reaches about 6-11 GB/s. Batches of `parallel_min_bytes` or more are split
    in two halves by bytes: a helper thread copies the first half, the calling thread the second.
    16 x 4-16 MiB went from 6.5 to 10.4-11 GB/s with the second core idle, no gain (within
    +-10%) with it busy, nothing at 1 MiB objects. Source and destination page offsets need no
    staging copy (bench/limits.py: memcpy_aligned vs memcpy_dst_plus16 ran as fast).

It never copies outside the views it is given (callers bound them first) and never copies a
view by Python slicing assignment (that holds the GIL for the whole copy).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import xxhash

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


# One copy: (destination view, source view); both flat bytes of the same length.
Copy = tuple[memoryview, memoryview]


@dataclass(slots=True)
class CopyJob:
    """One op's copies, in order; `done` once every byte of them was copied."""

    copies: list[Copy]
    hashed: bool = False            # fuse an xxh3_64 of the destination bytes, in order
    done: bool = False
    digest: int | None = None
    _pieces: list[bool] = field(default_factory=list)  # per work item of this job: ran

    @property
    def nbytes(self) -> int:
        return sum(len(src) for _, src in self.copies)


# A unit of work: (job, [(dst address, src address, bytes, dst view for hashing)], index in
# job._pieces). A hashed job is one item (its pieces must run in order, on one thread).
_Item = tuple[CopyJob, list[tuple[int, int, int, memoryview]], int]


def _address(view: memoryview) -> int:
    """`buffer_address`, four times cheaper for a writable view (a scatter-gather batch asks
    for thousands: one per part and side)."""
    if view.readonly:
        return buffer_address(view)
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _items(jobs: Sequence[CopyJob]) -> list[_Item]:
    items: list[_Item] = []
    for job in jobs:
        job.done, job.digest, job._pieces = False, None, []
        step = FUSED_CHUNK_BYTES if job.hashed else PIECE_BYTES
        pieces: list[tuple[int, int, int, memoryview]] = []
        for dst, src in job.copies:
            n = len(src)
            assert len(dst) == n, "a copy's two views differ in length"
            if not n:
                continue
            d, s = _address(dst), _address(src)
            if n <= step:  # the common case of scatter-gather parts: no slicing
                pieces.append((d, s, n, dst))
                continue
            for pos in range(0, n, step):
                m = min(step, n - pos)
                pieces.append((d + pos, s + pos, m, dst[pos:pos + m] if job.hashed else dst))
        if job.hashed:
            job._pieces.append(False)
            items.append((job, pieces, 0))
            continue
        # One item per PIECE_BYTES of consecutive pieces: the deadline is still checked before
        # every piece, but a batch of many small parts is not thousands of items to split.
        run: list[tuple[int, int, int, memoryview]] = []
        run_bytes = 0
        for piece in pieces:
            if run and run_bytes + piece[2] > PIECE_BYTES:
                job._pieces.append(False)
                items.append((job, run, len(job._pieces) - 1))
                run, run_bytes = [], 0
            run.append(piece)
            run_bytes += piece[2]
        if run:
            job._pieces.append(False)
            items.append((job, run, len(job._pieces) - 1))
    return items


def _run_items(items: Sequence[_Item], deadline: float) -> None:
    memmove = ctypes.memmove
    clock = time.monotonic
    for job, pieces, k in items:
        h = xxhash.xxh3_64() if job.hashed else None
        for d, s, n, dst in pieces:
            if clock() > deadline:
                return  # the rest of the batch is not copied: those ops time out
            memmove(d, s, n)
            if h is not None:
                h.update(dst)
        if h is not None:
            job.digest = h.intdigest()
        job._pieces[k] = True


class Copier:
    """Runs batches of CopyJobs; thread-safe (one small helper pool shared by all batches)."""

    def __init__(self, parallel_min_bytes: int = PARALLEL_MIN_BYTES) -> None:
        self.parallel_min_bytes = parallel_min_bytes
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def run(self, jobs: Sequence[CopyJob], deadline: float) -> None:
        """Copy every job until the deadline (time.monotonic()); sets each job's `done` (and
        `digest` for hashed ones). Returns only when no copy it started is still running."""
        items = _items(jobs)
        total = sum(job.nbytes for job in jobs)
        executor = self._helper() if total >= self.parallel_min_bytes and len(items) > 1 else None
        if executor is None:
            _run_items(items, deadline)
        else:
            half, acc, cut = total // 2, 0, len(items)
            for k, (_, pieces, _) in enumerate(items):
                if acc >= half:
                    cut = k
                    break
                acc += sum(p[2] for p in pieces)
            fut = executor.submit(_run_items, items[:cut], deadline)
            try:
                _run_items(items[cut:], deadline)
            finally:
                fut.result()  # the guarantee: the helper's copies have ended too
        for job in jobs:
            job.done = all(job._pieces)

    def _helper(self) -> ThreadPoolExecutor | None:
        with self._lock:
            if self._closed:
                return None
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="cellar-shm-copy")
            return self._executor

    def close(self) -> None:
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
