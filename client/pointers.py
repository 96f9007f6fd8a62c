"""Raw pointers: a registry of host memory the caller vouches for, and views into it.

What it owns
    `PointerRegistry`: the (ptr, size) ranges an application registered
    (`Client.register_buffer`) and the memoryviews the SDK makes over them for `put_from`,
    `get_into_ptr` and their batched forms. Engines hand the SDK raw addresses into host KV
    pools they allocated themselves (pinned torch tensors, cudaHostAlloc, mmap); a view over an
    address is made with ctypes (`from_address`), which would happily read or write anywhere,
    so every range is checked against the registrations first.

The invariant
    `view(ptr, size)` returns a view only when [ptr, ptr + size) lies inside the union of the
    registered ranges (an empty range, size 0, touches no memory and is always allowed); anything else is `cellar.InvalidArgument`, before any memory is touched
    (never a segfault from a pointer the application did not register). Bounds are checked in
    O(log n) against the merged ranges, rebuilt (O(n log n)) on the first check after a
    register/unregister: registration is rare, checks are per key.

Defined results (issue 11 asks for them)
    - Overlapping or adjacent registrations are allowed and their union counts: a range may
      span two registrations that touch or overlap. Each registration is still its own entry,
      keyed by its start address.
    - Registering the same (ptr, size) again is a no-op; registering a start address that is
      already registered with another size is `InvalidArgument` (unregister it first).
    - `unregister(ptr)` removes the registration that starts at `ptr`; a ptr that is not the
      start of a registration (never registered, or already unregistered: double
      unregistration) is `InvalidArgument` and changes nothing.
    - While a batch holds views (`lease`), the registrations they touch cannot be unregistered
      (`InvalidArgument` "in use"), so a concurrent unregister cannot pull memory out from under
      a transfer in flight. Freeing registered memory without unregistering is the
      application's bug (as with any DMA registration); the SDK holds views only during a call.

Limits: at most MAX_REGISTRATIONS registrations per registry; sizes up to MAX_REGISTRATION_BYTES.
It never dereferences a pointer outside a registered range and never keeps a view after a call.
"""

from __future__ import annotations

import bisect
import ctypes
import operator
import threading
from collections.abc import Sequence
from typing import Any

from cellar.errors import InvalidArgument

MAX_REGISTRATIONS = 65_536
MAX_REGISTRATION_BYTES = 1 << 48  # 256 TiB: above any host's memory
_ADDRESS_LIMIT = 1 << (8 * ctypes.sizeof(ctypes.c_void_p))


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgument(f"{what} must be an integer, not {type(value).__name__}") from None


def check_range(ptr: Any, size: Any) -> tuple[int, int]:
    """(ptr, size) as ints, refusing non-integers, a null or negative pointer, a negative size
    and ranges past the address space."""
    p, n = _as_int(ptr, "ptr"), _as_int(size, "size")
    if p <= 0:
        raise InvalidArgument(f"ptr must be a positive address, got {p}")
    if n < 0:
        raise InvalidArgument(f"size must be >= 0, got {n}")
    if p + n > _ADDRESS_LIMIT:
        raise InvalidArgument(f"[{p:#x}, +{n}) runs past the address space")
    return p, n


