"""Caller buffers: coercing them to flat byte views, and page-aligned buffers from `alloc_buffer`.

What it owns
    Turning whatever the caller hands the SDK (bytes, bytearray, memoryview, numpy arrays, mmap,
    any object with the buffer protocol, contiguous CPU torch tensors through
    `tensors.tensor_view`) into a 1-D unsigned-byte `memoryview` over the same memory, without
    copying; and allocating page-aligned buffers the data plane can copy into
    at full speed.

The invariant
    Every view this module returns is 1-D, format "B", C-contiguous and aliases the caller's
    memory (no copy). A destination view is writable. Anything else is refused with
    `cellar.InvalidArgument` naming the argument, before any request leaves the process.

Why page-aligned buffers
    memcpy on these machines runs at a third of its speed when source and destination sit at
    different offsets within a page, which is exactly where bytearray and numpy allocations land
    (16-64 bytes past a page boundary) while segment memory on the nodes is page-aligned.
    `alloc_buffer` maps anonymous memory, so it starts on a page boundary; the shm and rdma
    transports (issue "Data plane at the machine's ceilings") register these buffers.

What it must never do
    Copy a caller's buffer, or accept a non-contiguous or read-only destination: a silent copy
    would make `get_into` write somewhere the caller never looks.
"""

from __future__ import annotations

import ctypes
import mmap
import operator
import os
import sys
from typing import Any

from cellar.client.tensors import is_tensor, tensor_view
from cellar.errors import InvalidArgument

PAGE_BYTES = mmap.PAGESIZE
MAX_ALLOC_BUFFER_BYTES = 1 << 40  # a sanity bound: 1 TiB


def _view(obj: Any, what: str, writable: bool = False) -> memoryview:
    if is_tensor(obj):  # torch tensors have no buffer protocol: their storage, no copy
        return tensor_view(obj, writable=writable, what=what)
    if isinstance(obj, str):
        raise InvalidArgument(f"{what} must be a bytes-like object, not str (encode it first)")
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            f"{what} must be a bytes-like object (bytes, bytearray, memoryview, numpy array or "
            f"another buffer), not {type(obj).__name__}"
        ) from None
    except ValueError as exc:  # e.g. a released memoryview
        raise InvalidArgument(f"{what}: {exc}") from None
    if not mv.c_contiguous:
        raise InvalidArgument(
            f"{what} must be C-contiguous (got a strided view of shape {mv.shape}); "
            "pass a contiguous copy, e.g. numpy.ascontiguousarray(...)"
        )
    if mv.ndim == 1 and mv.format == "B":
        return mv
    if mv.nbytes == 0:  # memoryview.cast refuses shapes with zeros
        return memoryview(b"") if mv.readonly else memoryview(bytearray())
    return mv.cast("B")


def readable_view(obj: Any, what: str = "value") -> memoryview:
    """A flat byte view of a source buffer (no copy); InvalidArgument for anything else."""
    return _view(obj, what)


def writable_view(obj: Any, what: str = "buffer") -> memoryview:
    """A flat, writable byte view of a destination buffer (no copy); InvalidArgument otherwise."""
    mv = _view(obj, what, writable=True)
    if mv.readonly:
        raise InvalidArgument(
            f"{what} is read-only ({type(obj).__name__}); pass a bytearray, a writable numpy "
            "array or a buffer from cellar.alloc_buffer()"
        )
    return mv


def alloc_buffer(nbytes: int) -> memoryview:
    """A zero-filled, writable, page-aligned buffer of `nbytes` bytes (anonymous memory).

    Use it as the destination of `get_into` / `get_many_into` (or as a put source) to let the
    data plane copy with matching page offsets on both sides. The memory is released when the
    last view of it is gone.
    """
    try:
        size = operator.index(nbytes)
    except TypeError:
        raise InvalidArgument(f"nbytes must be an integer, not {type(nbytes).__name__}") from None
    if isinstance(nbytes, bool) or not 0 < size <= MAX_ALLOC_BUFFER_BYTES:
        raise InvalidArgument(f"nbytes must be between 1 and {MAX_ALLOC_BUFFER_BYTES}, got {nbytes!r}")
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return memoryview(region)


def buffer_address(view: memoryview) -> int | None:
    """The address of a writable view's first byte, or None if it cannot be taken."""
    if view.readonly or view.nbytes == 0:
        return None
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


def is_page_aligned(view: memoryview) -> bool:
    """Whether a writable view starts on a page boundary (False when unknown)."""
    address = buffer_address(view)
    return address is not None and address % PAGE_BYTES == 0


# ---- bytes results without a copy -----------------------------------------------------------
#
# `get` must return `bytes`, which are immutable once they are shared. Receiving into a
# bytearray and then calling bytes() costs a second pass over fresh memory, and on these VMs
# the page faults of fresh memory cost more than the copy itself (~1 ms per MiB for the two
# passes against ~0.6 ms for one). CPython builds every bytes object the same way internally:
# `PyBytes_FromStringAndSize(NULL, n)` returns a new, unshared object whose n bytes are then
# filled in place. We do exactly that, with the transport as the filler, and hand the object
# out only after the view on its storage has been released. Where this is not CPython, or the
# layout check below fails, `fresh_bytes` falls back to a bytearray (and `get` copies once).

