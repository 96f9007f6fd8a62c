"""The shm transport: same-host clients copy straight to and from a node's mapped segment file.

A storage node's segment is a shared-memory file (`<shm_dir>/cellar-<node>-<i>.seg`) that it
advertises as the segment's "shm" endpoint, beside its host id. A client on the same host
(route.host_id equals `local_host_id()`, the function the node uses too) whose user can open
the file maps it once, MAP_SHARED read/write, and moves payloads with memcpy: no socket, no
node thread, no copy but the one.

Writes: memcpy, then COMMIT. The payload is copied into the granted range first; then one
small COMMIT frame per op (the WRITE grant, WriteMeta, the range, and the (st_dev, st_ino) of
the file the client copied into; no payload) goes over the node's TCP port, all of a batch's
commits to one node pipelined in one round trip (`control.ControlChannel`). The node runs
exactly the checks a TCP WRITE gets (grant MAC, op, epoch, expiry, range, key tag, not sealed,
same file) and only then records the range as written; a refused commit fails the op. Why
copying before the check is acceptable: any process that can open the segment file (same
host, same user) can already write every byte of it, grant or not, so checking before the
copy would protect nothing; what the grant check on COMMIT protects is what matters: the
node's index only ever records ranges a valid grant covered, an allocation is only sealed by
committed writes, and a sealed object is never reported rewritten. The client itself never
writes outside a range its grant covers (checked before the copy).

Reads: memcpy out of the mapping. No round trip: the SDK verifies the xxh3 checksum of every
value it returns, so a torn or stale range is an IntegrityError, never silent bad data. When
the op asks for it (`want_checksum`), the transport hashes each piece of the destination right
after copying it (FUSED_CHUNK_BYTES at a time, still in cache) and returns the digest in
`TransferResult.checksum`, so the value's bytes cross the memory bus once, not twice.

A node that died leaves its file (and its bytes) behind, but its objects are no longer its to
serve: a running node holds an exclusive flock on its segment file, so before a batch uses a
mapping the client probes with a non-blocking shared flock (one syscall while the node lives)
and fails the ops with ST_CONNECT_FAILED, as TCP would with a refused connection.

Mappings are cached per path. Before a batch uses one, `os.stat(path)` must still show the
mapped file (same st_dev, st_ino, st_size): a node that restarted and recreated its file, or
whose file is gone, is detected, the old mapping dropped and the file mapped again
(`stats["remaps"]`). The check cannot race a write into lasting harm: the grant of the batch
was issued for the node incarnation whose file the stat sees, and a COMMIT names the file it
copied into, so a node restarted after the stat refuses the commit. `forget(route)` drops a
mapping; it is unmapped once no batch in flight still uses it (reference counting), so a
concurrent copy never touches unmapped memory. (`forget` keeps a mapping whose file is still
the one mapped: the SDK calls it after every failed transfer, e.g. while a node is down.)

Copy speed (measured on the 2-core machines here): Python's memcpy holds the GIL and one core
reaches about 6-11 GB/s; copies of large batches are therefore split in two halves by bytes,
one copied by a helper thread with `ctypes.memmove` (which releases the GIL), the other on the
calling thread. Measured: 16 x 4-16 MiB went from 6.5 to 10.4-11 GB/s with the second core
idle (as in a client beside an idle node), no gain (within +-10%) with it busy, and nothing at
1 MiB objects; so only batches of PARALLEL_MIN_BYTES or more are split. Source and destination page
offsets need no staging copy here: memcpy ran as fast 16 bytes off the page offset as aligned
(bench/limits.py: memcpy_aligned vs memcpy_dst_plus16).

It never lets a copy run outside the mapping or outside the op's grant (both checked first),
and never imports storage-node code (the host id function is duplicated and pinned by a test).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import xxhash

from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    SegmentRoute,
    TransferOp,
    TransferResult,
    Transport,
    byte_view,
    local_host_id,
)
from cellar.transfer.control import ControlCall, ControlChannel
from cellar.transfer.frame import (
    OP_COMMIT,
    ST_BAD_FRAME,
    ST_OK,
    ST_OUT_OF_RANGE,
    ST_UNKNOWN_SEGMENT,
    ST_UNSUPPORTED,
    FrameError,
    pack_commit_meta,
)

PARALLEL_MIN_BYTES = 8 << 20      # batches copying less than this stay on the calling thread
FUSED_CHUNK_BYTES = 256 << 10     # reads hashed as they land: copy and hash this much at a time
NEGATIVE_CACHE_S = 1.0            # a path that failed to open is not retried for this long
MAX_MAPPINGS = 4096               # bound of the mapping cache (one per segment file)
# Mappings up to this size are prefaulted when made (MAP_POPULATE): measured here, a first
# touch of a tmpfs page through a new mapping costs ~2.3 us as a page fault but ~0.4 us when
# populated up front (256 MiB: 154 ms of faults vs 27 ms), and every put lands on pages this
# client never touched. Larger segments fault on demand (page tables: 2 MiB per GiB).
POPULATE_MAX_BYTES = 8 << 30




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


class Mapping:
    """One segment file mapped MAP_SHARED read/write. Unmapped when the last reference goes."""

    __slots__ = ("path", "dev", "ino", "size", "memory", "address", "_mm", "_fd",
                 "__weakref__")

    def __init__(self, path: str) -> None:
        self._fd = -1
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_size <= 0:
                raise OSError(f"{path} is empty")
            flags = mmap.MAP_SHARED
            if st.st_size <= POPULATE_MAX_BYTES:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            self._mm = mmap.mmap(fd, st.st_size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept for the liveness probe (flock)
        self.path = path
        self.dev, self.ino, self.size = st.st_dev, st.st_ino, st.st_size
        self.memory = memoryview(self._mm)
        self.address = buffer_address(self.memory)

    def current(self) -> bool:
        """Whether `path` still names the file this maps (same device, inode and size)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino, st.st_size) == (self.dev, self.ino, self.size)

    def served(self) -> bool:
        """Whether a node process still serves this file: a running node holds an exclusive
        flock on its segment file, so a shared lock we can take means nobody does (the node
        died; its memory outlives it, but its objects are no longer its to hand out)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return False

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1




# Whether this TransferResult can carry a read's checksum (TransferOp.want_checksum).
_RESULT_HAS_CHECKSUM = "checksum" in getattr(TransferResult, "__slots__", ()) or \
    hasattr(TransferResult(), "checksum")

# One copy: (destination view, source view); both flat bytes of the same length.
_Copy = tuple[memoryview, memoryview]


class ShmTransport(Transport):
    """Same-host transfers through mapped segment files; thread-safe.

    host_id: this machine's id (default `local_host_id()`); routes of other hosts are not ours.
    control: the channel COMMIT frames go through (default: a new `ControlChannel`).
    parallel_min_bytes: a batch copying at least this much is split over two threads.
    `stats`: maps, remaps, ops and bytes moved, commits refused (for tests and metrics).
    """

    name = "shm"

    def __init__(self, *, host_id: str | None = None, control: ControlChannel | None = None,
                 parallel_min_bytes: int = PARALLEL_MIN_BYTES,
                 connect_timeout_s: float = 5.0) -> None:
        self.host_id = host_id if host_id is not None else local_host_id()
        self.parallel_min_bytes = parallel_min_bytes
        self._control = control or ControlChannel(connect_timeout_s=connect_timeout_s)
        self._lock = threading.Lock()
        self._maps: dict[str, Mapping] = {}
        self._unreachable: dict[str, float] = {}  # path -> monotonic time to retry opening
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self.stats: dict[str, int] = {"maps": 0, "remaps": 0, "reads": 0, "writes": 0,
                                      "bytes_read": 0, "bytes_written": 0, "commits_refused": 0}

    # -- Transport -------------------------------------------------------------------------

    def can_reach(self, route: SegmentRoute) -> bool:
        if route.host_id != self.host_id:
            return False
        path = route.endpoints.get(self.name)
        if not path:
            return False
        with self._lock:
            if path in self._maps:
                return True
        return self._mapping(path, fresh=False) is not None

    def forget(self, route: SegmentRoute) -> None:
        """Drop the node's control connections, and its mapping unless `path` still names the
        very file mapped (then the mapping is still the node's memory, and remapping it would
        only cost a populate per failed batch while the node is down)."""
        path = route.endpoints.get(self.name)
        if path:
            with self._lock:
                m = self._maps.get(path)
            if m is not None and not m.current():
                with self._lock:
                    if self._maps.get(path) is m:
                        del self._maps[path]  # unmapped when the last batch using it is done
            with self._lock:
                self._unreachable.pop(path, None)
        tcp = route.endpoints.get("tcp")
        if tcp:
            self._control.forget(tcp)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._maps.clear()
            executor, self._executor = self._executor, None
        self._control.close()
        if executor is not None:
            executor.shutdown(wait=True)

    def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        results, copies, _ = self._plan(ops, writing=False)
        owners = [i for i, r in enumerate(results) if r.ok]  # copies are in op order
        hashed = [bool(getattr(ops[i], "want_checksum", False)) and _RESULT_HAS_CHECKSUM
                  for i in owners]
        if any(hashed):
            for i, digest in zip(owners, self._copy_hashed(copies, hashed), strict=True):
                if digest is not None:
                    results[i].checksum = digest  # type: ignore[attr-defined,unused-ignore]
        else:
            self._copy(copies)
        self._count("reads", "bytes_read", ops, results)
        return results

    def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        deadline = time.monotonic() + timeout_s
        results, copies, commits = self._plan(ops, writing=True)
        self._copy(copies)
        calls: dict[str, list[ControlCall]] = {}
        which: dict[str, list[int]] = {}
        for i, address, call in commits:
            calls.setdefault(address, []).append(call)
            which.setdefault(address, []).append(i)
        replies = self._control.call(calls, max(0.0, deadline - time.monotonic()))
        refused = 0
        for address, indexes in which.items():
            for i, reply in zip(indexes, replies[address], strict=True):
                if reply.status != ST_OK:
                    results[i] = TransferResult(reply.status, reply.message)
                    refused += 1
                    if reply.status == ST_UNKNOWN_SEGMENT:  # the node's file changed under us
                        path = ops[i].route.endpoints.get(self.name, "")
                        with self._lock:
                            self._maps.pop(path, None)
        with self._lock:
            self.stats["commits_refused"] += refused
        self._count("writes", "bytes_written", ops, results)
        return results

    def _count(self, ops_key: str, bytes_key: str, ops: Sequence[TransferOp],
               results: list[TransferResult]) -> None:
        done = [op for op, r in zip(ops, results, strict=True) if r.ok]
        nbytes = sum(memoryview(op.buffer).nbytes for op in done)
        with self._lock:
            self.stats[ops_key] += len(done)
            self.stats[bytes_key] += nbytes

    # -- planning --------------------------------------------------------------------------

    def _plan(self, ops: Sequence[TransferOp], *, writing: bool
              ) -> tuple[list[TransferResult], list[_Copy], list[tuple[int, str, ControlCall]]]:
        """Check every op; the copies to make and (writes) the commits to send after them."""
        results = [TransferResult() for _ in ops]
        copies: list[_Copy] = []
        commits: list[tuple[int, str, ControlCall]] = []
        checked: dict[str, Mapping | None] = {}  # one stat per path per batch
        served: dict[str, bool] = {}              # one flock probe per path per batch
        for i, op in enumerate(ops):
            route = op.route
            path = route.endpoints.get(self.name)
            if route.host_id != self.host_id or not path:
                results[i] = TransferResult(ST_UNSUPPORTED, f"segment {route.segment_id} of node "
                                            f"{route.node_id} is not on this host")
                continue
            if path not in checked:
                checked[path] = self._mapping(path, fresh=True)
            m = checked[path]
            if m is None:
                results[i] = TransferResult(ST_CONNECT_FAILED, f"cannot map {path}")
                continue
            if path not in served:
                served[path] = m.served()
            if not served[path]:
                results[i] = TransferResult(ST_CONNECT_FAILED, f"node {route.node_id} is not "
                                            f"running (nobody holds {path})")
                continue
            try:
                view = byte_view(op.buffer, writable=not writing)
            except (ValueError, TypeError) as e:
                results[i] = TransferResult(ST_UNSUPPORTED, f"buffer: {e}")
                continue
            n, grant = len(view), op.grant
            if not grant.covers(route.segment_id, op.offset, n):
                results[i] = TransferResult(ST_OUT_OF_RANGE, f"[{op.offset}, +{n}) is outside "
                                            f"the grant [{grant.offset}, +{grant.length})")
                continue
            if op.offset < 0 or op.offset + n > m.size:
                results[i] = TransferResult(ST_OUT_OF_RANGE, f"[{op.offset}, +{n}) is outside "
                                            f"{path} ({m.size} bytes)")
                continue
            seg = m.memory[op.offset:op.offset + n]
            if writing:
                address = route.endpoints.get("tcp")
                if not address:
                    results[i] = TransferResult(ST_UNSUPPORTED, f"node {route.node_id} has no "
                                                "tcp endpoint to commit to")
                    continue
                if op.meta is None:
                    results[i] = TransferResult(ST_BAD_FRAME, "a write needs its WriteMeta")
                    continue
                try:
                    meta = pack_commit_meta(op.meta, m.dev, m.ino)
                except FrameError as e:
                    results[i] = TransferResult(e.status, e.message)
                    continue
                copies.append((seg, view))
                commits.append((i, address, ControlCall(OP_COMMIT, grant, route.segment_id,
                                                        op.offset, n, meta)))
            else:
                copies.append((view, seg))
        return results, copies, commits

    def _mapping(self, path: str, *, fresh: bool) -> Mapping | None:
        """The cached mapping of `path` (with `fresh`: checked against the file first), else
        a new one; None if the file cannot be mapped (retried after NEGATIVE_CACHE_S)."""
        with self._lock:
            if self._closed:
                return None
            m = self._maps.get(path)
            retry_at = self._unreachable.get(path, 0.0)
        if m is not None and (not fresh or m.current()):
            return m
        if m is None and time.monotonic() < retry_at:
            return None
        try:
            new = Mapping(path)
        except (OSError, ValueError):
            with self._lock:
                self._maps.pop(path, None)
                self._unreachable[path] = time.monotonic() + NEGATIVE_CACHE_S
            return None
        with self._lock:
            if self._closed:
                return None
            old = self._maps.get(path)
            if old is not None and old.ino == new.ino and old.dev == new.dev \
                    and old.size == new.size:
                return old  # another batch remapped first
            if old is not None or m is not None:
                self.stats["remaps"] += 1
            if len(self._maps) >= MAX_MAPPINGS:
                self._maps.pop(next(iter(self._maps)))
            self._maps[path] = new
            self._unreachable.pop(path, None)
            self.stats["maps"] += 1
        return new

    # -- copying ---------------------------------------------------------------------------

    def _copy(self, copies: list[_Copy]) -> None:
        total = sum(len(src) for _, src in copies)
        if total < self.parallel_min_bytes or total < 2:
            for dst, src in copies:
                dst[:] = src
            return
        # Split the bytes in two halves (cutting one copy if needed): the helper thread takes
        # the first half, this thread the second; ctypes.memmove releases the GIL.
        half = total // 2
        first: list[_Copy] = []
        second: list[_Copy] = []
        acc = 0
        for dst, src in copies:
            n = len(src)
            if acc >= half:
                second.append((dst, src))
            elif acc + n <= half:
                first.append((dst, src))
            else:
                cut = half - acc
                first.append((dst[:cut], src[:cut]))
                second.append((dst[cut:], src[cut:]))
            acc += n
        fut = self._submit(first)
        _memmove_all(second)
        fut.result()

    def _copy_hashed(self, copies: list[_Copy], hashed: list[bool]) -> list[int | None]:
        """Reads whose caller will verify a checksum: copy each in FUSED_CHUNK_BYTES pieces and
        hash every piece right after it landed, while it is still in cache, so the bytes are
        read from memory once instead of twice. Big batches are dealt out by whole ops (a
        hash runs in order) to this thread and a helper; memmove and xxh3 release the GIL."""
        digests: list[int | None] = [None] * len(copies)
        items = list(range(len(copies)))
        total = sum(len(src) for _, src in copies)
        if total < self.parallel_min_bytes or len(copies) < 2:
            _copy_hash_all(copies, hashed, items, digests)
            return digests
        half, acc, cut = total // 2, 0, len(items)
        for k in items:
            if acc >= half:
                cut = k
                break
            acc += len(copies[k][1])
        with self._lock:
            executor = None if self._closed else self._executor_locked()
        if executor is None:
            _copy_hash_all(copies, hashed, items, digests)
            return digests
        fut = executor.submit(_copy_hash_all, copies, hashed, items[:cut], digests)
        _copy_hash_all(copies, hashed, items[cut:], digests)
        fut.result()
        return digests

    def _executor_locked(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="cellar-shm-copy")
        return self._executor

    def _submit(self, copies: list[_Copy]) -> Future[None]:
        with self._lock:
            if not self._closed:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="cellar-shm-copy")
                return self._executor.submit(_memmove_all, copies)
        done: Future[None] = Future()
        _memmove_all(copies)
        done.set_result(None)
        return done


def _copy_hash_all(copies: list[_Copy], hashed: list[bool], items: list[int],
                   digests: list[int | None]) -> None:
    memmove = ctypes.memmove
    for k in items:
        dst, src = copies[k]
        n = len(src)
        assert len(dst) == n
        if not n:
            if hashed[k]:
                digests[k] = xxhash.xxh3_64_intdigest(b"")
            continue
        d, s_ = buffer_address(dst), buffer_address(src)
        if not hashed[k]:
            memmove(d, s_, n)
            continue
        h = xxhash.xxh3_64()
        for pos in range(0, n, FUSED_CHUNK_BYTES):
            m = min(FUSED_CHUNK_BYTES, n - pos)
            memmove(d + pos, s_ + pos, m)
            h.update(dst[pos:pos + m])
        digests[k] = h.intdigest()


def _memmove_all(copies: list[_Copy]) -> None:
    memmove = ctypes.memmove
    for dst, src in copies:
        n = len(src)
        assert len(dst) == n
        if n:
            memmove(buffer_address(dst), buffer_address(src), n)
