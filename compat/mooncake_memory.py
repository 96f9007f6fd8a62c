"""Caller memory as Mooncake's API hands it over: raw addresses inside registered buffers.

What it owns
    `RegisteredMemory`, the table of buffers a store's caller registered with
    `register_buffer(ptr, size)`, and `view(ptr, size)`, which turns an address range into a
    writable `memoryview` (ctypes, no copy) only when the whole range lies inside one
    registered buffer. `BufferHandle`, what `get_buffer` returns: bytes that own their memory,
    export the buffer protocol and report a stable `ptr()`.

Why the check
    Mooncake documents an unregistered address as undefined behaviour ("memory corruption may
    occur"). Cellar refuses it instead (INVALID_PARAMS): a wrong pointer from Python must never
    become a segfault or a write into someone else's memory (BRIEF: "never a segfault").

Limits
    At most `MAX_REGISTERED_BUFFERS` buffers per store, each 1 byte to `MAX_BUFFER_BYTES`.
    Overlapping registrations are refused; registering the same (ptr, size) again is a no-op.

What it must never do
    Read or write memory through an address it has not bounds-checked against this table.
"""

from __future__ import annotations

import bisect
import ctypes
import threading

MAX_REGISTERED_BUFFERS = 65536
MAX_BUFFER_BYTES = 1 << 44          # 16 TiB: larger than any host; refuses garbage sizes
_ADDRESS_LIMIT = 1 << 64


class RegistrationError(ValueError):
    """A register/unregister/view request the table refuses (mapped to INVALID_PARAMS)."""


class RegisteredMemory:
    """Registered (start, size) buffers, sorted by start; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._sizes: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._starts)

    def register(self, ptr: int, size: int) -> bool:
        """Add [ptr, ptr+size); False if exactly this buffer was registered already."""
        ptr, size = _check_range(ptr, size)
        with self._lock:
            if self._sizes.get(ptr) == size:
                return False
            i = bisect.bisect_right(self._starts, ptr)
            if i > 0:
                prev = self._starts[i - 1]
                if prev + self._sizes[prev] > ptr:
                    raise RegistrationError(f"[{ptr:#x}, +{size}) overlaps a registered buffer")
            if i < len(self._starts) and self._starts[i] < ptr + size:
                raise RegistrationError(f"[{ptr:#x}, +{size}) overlaps a registered buffer")
            if len(self._starts) >= MAX_REGISTERED_BUFFERS:
                raise RegistrationError(
                    f"at most {MAX_REGISTERED_BUFFERS} registered buffers per store")
            self._starts.insert(i, ptr)
            self._sizes[ptr] = size
            return True

    def unregister(self, ptr: int) -> int:
        """Remove the buffer that starts at `ptr`; its size."""
        with self._lock:
            size = self._sizes.pop(ptr, None) if isinstance(ptr, int) else None
            if size is None:
                raise RegistrationError(f"no registered buffer starts at {ptr!r}")
            self._starts.remove(ptr)
            return size

    def capacity_at(self, ptr: int) -> int:
        """Bytes from `ptr` to the end of the registered buffer holding it (0: none does)."""
        if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr <= 0:
            return 0
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i < 0:
                return 0
            start = self._starts[i]
            return max(0, start + self._sizes[start] - ptr)

    def view(self, ptr: int, size: int) -> memoryview:
        """A writable byte view of [ptr, ptr+size), which must lie in one registered buffer."""
        ptr, size = _check_range(ptr, size)
        if self.capacity_at(ptr) < size:
            raise RegistrationError(
                f"[{ptr:#x}, +{size}) is not inside one registered buffer (register_buffer first)")
        return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


def _check_range(ptr: object, size: object) -> tuple[int, int]:
    if not isinstance(ptr, int) or isinstance(ptr, bool) or not 0 < ptr < _ADDRESS_LIMIT:
        raise RegistrationError(f"buffer_ptr must be a non-null address, got {ptr!r}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_BUFFER_BYTES:
        raise RegistrationError(f"size must be 1..{MAX_BUFFER_BYTES} bytes, got {size!r}")
    if ptr + size > _ADDRESS_LIMIT:
        raise RegistrationError("address range wraps around")
    return ptr, size


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