def _bytes_filler() -> Any:
    if sys.implementation.name != "cpython":
        return None
    try:
        new = ctypes.pythonapi.PyBytes_FromStringAndSize
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
        offset = bytes.__basicsize__ - 1  # offsetof(PyBytesObject, ob_sval)
        probe = new(None, 8)
        view = memoryview((ctypes.c_char * 8).from_address(id(probe) + offset)).cast("B")
        view[:] = b"cellar!!"
        view.release()
        if probe != b"cellar!!" or len(probe) != 8 or hash(probe) != hash(b"cellar!!"):
            return None
    except (AttributeError, OSError, TypeError, ValueError):
        return None
    return new, offset


_FILLER = _bytes_filler()


# ---- keeping result memory mapped ------------------------------------------------------------
#
# Filling fresh memory costs a page fault per 4 KiB page on first touch (~1-2 us here, plus the
# kernel zeroing the page): 256 faults per MiB, which held bytes-API gets to ~1 GB/s. The pages
# are fresh on every batch because glibc hands the freed results of the previous batch back to
# the kernel (heap trim, munmap). So the first allocating get raises glibc's M_TOP_PAD (and pins
# its mmap threshold at MALLOC_MMAP_THRESHOLD_BYTES): freed memory up to the pad stays mapped
# and the next batch's results land on pages already faulted in. The pad starts at
# MALLOC_TOP_PAD_BYTES and grows with the largest batch of results this process allocated, up
# to MALLOC_TOP_PAD_MAX_BYTES (`reserve_result_memory`), so a process pays in retained memory
# only what its own batches need. Measured (shm, bytes API): 16 x 1 MiB 254 -> ~1 minor fault
# per MiB, about 2x the throughput; 128 x 4 MiB (512 MiB of results) 3.06 -> 8.03 GB/s once the
# pad covered the batch (client system time 999 -> 23 us per op). The cost: up to the pad of
# freed memory stays mapped in the client process. Processes that never use the bytes API are
# not touched. `CELLAR_MALLOC_TOP_PAD_BYTES` fixes the pad at a size of your choice (no growth);
# 0 leaves malloc alone. Only glibc is tuned (elsewhere this does nothing).

MALLOC_TOP_PAD_BYTES = 256 << 20       # the pad after the first allocating get
MALLOC_TOP_PAD_MAX_BYTES = 1 << 30     # the most it grows to with larger batches
_PAD_STEP_BYTES = 64 << 20             # growth rounds up to this, so few mallopt calls
# Setting M_TOP_PAD switches off glibc's sliding mmap threshold, which would otherwise have
# risen past the result size after the first free: without this, every result >= 128 KiB
# would be a fresh mmap. 32 MiB is the most that threshold can be (and would slide to).
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20
_M_TOP_PAD = -2  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_malloc_tuned = False
_pad_bytes = 0      # the pad in force; 0 while untuned or when tuning is off
_pad_fixed = False  # CELLAR_MALLOC_TOP_PAD_BYTES chose it: never grown
_mallopt: Any = None


def tune_malloc_for_results() -> bool:
    """Apply the M_TOP_PAD setting above, once per process; True if glibc took it."""
    global _malloc_tuned, _pad_bytes, _pad_fixed, _mallopt
    if _malloc_tuned:
        return False
    _malloc_tuned = True
    pad, _pad_fixed = MALLOC_TOP_PAD_BYTES, "CELLAR_MALLOC_TOP_PAD_BYTES" in os.environ
    if _pad_fixed:
        try:
            pad = int(os.environ["CELLAR_MALLOC_TOP_PAD_BYTES"])
        except ValueError:
            pad, _pad_fixed = MALLOC_TOP_PAD_BYTES, False
    if pad <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    pad = min(pad, MALLOC_TOP_PAD_MAX_BYTES)
    if not (mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES) and mallopt(_M_TOP_PAD, pad)):
        return False
    _mallopt, _pad_bytes = mallopt, pad
    return True


def reserve_result_memory(batch_bytes: int) -> int:
    """Before allocating a batch of `batch_bytes` of results: grow the pad to cover the batch
    (rounded up, at most MALLOC_TOP_PAD_MAX_BYTES) so the next batch reuses these pages.
    Returns the pad in force (0: malloc is not tuned)."""
    global _pad_bytes
    if not _malloc_tuned:
        tune_malloc_for_results()
    if _mallopt is None or _pad_fixed or batch_bytes <= _pad_bytes:
        return _pad_bytes
    want = min(MALLOC_TOP_PAD_MAX_BYTES, -(-batch_bytes // _PAD_STEP_BYTES) * _PAD_STEP_BYTES)
    if want > _pad_bytes and _mallopt(_M_TOP_PAD, want):
        _pad_bytes = want
    return _pad_bytes


def fresh_bytes(nbytes: int) -> tuple[bytes | bytearray, memoryview]:
    """A new object of `nbytes` bytes and a writable view of its storage.

    The object is a `bytes` that nobody else holds (CPython) or a bytearray (elsewhere). The
    caller fills it through the view, releases the view, and only then shares the object;
    `as_bytes` turns either kind into bytes (no copy for bytes).
    """
    if not _malloc_tuned:
        tune_malloc_for_results()
    if _FILLER is None or nbytes < 1:
        buf = bytearray(nbytes)
        return buf, memoryview(buf)
    new, offset = _FILLER
    obj = new(None, nbytes)
    view = memoryview((ctypes.c_char * nbytes).from_address(id(obj) + offset)).cast("B")
    return obj, view


def as_bytes(obj: bytes | bytearray | memoryview) -> bytes:
    """The finished value of a `fresh_bytes` object (copies only the bytearray fallback)."""
    if type(obj) is bytes:
        return obj
    return bytes(obj)
