"""`get_into_ranges`: byte ranges of objects gathered into registered buffers.

What it owns
    The buffer-major plan Mooncake's `get_into_ranges` takes (buffer i <- key j <- fragment k:
    `size` bytes from `src_offset` of the object to `dst_offset` of the buffer) and its
    per-fragment results (bytes copied, or a negative code).

Checks, before any byte lands
    - shapes: the five lists agree at the top level (else every fragment is INVALID_PARAMS),
      per buffer (its keys), and per key (its fragments);
    - destination: the buffer is registered and [buffer_ptr + dst_offset, +size) lies inside
      the one registration that holds `buffer_ptr` (destination overflow -> INVALID_PARAMS;
      an adjacent registration does not extend the buffer, though the SDK counts their union);
    - source: `src_offset + size` fits in the object (source overflow -> INVALID_PARAMS);
    - a missing key gives OBJECT_NOT_FOUND for each of its fragments; other fragments of the
      same call still succeed, as in Mooncake.

Difference from Mooncake
    The SDK has no ranged read yet, so each distinct key is read whole once per call and its
    fragments copied from that copy; Mooncake reads only the ranges from the remote replica.

What it must never do
    Write outside the registered buffer, or past a fragment's `size`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cellar.client import Client
from cellar.client.pointers import PointerRegistry
from cellar.compat.mooncake import io
from cellar.compat.mooncake.codes import ErrorCode
from cellar.errors import CellarError

INVALID = int(ErrorCode.INVALID_PARAMS)


def _shape(values: Sequence[Any], n: int) -> bool:
    return not isinstance(values, (str, bytes)) and len(values) == n


def _empty_results(all_dst_offsets: Sequence[Sequence[Sequence[int]]]) -> list[list[list[int]]]:
    """The result shape (from the destination offsets), every fragment INVALID_PARAMS."""
    out: list[list[list[int]]] = []
    for per_buffer in all_dst_offsets:
        out.append([[INVALID] * len(frags) for frags in per_buffer])
    return out


def _offset(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def get_into_ranges(client: Client | None, memory: PointerRegistry, buffer_ptrs: Sequence[int],
                    all_keys: Sequence[Sequence[str]],
                    all_dst_offsets: Sequence[Sequence[Sequence[int]]],
                    all_src_offsets: Sequence[Sequence[Sequence[int]]],
                    all_sizes: Sequence[Sequence[Sequence[int]]]) -> list[list[list[int]]]:
    results = _empty_results(all_dst_offsets)
    n = len(buffer_ptrs)
    if client is None or not all(_shape(v, n) for v in (all_keys, all_dst_offsets,
                                                         all_src_offsets, all_sizes)):
        return results
    objects: dict[str, bytes | int] = {}
    for i, ptr in enumerate(buffer_ptrs):
        keys, dsts, srcs, sizes = all_keys[i], all_dst_offsets[i], all_src_offsets[i], all_sizes[i]
        end = _buffer_end(memory, ptr)
        if end is None or not all(_shape(v, len(keys)) for v in (dsts, srcs, sizes)):
            continue
        for j, key in enumerate(keys):
            if not all(_shape(v, len(dsts[j])) for v in (srcs[j], sizes[j])):
                continue
            if key not in objects:
                objects[key] = io.read_whole(client, key)
            value = objects[key]
            for k, (dst, src, size) in enumerate(zip(dsts[j], srcs[j], sizes[j], strict=True)):
                results[i][j][k] = _copy(memory, ptr, end, value, dst, src, size)
    return results


def _buffer_end(memory: PointerRegistry, ptr: Any) -> int | None:
    """The end address of the registration holding `ptr` (Mooncake's buffer), or None."""
    p = _offset(ptr)
    if p is None:
        return None
    for start, size in memory.registrations():
        if start <= p < start + size:
            return start + size
    return None


def _copy(memory: PointerRegistry, ptr: int, end: int, value: bytes | int, dst: Any, src: Any,
          size: Any) -> int:
    if isinstance(value, int):
        return value  # the object's own code (missing, unreadable)
    dst, src, size = _offset(dst), _offset(src), _offset(size)
    if dst is None or src is None or size is None:
        return INVALID
    if src + size > len(value):
        return INVALID  # source overflow
    if ptr + dst + size > end:
        return INVALID  # destination overflow: past the buffer's registration
    if size == 0:
        return 0
    try:
        view = memory.view(ptr + dst, size, writable=True)
    except CellarError:
        return INVALID  # destination overflow: past the registered memory
    view[:] = value[src:src + size]
    return size