class Lease:
    """Views of one call over registered memory; `release()` (or `with`) ends the hold."""

    __slots__ = ("views", "_registry", "_starts")

    def __init__(self, registry: PointerRegistry, views: list[memoryview | InvalidArgument],
                 starts: list[int]) -> None:
        self.views = views
        self._registry = registry
        self._starts = starts

    def release(self) -> None:
        starts, self._starts = self._starts, []
        if starts:
            self._registry._unhold(starts)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class PointerRegistry:
    """Thread-safe registry of (ptr, size) ranges; see the module docstring for its rules."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}      # start -> size, one per registration
        self._holds: dict[int, int] = {}      # start -> leases holding it
        self._merged_starts: list[int] = []   # the union, as disjoint sorted ranges
        self._merged_ends: list[int] = []
        self._dirty = False                   # registrations changed since the last merge
        # (start, writable view of it) of the one registration `_lease_one_pool` slices; None
        # until a lease needs it, dropped when that registration goes
        self._pool_view: tuple[int, memoryview] | None = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._sizes)

    def registrations(self) -> list[tuple[int, int]]:
        with self._lock:
            return sorted(self._sizes.items())

    def register(self, ptr: Any, size: Any) -> None:
        p, n = check_range(ptr, size)
        if not 0 < n <= MAX_REGISTRATION_BYTES:
            raise InvalidArgument(f"size must be between 1 and {MAX_REGISTRATION_BYTES} bytes, "
                                  f"got {n}")
        with self._lock:
            have = self._sizes.get(p)
            if have == n:
                return  # the same registration again: nothing to do
            if have is not None:
                raise InvalidArgument(f"{p:#x} is already registered with {have} bytes; "
                                      "unregister it first")
            if len(self._sizes) >= MAX_REGISTRATIONS:
                raise InvalidArgument(f"at most {MAX_REGISTRATIONS} registered buffers")
            self._sizes[p] = n
            self._dirty = True

    def unregister(self, ptr: Any) -> None:
        p = _as_int(ptr, "ptr")
        with self._lock:
            if p not in self._sizes:
                raise InvalidArgument(f"{p:#x} is not the start of a registered buffer "
                                      "(never registered, or already unregistered)")
            if self._holds.get(p):
                raise InvalidArgument(f"{p:#x} is in use by {self._holds[p]} transfer(s); "
                                      "unregister it after they return")
            del self._sizes[p]
            self._dirty = True
            if self._pool_view is not None and self._pool_view[0] == p:
                self._pool_view = None  # never a view of memory no longer registered

    def covers(self, ptr: int, size: int) -> bool:
        """Whether [ptr, ptr + size) lies inside the union of the registrations."""
        with self._lock:
            return self._covers(ptr, size)

    def view(self, ptr: Any, size: Any, *, writable: bool) -> memoryview:
        """A flat byte view of [ptr, ptr + size) (no copy); InvalidArgument unless registered.
        The caller must not keep it past the call it serves (see `lease` for batches)."""
        p, n = check_range(ptr, size)
        with self._lock:
            if not self._covers(p, n):
                raise _unregistered(p, n)
        return _make_view(p, n, writable)

    def lease(self, ptrs: Sequence[Any], sizes: Sequence[Any], *, writable: bool) -> Lease:
        """Views for many (ptr, size) pairs at once, holding their registrations until released.
        Per pair, the view or the InvalidArgument that refuses it (so a batched call can
        report it per key); a pair count mismatch raises."""
        if len(ptrs) != len(sizes):
            raise InvalidArgument(f"{len(ptrs)} ptrs but {len(sizes)} sizes")
        checked: list[tuple[int, int] | InvalidArgument] = []
        for ptr, size in zip(ptrs, sizes, strict=True):
            if type(ptr) is int and type(size) is int and ptr > 0 and size >= 0 \
                    and ptr + size <= _ADDRESS_LIMIT:  # check_range's answer, without its calls
                checked.append((ptr, size))
                continue
            try:
                checked.append(check_range(ptr, size))
            except InvalidArgument as e:
                checked.append(e)
        with self._lock:
            if len(self._sizes) == 1:
                return self._lease_one_pool(checked, writable)
            views: list[memoryview | InvalidArgument] = []
            held: list[int] = []
            for item in checked:
                if isinstance(item, InvalidArgument):
                    views.append(item)
                    continue
                p, n = item
                if not self._covers(p, n):
                    views.append(_unregistered(p, n))
                    continue
                for start in self._touching(p, n):
                    self._holds[start] = self._holds.get(start, 0) + 1
                    held.append(start)
                views.append(_make_view(p, n, writable))
        return Lease(self, views, held)

    # -- internals (under the lock) --------------------------------------------------------

    def _lease_one_pool(self, checked: list[tuple[int, int] | InvalidArgument],
                        writable: bool) -> Lease:
        """`lease` when one buffer is registered (an engine's one host pool, the common case):
        each view a slice of one view of the pool made once, the pool held once per lease.
        The same views, refusals and hold as the general path: measured on the 2-core VM, a
        lease of 16 pointers cost 27 us that way (a ctypes view and a scan per pointer), about
        5% of a batched 64 KiB get within its trust."""
        ((start, size),) = self._sizes.items()
        end = start + size
        pool = self._pool_view
        if pool is None or pool[0] != start:
            pool = self._pool_view = (start, _make_view(start, size, True))
        whole = pool[1]
        views: list[memoryview | InvalidArgument] = []
        used = False
        for item in checked:
            if isinstance(item, InvalidArgument):
                views.append(item)
                continue
            p, n = item
            if n == 0:
                views.append(_make_view(p, 0, writable))
                continue
            if p < start or p + n > end:
                views.append(_unregistered(p, n))
                continue
            view = whole[p - start:p - start + n]
            views.append(view if writable else view.toreadonly())
            used = True
        held: list[int] = []
        if used:
            self._holds[start] = self._holds.get(start, 0) + 1
            held.append(start)
        return Lease(self, views, held)

    def _unhold(self, starts: list[int]) -> None:
        with self._lock:
            for start in starts:
                left = self._holds.get(start, 0) - 1
                if left > 0:
                    self._holds[start] = left
                else:
                    self._holds.pop(start, None)

    def _covers(self, p: int, n: int) -> bool:
        if n == 0:
            return True  # an empty range touches no memory
        if self._dirty:
            self._merge()
        k = bisect.bisect_right(self._merged_starts, p) - 1
        return k >= 0 and p + n <= self._merged_ends[k]

    def _touching(self, p: int, n: int) -> list[int]:
        # O(registrations): engines register one or a few pools, and overlaps allow no cut-off
        end = p + n
        return [s for s, size in self._sizes.items() if s < end and p < s + size]

    def _merge(self) -> None:
        starts: list[int] = []
        ends: list[int] = []
        for s, size in sorted(self._sizes.items()):
            e = s + size
            if starts and s <= ends[-1]:  # overlapping or adjacent: one range
                ends[-1] = max(ends[-1], e)
            else:
                starts.append(s)
                ends.append(e)
        self._merged_starts, self._merged_ends = starts, ends
        self._dirty = False


def _unregistered(p: int, n: int) -> InvalidArgument:
    return InvalidArgument(f"[{p:#x}, +{n}) is outside every registered buffer "
                           "(register_buffer it first)")


def _make_view(p: int, n: int, writable: bool) -> memoryview:
    if n == 0:
        return memoryview(bytearray()) if writable else memoryview(b"")
    view = memoryview((ctypes.c_char * n).from_address(p)).cast("B")
    return view if writable else view.toreadonly()
