"""The shm transport: same-host clients copy straight to and from a node's mapped segment file.

A storage node's segment is a shared-memory file (`<shm_dir>/cellar-<node>-<i>.seg`) that it
advertises as the segment's "shm" endpoint, beside its host id. A client on the same host
(route.host_id equals `local_host_id()`, the function the node uses too) whose user can open
the file maps it once, MAP_SHARED read/write, and moves payloads with memcpy: no socket, no
node thread, no copy but the one.

Writes: memcpy, then COMMIT. The payload is copied into the granted range first; then one
small COMMIT frame per op (the WRITE grant, WriteMeta, the range, and the (st_dev, st_ino) of
the file the client copied into; no payload) goes over the node's TCP port, all of a batch's
commits to one node pipelined on one connection (`control.ControlStream`): those of ops
already copied go in groups of EARLY_COMMIT_BYTES while the rest is still being copied, so
the node checks them meanwhile, and the replies are read once the copy ended. The node runs
exactly the checks a TCP WRITE gets (grant MAC, op, epoch, expiry, range, key tag, not sealed,
same file) and only then records the range as written; a refused commit fails the op. Why
copying before the check is acceptable: any process that can open the segment file (same
host, same user) can already write every byte of it, grant or not, so checking before the
copy would protect nothing; what the grant check on COMMIT protects is what matters: the
node's index only ever records ranges a valid grant covered, an allocation is only sealed by
committed writes, and a sealed object is never reported rewritten. The client itself never
writes outside a range its grant covers (checked before the copy). What the node must know
before the copy is that the range is no longer its previous object's: a reader that unpinned
that object still holds a read grant for it, and the node would serve it the new bytes until
the master's freed notice arrives. So an allocation the master flags (`TransferOp.claim`) is
CLAIMed first (OP_CLAIM, one pipelined round trip per node per batch, `WritePlan`): the node
drops the range's older entries, as a tcp write's first frame makes it do. A write that leaves its
checksum to the transport (`want_checksum`) is hashed as it is copied (the range, 256 KiB at a
time right after the copy) and its COMMIT carries that digest (`hashes_writes`).

Reads: memcpy out of the mapping. No round trip: the SDK verifies the xxh3 checksum of every
value it returns, so a torn or stale range is an IntegrityError, never silent bad data. When
the op asks for it (`want_checksum`), the transport hashes the range it read, FUSED_CHUNK_BYTES
at a time right after copying them (still in cache; `memcopy` says why the segment's side
is the one hashed), and returns the digest in
`TransferResult.checksum`, so the value's bytes cross the memory bus once, not twice.

Disk-backed files (a node's disk tier, docs/disk-tier.md) are mapped the same way, with three
differences, each measured (the constants below say where): they are never MAP_POPULATEd (that
would read the whole file in), writes go through the file with pwritev rather than stores into
the mapping (a store into a page never written, or written back since, faults through the
filesystem 4 KiB at a time), and a read of up to WILLNEED_MAX_OP_BYTES whose first page is not
cached asks for readahead of its range before the batch's copies start.

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

Copies go through `memcopy.Copier`: pieces of at most 4 MiB with the batch deadline checked
before each one (an op not fully copied in time fails with ST_TIMEOUT, and a write is then never
committed), reads that want their checksum hashed as they land, large batches split over two
threads; it returns only when every copy it started has ended, so no byte lands in a read's
destination after `read` returned. Scatter-gather ops (`TransferOp.parts`) copy part by part
into or out of consecutive ranges of the segment: no staging copy.

`write` is `plan_write` (checks, the CLAIM and COMMIT calls) + the claims + `copy_write`
(copies, early commits beside them) + the other commits + `finish_write`; the asyncio face
(`shm_async`) runs the same parts around claims and commits sent on its event loop, all of
its commits after the copy.

It never lets a copy run outside the mapping or outside the op's grant (both checked first),
and never imports storage-node code (the host id function is duplicated and pinned by a test).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence

from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_TIMEOUT,
    SegmentRoute,
    TransferOp,
    TransferResult,
    Transport,
    local_host_id,
    op_nbytes,
    op_views,
)
from cellar.transfer.control import ControlCall, ControlChannel
from cellar.transfer.frame import (
    OP_COMMIT,
    ST_BAD_FRAME,
    ST_INTERNAL,
    ST_OK,
    ST_OUT_OF_RANGE,
    ST_UNKNOWN_SEGMENT,
    ST_UNSUPPORTED,
    FrameError,
    pack_commit_meta,
)
from cellar.transfer.memcopy import PARALLEL_MIN_BYTES, Copier, CopyJob, buffer_address
from cellar.transfer.shm_commits import (
    Commit,
    EarlyCommits,
    WritePlan,
    group_commits,
    triples,
)
from cellar.transfer.spin_wait import SpinWait

NEGATIVE_CACHE_S = 1.0            # a path that failed to open is not retried for this long
MAX_MAPPINGS = 4096               # bound of the mapping cache (one per segment file)
# Mappings of memory-backed files (tmpfs, hugetlbfs) up to this size are prefaulted when
# made (MAP_POPULATE): measured here, a first touch of a tmpfs page through a new mapping
# costs ~2.3 us as a page fault but ~0.4 us when populated up front (256 MiB: 154 ms of faults
# vs 27 ms), and every put lands on pages this client never touched. Larger segments fault on
# demand (page tables: 2 MiB per GiB). A disk-tier file is never populated: that would read
# the whole file into the page cache (a 512 MiB file's first put took 0.9 s).
POPULATE_MAX_BYTES = 8 << 30
MEMORY_FS_MAGICS = frozenset({0x01021994, 0x958458F6})  # TMPFS_MAGIC, HUGETLBFS_MAGIC
STATFS_BYTES = 256                 # more than struct statfs (120 bytes on x86-64 and arm64)
_libc = ctypes.CDLL(None, use_errno=True)
_mincore = getattr(_libc, "mincore", None)
_RESIDENT = (ctypes.c_ubyte * 1)()  # mincore's answer for one page (one per process: a hint)
# Reads of a disk-backed file this long or shorter ask for readahead of their whole range
# before the batch's copies start (Mapping.will_need), so a batch's cold objects are read by
# the device together. Measured cold (pages evicted) on this VM, 16 objects, alternated: 1 MiB
# 0.46-0.63 -> 0.81-1.01 GB/s with it; 4 MiB 1.36-1.68 without, 1.06-1.08 with (the madvise
# allocates and submits all 64 MiB before the first copy, where the kernel's read-around on
# each page fault streams a long object as the copy goes).
WILLNEED_MAX_OP_BYTES = 1 << 20


def _memory_backed(fd: int) -> bool:
    """Whether `fd`'s file lives in memory (fstatfs's f_type, the struct's first field); False
    when that cannot be told, so a file of unknown kind is never read in whole."""
    try:
        buf = ctypes.create_string_buffer(STATFS_BYTES)
        if _libc.fstatfs(fd, buf) != 0:
            return False
        f_type = buf.raw[:ctypes.sizeof(ctypes.c_long)]  # __fsword_t
        return int.from_bytes(f_type, sys.byteorder) in MEMORY_FS_MAGICS
    except (AttributeError, OSError):
        return False




class Mapping:
    """One segment file mapped MAP_SHARED read/write. Unmapped when the last reference goes."""

    __slots__ = ("path", "dev", "ino", "size", "memory", "address", "memory_backed", "_mm",
                 "_fd", "__weakref__")

    def __init__(self, path: str) -> None:
        self._fd = -1
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_size <= 0:
                raise OSError(f"{path} is empty")
            flags = mmap.MAP_SHARED
            memory_backed = _memory_backed(fd)
            if st.st_size <= POPULATE_MAX_BYTES and memory_backed:
                flags |= getattr(mmap, "MAP_POPULATE", 0)
            self._mm = mmap.mmap(fd, st.st_size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept for the liveness probe (flock)
        self.memory_backed = memory_backed
        self.path = path
        self.dev, self.ino, self.size = st.st_dev, st.st_ino, st.st_size
        self.memory = memoryview(self._mm)
        self.address = buffer_address(self.memory)

    @property
    def fd(self) -> int:
        """The open file (read/write) behind the mapping, valid while the mapping is."""
        return self._fd

    def will_need(self, offset: int, length: int) -> None:
        """Start reading [offset, +length) of a disk-backed file into the page cache (readahead,
        asynchronous) unless its first page is cached (one mincore, ~1 us: the madvise walks
        every page, ~15 us per MiB even when all are cached): a batch's cold ranges are then
        read by the device together, not one page fault at a time as the copy reaches them.
        A hint: a refusal changes nothing."""
        start = offset - offset % mmap.PAGESIZE
        if _mincore is not None and _mincore(ctypes.c_void_p(self.address + start),
                                             ctypes.c_size_t(1), _RESIDENT) == 0 \
                and _RESIDENT[0] & 1:
            return
        try:
            self._mm.madvise(mmap.MADV_WILLNEED, start, length + offset - start)
        except (OSError, ValueError):
            pass

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




class ShmTransport(Transport):
    """Same-host transfers through mapped segment files; thread-safe.

    host_id: this machine's id (default `local_host_id()`); routes of other hosts are not ours.
    control: the channel COMMIT frames go through (default: a new `ControlChannel`, over TLS
        with `tls_context` to a node whose tcp endpoint is `tls://`).
    parallel_min_bytes: a batch copying at least this much is split over two threads.
    `stats`: maps, remaps, ops and bytes moved, commits refused (for tests and metrics).
    """

    name = "shm"
    # A write that wants its checksum is hashed as it is copied (the segment's span, right after
    # the copy, in 256 KiB calls that release the GIL), and its COMMIT carries that digest:
    # scatter-gather puts of many small parts then cost no separate pass over their bytes.
    hashes_writes = True
    reads_own_mapping = True  # reads are memcpy out of the client's mapping

    def __init__(self, *, host_id: str | None = None, control: ControlChannel | None = None,
                 parallel_min_bytes: int = PARALLEL_MIN_BYTES,
                 connect_timeout_s: float = 5.0,
                 tls_context: ssl.SSLContext | None = None,
                 spin: SpinWait | None = None) -> None:
        self.host_id = host_id if host_id is not None else local_host_id()
        self.parallel_min_bytes = parallel_min_bytes
        self._copier = Copier(parallel_min_bytes)
        # `spin`: for the reply of a lone COMMIT (transfer/control.py); copies need none
        self._control = control or ControlChannel(connect_timeout_s=connect_timeout_s,
                                                  tls_context=tls_context, spin=spin)
        self._lock = threading.Lock()
        self._maps: dict[str, Mapping] = {}
        self._unreachable: dict[str, float] = {}  # path -> monotonic time to retry opening
        self._closed = False
        self.stats: dict[str, int] = {"maps": 0, "remaps": 0, "reads": 0, "writes": 0,
                                      "bytes_read": 0, "bytes_written": 0, "commits_refused": 0,
                                      "claims_refused": 0, "early_commit_groups": 0}

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
        self._control.close()
        self._copier.close()

    def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        deadline = time.monotonic() + timeout_s
        results, jobs, _ = self._plan(ops, writing=False)
        self._copy(results, jobs, deadline)
        self._count("reads", "bytes_read", results,  # sizes as planned: no view per op
                    sum(job.nbytes for i, job in jobs if results[i].ok))
        return results

    def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        deadline = time.monotonic() + timeout_s
        plan = self.plan_write(ops)
        claims, claimed = group_commits(plan.claims(ops))
        if claims:
            replies = self._control.call(claims, max(0.0, deadline - time.monotonic()))
            self.on_claims(ops, plan, claimed, triples(replies))
        stream = self._control.stream(max(0.0, deadline - time.monotonic()))
        early = EarlyCommits(ops, plan, stream)
        results, commits = self.copy_write(ops, plan, deadline, early.on_done)
        early.send_rest(results, commits)
        if early.early_groups:
            with self._lock:
                self.stats["early_commit_groups"] += early.early_groups
        return self.finish_write(ops, results, early.which, triples(stream.finish()))

    def plan_write(self, ops: Sequence[TransferOp]) -> WritePlan:
        """Check every op and plan its copy and COMMIT; `WritePlan.claims` are the CLAIMs to
        send (and have answered, `on_claims`) before `copy_write`."""
        results, jobs, commits = self._plan(ops, writing=True)
        return WritePlan(results, jobs, commits)

    def on_claims(self, ops: Sequence[TransferOp], plan: WritePlan, which: dict[str, list[int]],
                  replies: dict[str, list[tuple[int, str, bytes]]]) -> None:
        """Apply the nodes' answers to the CLAIMs of `which` (as `finish_write` does for
        COMMITs): a refused claim fails its op, nothing is copied for it."""
        refused = plan.on_claims(which, replies)
        with self._lock:
            self.stats["claims_refused"] += refused
        self._forget_replaced(ops, [i for indexes in which.values() for i in indexes
                                    if plan.results[i].status == ST_UNKNOWN_SEGMENT])

    def _forget_replaced(self, ops: Sequence[TransferOp], indexes: Sequence[int]) -> None:
        """The node's file changed under these ops (ST_UNKNOWN_SEGMENT): drop their mappings."""
        for i in indexes:
            path = ops[i].route.endpoints.get(self.name, "")
            with self._lock:
                self._maps.pop(path, None)

    def copy_write(self, ops: Sequence[TransferOp], plan: WritePlan, deadline: float,
                   on_done: Callable[[CopyJob], None] | None = None
                   ) -> tuple[list[TransferResult], list[Commit]]:
        """Copy every op whose claim the node answered OK; the COMMITs of the ops fully
        copied in time, each to be given its digest (`with_digests`) before it is sent
        (`on_done`: see `memcopy.Copier.run`)."""
        results, commits = plan.results, plan.commits
        jobs = [(i, job) for i, job in plan.jobs if results[i].ok]
        self._copy(results, jobs, deadline, on_done)
        return results, [c for c in commits if results[c[0]].ok]

    def finish_write(self, ops: Sequence[TransferOp], results: list[TransferResult],
                     which: dict[str, list[int]],
                     replies: dict[str, list[tuple[int, str, bytes]]]) -> list[TransferResult]:
        """Apply the nodes' (status, message, receipt) replies to the commits of `which` (per
        address, the op indexes in the order their commits were sent)."""
        refused = 0
        for address, indexes in which.items():
            for i, (status, message, receipt) in zip(indexes, replies[address], strict=True):
                if status == ST_OK:
                    results[i].receipt = receipt
                else:
                    results[i] = TransferResult(status, message)
                    refused += 1
                    if status == ST_UNKNOWN_SEGMENT:  # the node's file changed under us
                        self._forget_replaced(ops, [i])
        with self._lock:
            self.stats["commits_refused"] += refused
        self._count("writes", "bytes_written", results,
                    sum(op_nbytes(op) for op, r in zip(ops, results, strict=True) if r.ok))
        return results

    def _copy(self, results: list[TransferResult], jobs: list[tuple[int, CopyJob]],
              deadline: float, on_done: Callable[[CopyJob], None] | None = None) -> None:
        self._copier.run([job for _, job in jobs], deadline, on_done)
        for i, job in jobs:
            if job.error is not None:
                results[i] = TransferResult(ST_INTERNAL, job.error)
            elif not job.done:
                results[i] = TransferResult(ST_TIMEOUT, "deadline passed before the copy ended")
            elif job.digest is not None:
                results[i].checksum = job.digest

    def _count(self, ops_key: str, bytes_key: str, results: list[TransferResult],
               nbytes: int) -> None:
        done = sum(1 for r in results if r.ok)
        with self._lock:
            self.stats[ops_key] += done
            self.stats[bytes_key] += nbytes

    # -- planning --------------------------------------------------------------------------

    def _plan(self, ops: Sequence[TransferOp], *, writing: bool
              ) -> tuple[list[TransferResult], list[tuple[int, CopyJob]], list[Commit]]:
        """Check every op; the copies to make and (writes) the commits to send after them."""
        results = [TransferResult() for _ in ops]
        jobs: list[tuple[int, CopyJob]] = []
        commits: list[Commit] = []
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
                views = op_views(op, writable=not writing)
            except (ValueError, TypeError) as e:
                results[i] = TransferResult(ST_UNSUPPORTED, f"buffer: {e}")
                continue
            n, grant = sum(len(v) for v in views), op.grant
            if not grant.covers(route.segment_id, op.offset, n):
                results[i] = TransferResult(ST_OUT_OF_RANGE, f"[{op.offset}, +{n}) is outside "
                                            f"the grant [{grant.offset}, +{grant.length})")
                continue
            if op.offset < 0 or op.offset + n > m.size:
                results[i] = TransferResult(ST_OUT_OF_RANGE, f"[{op.offset}, +{n}) is outside "
                                            f"{path} ({m.size} bytes)")
                continue
            # part by part into (or out of) consecutive ranges of one span of the segment
            span = m.memory[op.offset:op.offset + n]
            span_address = m.address + op.offset
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
                # a disk-backed file is written with pwritev, not stores into the mapping
                # (memcopy._write_file says why); the node reads either through its mapping
                jobs.append((i, CopyJob(views, span, span_address, to_span=True,
                                        hashed=op.want_checksum,
                                        file=-1 if m.memory_backed else m.fd,
                                        file_offset=op.offset)))
                commits.append((i, address, ControlCall(OP_COMMIT, grant, route.segment_id,
                                                        op.offset, n, meta)))
            else:
                if not m.memory_backed and n <= WILLNEED_MAX_OP_BYTES:  # a disk-tier file
                    m.will_need(op.offset, n)
                jobs.append((i, CopyJob(views, span, span_address, hashed=op.want_checksum)))
        return results, jobs, commits

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
