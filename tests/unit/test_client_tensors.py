"""client.tensors with CPU torch: zero-copy views, the value header, refusals, round trips.

The CUDA staging path (pinned host copy) needs a CUDA device: not exercised here (no GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cellar.client import tensors  # noqa: E402
from cellar.client.buffers import readable_view, writable_view  # noqa: E402
from cellar.errors import InvalidArgument  # noqa: E402

SUPPORTED = [getattr(torch, name) for name in tensors.DTYPE_CODES if hasattr(torch, name)]


def _sample(dtype, shape):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=torch.float32).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -100), min(info.max, 100), shape).to(dtype)


def test_view_aliases_the_tensor_storage_pinned_or_not() -> None:
    t = torch.arange(16, dtype=torch.int32)
    v = tensors.tensor_view(t, writable=True)
    assert len(v) == 64 and v.format == "B"
    v[0:4] = (7).to_bytes(4, "little")
    assert t[0].item() == 7  # no copy
    pinned_ok = torch.cuda.is_available()  # pin_memory needs a CUDA runtime
    if pinned_ok:
        p = torch.zeros(8, pin_memory=True)
        assert len(tensors.tensor_view(p, writable=True)) == 32
    ro = tensors.tensor_view(t, writable=False)
    assert ro.readonly


def test_buffer_arguments_accept_tensors_and_refuse_strided_ones() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert bytes(readable_view(t)) == t.numpy().tobytes()
    assert len(writable_view(t)) == 48
    with pytest.raises(InvalidArgument, match="not contiguous"):
        readable_view(t.t())
    with pytest.raises(InvalidArgument, match="not contiguous"):
        writable_view(t[:, ::2])
    needs_grad = torch.ones(4, requires_grad=True)
    assert len(readable_view(needs_grad)) == 16


@pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3, 4), (1, 1, 1, 1, 1, 7)])
def test_value_round_trip_every_dtype_and_shape(dtype, shape) -> None:
    t = _sample(dtype, shape)
    parts = tensors.parts_for_put(t)
    value = bytearray(b"".join(bytes(p) for p in parts))
    assert len(value) == tensors.value_nbytes(t)
    header = tensors.decode_header(value, len(value))
    assert header.dtype == dtype and header.shape == tuple(shape)
    assert header.data_offset % tensors.DATA_ALIGN_BYTES == 0
    back = tensors.tensor_from_value(memoryview(value))
    assert back.dtype == dtype and tuple(back.shape) == tuple(shape)
    assert torch.equal(back.view(torch.uint8) if dtype.itemsize == 1 and dtype != torch.bool
                       else back, t.view(torch.uint8) if dtype.itemsize == 1 and
                       dtype != torch.bool else t)
    empty = tensors.empty_for(header)
    assert empty.dtype == dtype and tuple(empty.shape) == tuple(shape)


def test_header_layout_is_documented_bytes() -> None:
    head = tensors.encode_header(torch.zeros((2, 3), dtype=torch.float16))
    assert head[:4] == b"CLTN" and head[4] == 1 and head[5] == tensors.DTYPE_CODES["float16"]
    assert head[6] == 2 and int.from_bytes(head[8:12], "little") == 32 == len(head)
    assert int.from_bytes(head[12:20], "little") == 2
    assert int.from_bytes(head[20:28], "little") == 3


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_refusals() -> None:
    with pytest.raises(InvalidArgument, match="dtype"):
        tensors.encode_header(torch.empty(2, dtype=torch.complex32))
    with pytest.raises(InvalidArgument, match="not contiguous"):
        tensors.parts_for_put(torch.zeros(4, 4).t())
    with pytest.raises(InvalidArgument, match="dimensions"):
        tensors.encode_header(torch.zeros([1] * (tensors.MAX_NDIM + 1)))
    with pytest.raises(InvalidArgument, match="not a cellar tensor"):
        tensors.decode_header(b"hello world, not a tensor")
    with pytest.raises(InvalidArgument, match="too short"):
        tensors.decode_header(b"CL")
    good = bytearray(tensors.encode_header(torch.zeros(3)))
    with pytest.raises(InvalidArgument, match="header says"):
        tensors.decode_header(good, len(good) + 11)
    bad = bytearray(good)
    bad[5] = 250
    with pytest.raises(InvalidArgument, match="unknown dtype"):
        tensors.decode_header(bad)
    bad = bytearray(good)
    bad[4] = 9
    with pytest.raises(InvalidArgument, match="version"):
        tensors.decode_header(bad)
    with pytest.raises(InvalidArgument, match="conjugate"):
        tensors.tensor_view(torch.zeros(2, dtype=torch.complex64).conj(), writable=False)
    meta = torch.empty(4, device="meta")
    with pytest.raises(InvalidArgument, match="not the CPU"):
        tensors.tensor_view(meta, writable=False)


def test_destination_reads_in_place_and_checks_the_header() -> None:
    src = torch.randn(4, 8)
    value = b"".join(bytes(p) for p in tensors.parts_for_put(src))
    dst = torch.zeros(4, 8)
    dest = tensors.destination_for(dst)
    pos = 0
    for part in dest.parts:  # what a transport does with the parts
        part[:] = value[pos:pos + len(part)]
        pos += len(part)
    dest.finish(len(value))
    assert torch.equal(dst, src)
    other = tensors.destination_for(torch.zeros(8, 4))  # same size, other shape
    pos = 0
    for part in other.parts:
        part[:] = value[pos:pos + len(part)]
        pos += len(part)
    with pytest.raises(InvalidArgument, match="destination"):
        other.finish(len(value))


def test_is_tensor_without_torch_loaded_is_false() -> None:
    assert tensors.is_tensor(torch.zeros(1)) and not tensors.is_tensor(b"x")
