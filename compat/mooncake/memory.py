"""Caller memory as Mooncake's API hands it over: raw addresses, and buffers the store returns.

What it owns
    `lease_parts`: per key, the views of that key's (ptr, size) pieces inside the store's
    registered buffers, or INVALID_PARAMS for a key whose pieces are malformed or leave every
    registration; the registrations stay held (not unregisterable) until the block ends.
    `BufferHandle`, what `get_buffer` returns: bytes that own their memory, export the buffer
    protocol and report a stable `ptr()`.

Why the check, and whose
    Mooncake documents an unregistered address as undefined behaviour ("memory corruption may
    occur"). Cellar refuses it instead (INVALID_PARAMS): a wrong pointer from Python must never
    become a segfault or a write into someone else's memory. The bounds rules are the SDK's
    (`cellar.client.pointers.PointerRegistry`); this module only groups its per-pair verdicts by
    key, because one Mooncake key may span several buffers.

What it must never do
    Make a view of memory the registry has not vouched for, or keep one past its block.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator, Sequence
from typing import Any

from cellar.client.pointers import PointerRegistry
from cellar.compat.mooncake.codes import ErrorCode
from cellar.errors import InvalidArgument

INVALID = int(ErrorCode.INVALID_PARAMS)


def _pieces(ptrs: Any, sizes: Any) -> bool:
    """A key's pointer and size lists: sequences of the same, non-zero length."""
    return (isinstance(ptrs, Sequence) and isinstance(sizes, Sequence)
            and not isinstance(ptrs, (str, bytes)) and not isinstance(sizes, (str, bytes))
            and 0 < len(ptrs) == len(sizes))


@contextlib.contextmanager
def lease_parts(registry: PointerRegistry, ptr_lists: Sequence[Any], size_lists: Sequence[Any], *,
                writable: bool) -> Iterator[list[list[memoryview] | int]]:
    """Per key: its views in order, or INVALID_PARAMS; held until the block ends."""
    flat_ptrs: list[Any] = []
    flat_sizes: list[Any] = []
    spans: list[range | None] = []
    for ptrs, sizes in zip(ptr_lists, size_lists, strict=True):
        if not _pieces(ptrs, sizes):
            spans.append(None)
            continue
        spans.append(range(len(flat_ptrs), len(flat_ptrs) + len(ptrs)))
        flat_ptrs += list(ptrs)
        flat_sizes += list(sizes)
    lease = registry.lease(flat_ptrs, flat_sizes, writable=writable)
    try:
        per_key: list[list[memoryview] | int] = []
        for span in spans:
            views = [] if span is None else [lease.views[i] for i in span]
            # no InvalidArgument is left in `views` past this test
            if span is None or any(isinstance(v, InvalidArgument) for v in views):
                per_key.append(INVALID)
            else:
                per_key.append(views)  # type: ignore[arg-type]
        yield per_key
    finally:
        lease.release()


class BufferHandle(bytearray):
    """An object's bytes in memory this handle owns (Mooncake's `get_buffer` result).

    A bytearray whose storage is locked in place: `ptr()` stays valid while the handle lives,
    and the buffer protocol (`memoryview(handle)`, `numpy.frombuffer(handle)`) sees the bytes.
    """

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes)
        # an exported ctypes view forbids resizing, so the address cannot move
        self._pinned = (ctypes.c_ubyte * nbytes).from_buffer(self) if nbytes else None

    def ptr(self) -> int:
        return ctypes.addressof(self._pinned) if self._pinned is not None else 0

    def size(self) -> int:
        return len(self)
