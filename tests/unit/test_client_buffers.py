"""Buffer coercion and page-aligned buffers (cellar.client.buffers): pure, no cluster."""

from __future__ import annotations

import array
import mmap
import sys

import numpy as np
import pytest

import cellar
from cellar.client.buffers import (
    PAGE_BYTES,
    alloc_buffer,
    buffer_address,
    is_page_aligned,
    readable_view,
    writable_view,
)


@pytest.mark.parametrize("obj, expected", [
    (b"abc", b"abc"),
    (bytearray(b"abc"), b"abc"),
    (memoryview(b"abcdef")[1:4], b"bcd"),
    (np.frombuffer(b"\x01\x02\x03\x04", dtype=np.uint8), b"\x01\x02\x03\x04"),
    (np.array([1, 2], dtype="<u4"), b"\x01\x00\x00\x00\x02\x00\x00\x00"),
    (np.arange(6, dtype=np.uint8).reshape(2, 3), bytes(range(6))),
    (array.array("H", [1]), b"\x01\x00"),
    (np.float64(1.0).reshape(()) if hasattr(np.float64(1.0), "reshape") else np.array(1.0),
     np.array(1.0).tobytes()),
])
def test_readable_view_is_flat_bytes_without_copy(obj, expected):
    view = readable_view(obj)
    assert view.ndim == 1 and view.format == "B" and view.itemsize == 1
    assert view.tobytes() == expected


def test_views_alias_the_callers_memory():
    arr = np.zeros((4, 4), dtype=np.float32)
    view = writable_view(arr)
    assert view.nbytes == arr.nbytes
    view[0] = 0xFF
    assert arr.view(np.uint8)[0, 0] == 0xFF  # no copy was made


@pytest.mark.parametrize("obj", ["text", 5, 1.5, None, [1, 2], {"a": 1}, object()])
def test_wrong_types_are_invalid_argument(obj):
    with pytest.raises(cellar.InvalidArgument, match="bytes-like"):
        readable_view(obj, "value")
    with pytest.raises(cellar.InvalidArgument, match="bytes-like"):
        writable_view(obj, "buffer")


def test_non_contiguous_is_refused():
    strided = np.arange(100, dtype=np.uint8)[::2]
    with pytest.raises(cellar.InvalidArgument, match="C-contiguous"):
        readable_view(strided)
    fortran = np.asfortranarray(np.zeros((3, 4)))
    with pytest.raises(cellar.InvalidArgument, match="C-contiguous"):
        writable_view(fortran)
    with pytest.raises(cellar.InvalidArgument, match="C-contiguous"):
        writable_view(memoryview(bytearray(10))[::2])


def test_read_only_destinations_are_refused():
    frozen = np.zeros(8, dtype=np.uint8)
    frozen.flags.writeable = False
    for obj in (b"12345678", memoryview(b"12345678"), frozen):
        with pytest.raises(cellar.InvalidArgument, match="read-only"):
            writable_view(obj, "buffer")
    assert readable_view(frozen).nbytes == 8  # fine as a source


def test_released_view_is_invalid_argument():
    view = memoryview(bytearray(4))
    view.release()
    with pytest.raises(cellar.InvalidArgument):
        readable_view(view)


def test_zero_size_views():
    assert readable_view(np.zeros((0, 3))).nbytes == 0
    assert writable_view(np.zeros((0, 3))).nbytes == 0
    assert readable_view(b"").nbytes == 0


def test_alloc_buffer_is_page_aligned_writable_and_zeroed():
    for nbytes in (1, 4095, 4096, 1 << 20):
        buf = alloc_buffer(nbytes)
        assert isinstance(buf, memoryview)
        assert buf.nbytes == nbytes and not buf.readonly and buf.format == "B"
        assert is_page_aligned(buf)
        assert buffer_address(buf) is not None and buffer_address(buf) % PAGE_BYTES == 0
        assert buf[:16].tobytes() == bytes(min(16, nbytes))
        buf[-1] = 7
        assert buffer_address(writable_view(buf)) == buffer_address(buf)
    assert cellar.alloc_buffer is alloc_buffer


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True, None])
def test_alloc_buffer_rejects_bad_sizes(bad):
    with pytest.raises(cellar.InvalidArgument):
        alloc_buffer(bad)


