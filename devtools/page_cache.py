"""What of a file is in the page cache, and dropping it: cold reads on demand.

For `make bench-disk` (cold disk-tier reads) and the shm readahead test. This container, like
many, cannot write /proc/sys/vm/drop_caches, so a file's own pages are dropped with
POSIX_FADV_DONTNEED, which leaves any page a process maps (and dirty ones: they are written
back first). Residency is read with mincore(2) over a fresh read-only mapping, which faults
nothing in; a RWF_NOWAIT read is no probe: it starts readahead of what it finds missing.
"""

from __future__ import annotations

import ctypes
import mmap
import os

from cellar.transfer.memcopy import buffer_address

DONTNEED_PASSES = 3  # one pass right after the write-back left every page cached here


def cached_bytes(fd: int) -> int:
    """Bytes of the file `fd` in the page cache (holes and never-written ranges count as not
    cached); OSError if mincore fails."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    view = memoryview(mapped)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(buffer_address(view)), ctypes.c_size_t(size), vec):
            errno = ctypes.get_errno()
            raise OSError(errno, f"mincore: {os.strerror(errno)}")
    finally:
        view.release()
        mapped.close()
    return sum(b & 1 for b in vec) * page


def evict(fd: int) -> int:
    """Write the file's dirty pages back and drop its pages that no process maps; the bytes
    that left the page cache."""
    before = cached_bytes(fd)
    os.fdatasync(fd)
    for _ in range(DONTNEED_PASSES):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return before - cached_bytes(fd)
