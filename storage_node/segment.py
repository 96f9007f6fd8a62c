"""Segments: the DRAM a node contributes, as shared-memory files mapped into the process.

A segment is the file `<shm_dir>/cellar-<node_id>-<index>.seg`, sized with ftruncate, its pages
reserved with posix_fallocate (so a full tmpfs fails at start with a clear error instead of a
SIGBUS on first touch), and mapped MAP_SHARED, then pre-faulted in the background: a first touch
of each 4 KiB page costs a minor fault, and writes into never-touched segment memory run at
1.9 GiB/s against 7.9 GiB/s once mapped (measured here), which halves a put's speed into fresh
ranges. Mapping with MAP_POPULATE instead would hold the node's start for 0.4-1.8 s per GiB on
these machines (10.9 s for 6 GiB under load), so a daemon thread asks the kernel to map the pages
(madvise MADV_POPULATE_WRITE, Linux 5.14+, 16 MiB at a time, through ctypes so the GIL is
released) while the node already serves; where the kernel lacks it, pages fault on first use as
before. Pre-faulting never changes a byte. Shared and file-backed on purpose: a same-host
client can map the same file later (the `shm` transport), and the memory outlives a crash of
this process, which is what lets a restarted node re-attach its objects.

Invariants
    `segment_id` is a pure function of (node_id, index), so a node restarted with the same id
    has the same segment ids. The mapping is page aligned (mmap) and exactly `size_bytes`
    long. `view()` never returns memory outside the mapping. While a node process holds a
    segment it holds an exclusive flock on the file, so two processes can never serve the same
    memory.

Re-attach: a file left by an earlier process of this node (crash, or `keep_segments_on_exit`)
with exactly the configured size is mapped as it is, bytes intact (`reattached` is True), so
the node can restore its index from the journal. A file of another size is not trusted: it is
unlinked and created anew (a new inode, so a same-host client still mapping the old file
cannot mistake it for this one), and a warning says so.

Options (off by default): hugepages (the file must live on a hugetlbfs mount; the size must
be a multiple of its page size) and mlock (pins the pages; needs RLIMIT_MEMLOCK).

It never interprets the bytes it holds; that is the index's and the client's business.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import mmap
import os
import threading
import time
from pathlib import Path

import xxhash

from cellar.proto.tiers import TIER_DISK, TIER_DRAM
from cellar.transfer.memcopy import pwritev_all

log = logging.getLogger("cellar.node.segment")

HUGETLBFS = "hugetlbfs"
_SEGMENT_ID_MASK = (1 << 63) - 1  # keep ids positive in signed 64-bit consumers (JSON, SQL)
# The two ways a background pre-fault ends, as logged (a segment id fills the %d).
PREFAULT_DONE_LOG = "segment %d pre-faulted"
PREFAULT_SKIPPED_LOG = "segment %d not pre-faulted"
MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels answer EINVAL and pages fault lazily
PREFAULT_CHUNK_BYTES = 16 << 20


class SegmentError(Exception):
    """A segment could not be created or mapped; the message says what to change."""


def segment_id_for(node_id: str, index: int) -> int:
    """Stable, non-zero 63-bit id of segment `index` of node `node_id`."""
    value = xxhash.xxh64_intdigest(f"cellar-segment/{node_id}/{index}".encode()) & _SEGMENT_ID_MASK
    return value or 1


def segment_path(shm_dir: str | os.PathLike[str], node_id: str, index: int) -> Path:
    return Path(shm_dir) / f"cellar-{node_id}-{index}.seg"


def _mount_of(path: Path) -> tuple[str, str]:
    """(mount point, fs type) of the longest /proc/mounts entry containing `path`."""
    best = ("/", "")
    resolved = str(path.resolve())
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount_point, fstype = parts[1], parts[2]
                inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best[0]):
                    best = (mount_point, fstype)
    except OSError:
        pass
    return best


def _hugetlb_page_bytes(mount_point: str) -> int:
    """Page size of a hugetlbfs mount ('pagesize=' option), else the default huge page size."""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[1] == mount_point:
                    for opt in parts[3].split(","):
                        if opt.startswith("pagesize="):
                            text = opt.split("=", 1)[1].upper()
                            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
                            return int(text.rstrip("KMG")) * scale
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Hugepagesize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 2 << 20


def _mlock(buf: mmap.mmap, size: int, path: Path) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    anchor = ctypes.c_char.from_buffer(buf)
    try:
        if libc.mlock(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size)) != 0:
            err = ctypes.get_errno()
            raise SegmentError(
                f"mlock of {size} bytes of {path} failed: {os.strerror(err)}; raise the "
                "memlock limit (ulimit -l, or LimitMEMLOCK / --ulimit memlock) or run without --mlock"
            )
    finally:
        del anchor  # release the buffer export so the mapping can be closed later


def _open_locked(path: Path, node_id: str) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SegmentError(f"cannot create segment file {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SegmentError(
            f"segment file {path} is held by another running node with id {node_id!r}; "
            "give this node another --node-id"
        ) from None
    return fd


class Segment:
    """One mapped segment. `memory` is a writable memoryview of the whole mapping."""

    def __init__(
        self,
        segment_id: int,
        index: int,
        size_bytes: int,
        buf: mmap.mmap | bytearray,
        path: Path | None = None,
        fd: int = -1,
    ) -> None:
        assert len(buf) == size_bytes, (len(buf), size_bytes)
        self.segment_id = segment_id
        self.index = index
        self.size_bytes = size_bytes
        self.path = path
        self._buf = buf
        self._fd = fd
        self.memory: memoryview = memoryview(buf)
        self.reattached = False  # True when an earlier process's file was mapped as it was
        self._prefault: threading.Thread | None = None
        self._closing = False
        self.tier = TIER_DRAM  # TIER_DISK for the disk tier's file (storage_node/disk_tier.py)
        # Dropped as corrupt (node_corrupt_dropped): a file of another size found at start
        # (torn or truncated: discarded with its objects), restored objects failing their checksum.
        self.dropped_files = 0
        self.dropped_objects = 0

    @classmethod
    def create(
        cls,
        shm_dir: str | os.PathLike[str],
        node_id: str,
        index: int,
        size_bytes: int,
        *,
        hugepages: bool = False,
        mlock: bool = False,
        prefault: bool = True,
    ) -> Segment:
        """Create (or open, if a previous process of this node left it) and map the file."""
        path = segment_path(shm_dir, node_id, index)
        mount_point, fstype = _mount_of(Path(shm_dir))
        if hugepages:
            if fstype != HUGETLBFS:
                raise SegmentError(
                    f"--hugepages needs --shm-dir on a hugetlbfs mount, but {shm_dir} is on "
                    f"{mount_point} ({fstype or 'unknown'}); e.g. `mount -t hugetlbfs none "
                    "/dev/hugepages` and --shm-dir /dev/hugepages"
                )
            page = _hugetlb_page_bytes(mount_point)
            if size_bytes % page:
                raise SegmentError(
                    f"segment size {size_bytes} is not a multiple of the huge page size {page}"
                )
        fd = _open_locked(path, node_id)
        try:
            existing = os.fstat(fd).st_size
            dropped = existing not in (0, size_bytes)
            if dropped:
                log.warning("segment file %s has %d bytes, not the configured %d: discarding it "
                            "and its objects", path, existing, size_bytes)
                path.unlink()
                os.close(fd)
                fd = -1
                fd = _open_locked(path, node_id)
                existing = 0
            reattached = existing == size_bytes
            if reattached:
                log.info("re-attaching segment file %s (%d bytes)", path, size_bytes)
            os.ftruncate(fd, size_bytes)
            if not hugepages:
                try:
                    os.posix_fallocate(fd, 0, size_bytes)
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        st = os.statvfs(shm_dir)
                        raise SegmentError(
                            f"{shm_dir} has {st.f_bavail * st.f_frsize} bytes free, too few for "
                            f"a {size_bytes}-byte segment; enlarge it (e.g. docker --shm-size) "
                            "or lower --segment-size"
                        ) from None
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise SegmentError(f"cannot reserve {path}: {exc.strerror}") from None
            try:
                buf = mmap.mmap(fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as exc:
                raise SegmentError(f"cannot map {path} ({size_bytes} bytes): {exc.strerror}") from None
            if mlock:
                try:
                    _mlock(buf, size_bytes, path)
                except SegmentError:
                    buf.close()
                    raise
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        segment = cls(segment_id_for(node_id, index), index, size_bytes, buf, path, fd)
        segment.reattached = reattached
        segment.dropped_files = int(dropped)
        if prefault and not mlock:  # mlock has faulted every page in already
            segment._start_prefault()
        return segment

    def _start_prefault(self) -> None:
        """Map every page of the segment from a daemon thread (see the module docstring)."""
        if not isinstance(self._buf, mmap.mmap):
            return
        anchor = ctypes.c_char.from_buffer(self._buf)
        address = ctypes.addressof(anchor)
        del anchor  # no export may outlive this call, or close() could not unmap
        self._prefault = threading.Thread(target=self._prefault_run, args=(address,),
                                          name=f"cellar-prefault-{self.segment_id}", daemon=True)
        self._prefault.start()

    def _prefault_run(self, address: int) -> None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            madvise = libc.madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            return
        started = time.monotonic()
        for start in range(0, self.size_bytes, PREFAULT_CHUNK_BYTES):
            if self._closing:
                return
            n = min(PREFAULT_CHUNK_BYTES, self.size_bytes - start)
            if madvise(address + start, n, MADV_POPULATE_WRITE) != 0:
                log.info("%s: %s; pages fault on first use", PREFAULT_SKIPPED_LOG % self.segment_id,
                         os.strerror(ctypes.get_errno()))
                return
        # INFO, with a fixed prefix: benchmarks wait for this line (LocalCluster.wait_prefaulted)
        # so that their first figures do not measure the kernel mapping pages.
        log.info("%s: %d bytes in %.1f s", PREFAULT_DONE_LOG % self.segment_id, self.size_bytes,
                 time.monotonic() - started)

    @classmethod
    def in_memory(cls, segment_id: int, size_bytes: int, index: int = 0) -> Segment:
        """A segment over a private bytearray, for tests."""
        return cls(segment_id, index, size_bytes, bytearray(size_bytes))

    def contains(self, offset: int, length: int) -> bool:
        return offset >= 0 and length >= 0 and offset + length <= self.size_bytes

    def view(self, offset: int, length: int) -> memoryview:
        """Bounds-checked view of [offset, offset+length); raises IndexError outside."""
        if not self.contains(offset, length):
            raise IndexError(
                f"[{offset}, +{length}) is outside segment {self.segment_id} ({self.size_bytes} bytes)"
            )
        return self.memory[offset:offset + length]

    @property
    def fd(self) -> int:
        """The segment file's descriptor (-1: memory without a file)."""
        return self._fd

    @property
    def writes_through_file(self) -> bool:
        """Whether bytes go into this segment through its file (pwrite) rather than by stores
        into its mapping: the disk tier's file. On a disk file a store into a page never
        written, or written back since, faults through the filesystem 4 KiB at a time (~1 GB/s
        here), where pwrite takes the page cache's write path (transfer/memcopy.py
        `_write_file` measured both); the mapping sees the bytes at once (one page cache)."""
        return self.tier == TIER_DISK and self._fd >= 0

    def store(self, offset: int, data: memoryview) -> None:
        """Put `data` at `offset`: through the file where `writes_through_file`, else by a copy
        into memory. IndexError outside the segment; OSError if the file write fails."""
        if not self.contains(offset, len(data)):
            raise IndexError(f"[{offset}, +{len(data)}) is outside segment {self.segment_id}")
        if self.writes_through_file:
            pwritev_all(self._fd, [data], offset)  # a short write goes on where it stopped
        else:
            self.memory[offset:offset + len(data)] = data

    def sync(self, offset: int, length: int) -> None:
        """msync(MS_SYNC) the pages holding [offset, offset+length): on a disk file they are on
        the device when this returns (a no-op for memory without a file)."""
        if isinstance(self._buf, mmap.mmap) and length > 0:
            start = offset - offset % mmap.PAGESIZE
            self._buf.flush(start, offset + length - start)

    def close(self, *, unlink: bool) -> None:
        """Unmap and, when `unlink`, delete the file. Safe to call twice."""
        self._closing = True
        prefault, self._prefault = self._prefault, None
        if prefault is not None:
            prefault.join()  # at most one chunk's madvise to finish: never unmap under it
        if unlink and self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        self.memory.release()
        if isinstance(self._buf, mmap.mmap) and not self._buf.closed:
            try:
                self._buf.close()
            except BufferError:
                # A transfer thread still holds a view; the mapping goes with the process.
                log.debug("segment %d still exported at close", self.segment_id)
        if self._fd >= 0:
            os.close(self._fd)  # also drops the flock
            self._fd = -1