def test_alignment_helpers():
    assert buffer_address(memoryview(b"ro")) is None
    assert not is_page_aligned(memoryview(b"ro"))
    region = mmap.mmap(-1, 2 * PAGE_BYTES)
    view = memoryview(region)
    assert is_page_aligned(view) and not is_page_aligned(view[1:])
    view.release()
    region.close()


def test_fresh_bytes_are_filled_in_place():
    from cellar.client.buffers import as_bytes, fresh_bytes

    for n in (1, 7, 4096, 1 << 20):
        obj, view = fresh_bytes(n)
        assert view.nbytes == n and not view.readonly
        view[:] = bytes([i % 251 for i in range(n)]) if n < 5000 else b"\x5a" * n
        view.release()
        value = as_bytes(obj)
        assert type(value) is bytes and len(value) == n
        expected = bytes([i % 251 for i in range(n)]) if n < 5000 else b"\x5a" * n
        assert value == expected and hash(value) == hash(expected)
    obj, view = fresh_bytes(0)
    assert as_bytes(obj) == b""


def test_result_allocations_tune_malloc_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import cellar.client.buffers as buffers

    calls: list[tuple[int, int]] = []

    class FakeMallopt:  # like a ctypes function: takes argtypes/restype, then is called
        def __call__(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    class FakeLibc:
        mallopt = FakeMallopt()

    _untuned(monkeypatch, buffers)
    monkeypatch.setattr(buffers.ctypes, "CDLL", lambda _name: FakeLibc())
    monkeypatch.setenv("CELLAR_MALLOC_TOP_PAD_BYTES", str(8 << 20))
    obj, view = buffers.fresh_bytes(10)
    view.release()
    buffers.fresh_bytes(10)[1].release()
    if sys.platform.startswith("linux"):
        assert calls == [(-3, 32 << 20), (-2, 8 << 20)]  # M_MMAP_THRESHOLD, M_TOP_PAD; once
        assert buffers.reserve_result_memory(1 << 30) == 8 << 20  # a pad chosen is never grown
        assert len(calls) == 2
    _untuned(monkeypatch, buffers)
    monkeypatch.setenv("CELLAR_MALLOC_TOP_PAD_BYTES", "0")  # opt out: malloc left alone
    assert not buffers.tune_malloc_for_results()
    assert len(calls) <= 2


def _untuned(monkeypatch, buffers) -> None:  # type: ignore[no-untyped-def]
    for name, value in (("_malloc_tuned", False), ("_pad_bytes", 0), ("_pad_fixed", False),
                        ("_mallopt", None)):
        monkeypatch.setattr(buffers, name, value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tuning is Linux-only")
def test_the_pad_grows_with_the_largest_batch_up_to_its_cap(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import cellar.client.buffers as buffers

    calls: list[tuple[int, int]] = []

    class FakeLibc:
        @staticmethod
        def mallopt(param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    _untuned(monkeypatch, buffers)
    monkeypatch.setattr(buffers.ctypes, "CDLL", lambda _name: FakeLibc())
    monkeypatch.delenv("CELLAR_MALLOC_TOP_PAD_BYTES", raising=False)
    MiB = 1 << 20
    assert buffers.reserve_result_memory(100 * MiB) == 256 * MiB  # the first pad covers it
    assert calls == [(-3, 32 * MiB), (-2, 256 * MiB)]
    assert buffers.reserve_result_memory(300 * MiB) == 320 * MiB  # rounded up to 64 MiB steps
    assert buffers.reserve_result_memory(200 * MiB) == 320 * MiB  # never shrinks
    assert buffers.reserve_result_memory(5 << 30) == 1 << 30      # capped
    assert calls[2:] == [(-2, 320 * MiB), (-2, 1 << 30)]
