"""client.pointers: registered ranges, views over them, and the defined results of issue 11."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from cellar.client.pointers import MAX_REGISTRATIONS, PointerRegistry
from cellar.errors import InvalidArgument


def _block(n: int) -> tuple[np.ndarray, int]:
    a = np.arange(n, dtype=np.uint8)
    return a, a.ctypes.data


def test_view_inside_a_registration_aliases_the_memory() -> None:
    reg = PointerRegistry()
    a, ptr = _block(4096)
    reg.register(ptr, 4096)
    v = reg.view(ptr + 100, 10, writable=True)
    assert bytes(v) == bytes(range(100, 110))
    v[0] = 0xFF
    assert a[100] == 0xFF  # no copy
    ro = reg.view(ptr, 8, writable=False)
    assert ro.readonly and bytes(ro) == bytes(a[:8])


@pytest.mark.parametrize("offset, size", [(-1, 10), (4090, 7), (0, 4097), (1 << 20, 1)])
def test_outside_every_registration_is_refused_without_touching_memory(offset: int,
                                                                       size: int) -> None:
    reg = PointerRegistry()
    _a, ptr = _block(4096)
    reg.register(ptr, 4096)
    with pytest.raises(InvalidArgument, match="outside every registered buffer"):
        reg.view(ptr + offset, size, writable=True)


def test_unregistered_null_negative_and_non_integer_pointers() -> None:
    reg = PointerRegistry()
    with pytest.raises(InvalidArgument):
        reg.view(12345, 1, writable=False)  # nothing registered: never dereferenced
    for ptr, size in [(0, 1), (-5, 1), (1.5, 1), ("1", 1), (True, 1), (100, -1),
                      ((1 << 64) - 1, 2)]:
        with pytest.raises(InvalidArgument):
            reg.view(ptr, size, writable=False)
    with pytest.raises(InvalidArgument):
        reg.register(100, 0)
    assert len(reg) == 0


def test_overlapping_and_adjacent_registrations_count_as_their_union() -> None:
    reg = PointerRegistry()
    _a, ptr = _block(3000)
    reg.register(ptr, 1000)
    reg.register(ptr + 1000, 1000)   # adjacent
    reg.register(ptr + 1500, 1500)   # overlapping the second
    assert reg.covers(ptr + 10, 2980)
    assert len(reg.view(ptr + 900, 2000, writable=False)) == 2000  # spans all three
    reg.unregister(ptr + 1000)
    assert reg.covers(ptr + 1500, 1500) and not reg.covers(ptr + 900, 700)
    with pytest.raises(InvalidArgument):
        reg.view(ptr + 900, 700, writable=False)


def test_same_registration_twice_is_a_no_op_another_size_is_refused() -> None:
    reg = PointerRegistry()
    _a, ptr = _block(100)
    reg.register(ptr, 100)
    reg.register(ptr, 100)
    assert reg.registrations() == [(ptr, 100)]
    with pytest.raises(InvalidArgument, match="already registered"):
        reg.register(ptr, 50)
    assert reg.registrations() == [(ptr, 100)]


def test_double_unregistration_is_refused_and_changes_nothing() -> None:
    reg = PointerRegistry()
    _a, ptr = _block(100)
    _b, other = _block(100)
    reg.register(ptr, 100)
    reg.register(other, 100)
    reg.unregister(ptr)
    with pytest.raises(InvalidArgument, match="not the start of a registered buffer"):
        reg.unregister(ptr)
    with pytest.raises(InvalidArgument):
        reg.unregister(other + 1)  # inside, but not a registration's start
    assert reg.registrations() == [(other, 100)]


def test_lease_gives_per_pair_views_or_errors_and_blocks_unregister() -> None:
    reg = PointerRegistry()
    a, ptr = _block(1000)
    reg.register(ptr, 1000)
    with reg.lease([ptr, ptr + 999, 7, ptr + 10], [10, 2, 1, 0], writable=True) as lease:
        v0, bad_range, bad_ptr, empty = lease.views
        assert isinstance(v0, memoryview) and bytes(v0) == bytes(range(10))
        assert isinstance(bad_range, InvalidArgument) and isinstance(bad_ptr, InvalidArgument)
        assert isinstance(empty, memoryview) and len(empty) == 0
        with pytest.raises(InvalidArgument, match="in use"):
            reg.unregister(ptr)
    reg.unregister(ptr)  # released: allowed now
    assert a[0] == 0
    with pytest.raises(InvalidArgument, match="ptrs but"):
        reg.lease([1, 2], [3], writable=False)


def test_registration_count_is_bounded() -> None:
    reg = PointerRegistry()
    buf = ctypes.create_string_buffer(MAX_REGISTRATIONS + 1)
    base = ctypes.addressof(buf)
    for i in range(MAX_REGISTRATIONS):
        reg.register(base + i, 1)
    with pytest.raises(InvalidArgument, match="at most"):
        reg.register(base + MAX_REGISTRATIONS, 1)


def test_threads_register_view_and_unregister_concurrently() -> None:
    reg = PointerRegistry()
    blocks = [_block(4096) for _ in range(16)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        a, ptr = blocks[i]
        try:
            for _ in range(200):
                reg.register(ptr, 4096)
                with reg.lease([ptr], [4096], writable=False) as lease:
                    assert bytes(lease.views[0][:4]) == bytes(a[:4])  # type: ignore[index]
                reg.unregister(ptr)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(reg) == 0


@pytest.mark.parametrize("pools", [1, 2])
def test_a_lease_is_the_same_with_one_pool_or_several(pools: int) -> None:
    """One registration takes `_lease_one_pool` (slices of one view of the pool), more take
    the general path: the same views, refusals, read-only-ness and hold either way; a pool
    unregistered and another registered is leased from the new memory, never the old."""
    reg = PointerRegistry()
    a, ptr = _block(1000)
    reg.register(ptr, 1000)
    keep = [_block(64) for _ in range(pools - 1)]  # other pools: the general path
    for _other, other_ptr in keep:
        reg.register(other_ptr, 64)
    with reg.lease([ptr + 5, ptr + 995, ptr + 990, 0], [3, 10, 0, 1], writable=False) as lease:
        view, past_end, empty, null = lease.views
        assert isinstance(view, memoryview) and view.readonly and bytes(view) == bytes([5, 6, 7])
        assert isinstance(past_end, InvalidArgument) and isinstance(null, InvalidArgument)
        assert isinstance(empty, memoryview) and len(empty) == 0
        with pytest.raises(InvalidArgument, match="in use"):
            reg.unregister(ptr)
    with reg.lease([ptr + 1], [2], writable=True) as lease:
        lease.views[0][:] = b"\xaa\xbb"  # type: ignore[index]
    assert (a[1], a[2]) == (0xAA, 0xBB)
    reg.unregister(ptr)
    b, new_ptr = _block(1000)
    reg.register(new_ptr, 1000)
    with reg.lease([new_ptr + 1], [2], writable=False) as lease:
        assert bytes(lease.views[0]) == bytes(b[1:3])  # type: ignore[arg-type]
    with reg.lease([ptr + 1], [2], writable=False) as lease:
        assert isinstance(lease.views[0], InvalidArgument)  # the old pool is gone
