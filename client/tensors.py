"""Torch tensors in and out of the SDK: zero-copy byte views, and the header stored with a value.

What it owns
    - `tensor_view(t, writable=...)`: the bytes of a contiguous CPU tensor (pinned or not) as a
      flat memoryview over the tensor's own storage (no copy), for every buffer argument of the
      SDK (`buffers.readable_view`/`writable_view` route tensors here).
    - The tensor value format of `put_tensor`/`get_tensor`: a small header with the dtype and
      shape inside the value, then the raw elements, so a reader gets dtype and shape back
      without encoding them in the key.
    - The staging path of CUDA tensors (a pinned host copy), used only when CUDA exists.
    torch is optional (`pip install cellar-kv[torch]`): it is imported lazily, and nothing here
    runs (or imports torch) for a caller that never passes a tensor.

Value layout (little-endian), version 1
    offset  size        field
    0       4           magic b"CLTN"
    4       1           version (1)
    5       1           dtype code (DTYPE_CODES below; never reused)
    6       1           ndim (0..MAX_NDIM)
    7       1           flags (0; reserved)
    8       4           data_offset: where the elements start (header size, padded)
    12      8 * ndim    shape, one uint64 per dimension
    ...     padding     zeros up to data_offset, a multiple of DATA_ALIGN_BYTES (16)
    data_offset         the elements, C order, prod(shape) * itemsize bytes
    The value's size is exactly data_offset + prod(shape) * itemsize; a value that disagrees
    (or has a bad magic, version, dtype code or ndim) is not a tensor: `InvalidArgument`.
    Elements start 16-byte aligned within the value, so a tensor made over a page-aligned
    buffer of the whole value is aligned for every dtype.

What it refuses (InvalidArgument, before any request leaves)
    Non-contiguous tensors (strided views, transposes: pass `.contiguous()`), conjugate or
    negative-bit views, dtypes outside DTYPE_CODES, more than MAX_NDIM dimensions, and (for the
    zero-copy views) tensors that are not on the CPU. A CUDA tensor is only accepted by the
    staging functions (`parts_for_put`, `destination_for`), which copy through pinned host
    memory; that path needs a CUDA device and was not exercised on this machine (no GPU).

It never copies a CPU tensor's elements, and never imports torch at module import time.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cellar.errors import InvalidArgument

MAGIC = b"CLTN"
VERSION = 1
MAX_NDIM = 16
DATA_ALIGN_BYTES = 16
_FIXED = struct.Struct("<4sBBBBI")
assert _FIXED.size == 12

# torch dtype name -> code stored in the value. Codes are a wire contract: never renumber.
DTYPE_CODES: dict[str, int] = {
    "float32": 1, "float64": 2, "float16": 3, "bfloat16": 4, "int8": 5, "uint8": 6,
    "int16": 7, "int32": 8, "int64": 9, "bool": 10, "float8_e4m3fn": 11, "float8_e5m2": 12,
    "complex64": 13, "complex128": 14, "uint16": 15, "uint32": 16, "uint64": 17,
}
_CODE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
# Same-size integer dtypes: the element bytes of any dtype are reinterpreted as these for the
# numpy bridge (numpy has no bfloat16 or float8), which is a view, never a copy.
_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64", 16: "int64"}


def torch_module() -> Any:
    """torch, imported on first use; ImportError naming the extra if it is not installed."""
    try:
        import torch
    except ImportError:
        raise ImportError("torch tensors need torch: pip install 'cellar-kv[torch]'") from None
    return torch


def is_tensor(obj: Any) -> bool:
    """Whether obj is a torch.Tensor (without importing torch: no torch loaded, no tensor)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _check_layout(t: Any, what: str) -> None:
    if not t.is_contiguous():
        raise InvalidArgument(f"{what} is not contiguous (shape {tuple(t.shape)}, strides "
                              f"{t.stride()}); pass t.contiguous()")
    if t.is_conj() or t.is_neg():
        raise InvalidArgument(f"{what} is a conjugate/negative view; pass t.resolve_conj()"
                              ".resolve_neg()")


def tensor_view(t: Any, *, writable: bool, what: str = "tensor") -> memoryview:
    """The bytes of a contiguous CPU tensor as a flat byte view over its storage (no copy).

    The view keeps the tensor's storage alive. Any dtype works here (raw bytes); a tensor that
    is not contiguous or not on the CPU is refused with InvalidArgument."""
    if t.device.type != "cpu":
        raise InvalidArgument(f"{what} is on {t.device}, not the CPU: use put_tensor/"
                              "get_tensor_into (staged through pinned memory) or .cpu()")
    _check_layout(t, what)
    torch = torch_module()
    flat = t.detach().reshape(-1)  # a view (contiguous); detach: no autograd on raw bytes
    if flat.numel() == 0:
        return memoryview(bytearray()) if writable else memoryview(b"")
    as_int = flat.view(getattr(torch, _INT_OF_SIZE[flat.element_size()]))
    view = memoryview(as_int.numpy()).cast("B")
    return view if writable else view.toreadonly()


@dataclass(frozen=True, slots=True)
class TensorHeader:
    dtype_name: str            # a key of DTYPE_CODES
    shape: tuple[int, ...]
    data_offset: int           # bytes before the elements
    data_nbytes: int           # prod(shape) * itemsize

    @property
    def value_nbytes(self) -> int:
        return self.data_offset + self.data_nbytes

    @property
    def dtype(self) -> Any:
        return getattr(torch_module(), self.dtype_name)


def header_nbytes(ndim: int) -> int:
    """data_offset for a tensor of `ndim` dimensions."""
    raw = _FIXED.size + 8 * ndim
    return -(-raw // DATA_ALIGN_BYTES) * DATA_ALIGN_BYTES


def _dtype_name(t: Any, what: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPE_CODES:
        raise InvalidArgument(f"{what} has dtype {t.dtype}, which cellar tensors do not store; "
                              f"supported: {', '.join(sorted(DTYPE_CODES))}")
    return name


def encode_header(t: Any, what: str = "tensor") -> bytes:
    """The header of `t`'s value (dtype, shape, padding up to the elements)."""
    name = _dtype_name(t, what)
    shape = tuple(int(d) for d in t.shape)
    if len(shape) > MAX_NDIM:
        raise InvalidArgument(f"{what} has {len(shape)} dimensions; at most {MAX_NDIM}")
    offset = header_nbytes(len(shape))
    head = _FIXED.pack(MAGIC, VERSION, DTYPE_CODES[name], len(shape), 0, offset)
    head += struct.pack(f"<{len(shape)}Q", *shape)
    return head + bytes(offset - len(head))


def decode_header(buf: Any, value_nbytes: int | None = None) -> TensorHeader:
    """Parse a value's header (`buf` holds at least its first bytes). With `value_nbytes`, the
    whole value's size must match what the header says. InvalidArgument if it is no tensor."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    if len(mv) < _FIXED.size:
        raise InvalidArgument("value is too short to be a cellar tensor")
    magic, version, code, ndim, _flags, offset = _FIXED.unpack_from(mv)
    if magic != MAGIC:
        raise InvalidArgument("value is not a cellar tensor (no tensor header)")
    if version != VERSION:
        raise InvalidArgument(f"tensor header version {version} is not supported")
    name = _CODE_NAMES.get(code)
    if name is None:
        raise InvalidArgument(f"tensor header names unknown dtype code {code}")
    if ndim > MAX_NDIM or offset != header_nbytes(ndim) or len(mv) < _FIXED.size + 8 * ndim:
        raise InvalidArgument("tensor header is malformed")
    shape = struct.unpack_from(f"<{ndim}Q", mv, _FIXED.size)
    itemsize = _itemsize(name)
    header = TensorHeader(name, tuple(shape), offset, math.prod(shape) * itemsize)
    if value_nbytes is not None and value_nbytes != header.value_nbytes:
        raise InvalidArgument(f"tensor value is {value_nbytes} bytes but its header says "
                              f"{header.value_nbytes}")
    return header


_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
             "int16": 2, "int32": 4, "int64": 8, "bool": 1, "float8_e4m3fn": 1,
             "float8_e5m2": 1, "complex64": 8, "complex128": 16, "uint16": 2, "uint32": 4,
             "uint64": 8}
assert set(_ITEMSIZE) == set(DTYPE_CODES)


def _itemsize(name: str) -> int:
    return _ITEMSIZE[name]


def value_nbytes(t: Any) -> int:
    """The size of `t`'s stored value (header + elements)."""
    return header_nbytes(t.dim()) + t.numel() * t.element_size()


def parts_for_put(t: Any, what: str = "tensor") -> list[memoryview]:
    """[header, elements]: the parts of `t`'s value for a scatter-gather put (no copy of a CPU
    tensor; a CUDA tensor is first copied into pinned host memory, which the view keeps
    alive). InvalidArgument for unsupported dtypes and non-contiguous tensors."""
    head = memoryview(encode_header(t, what))
    _check_layout(t, what)
    if t.device.type == "cuda":
        staged = torch_module().empty(t.shape, dtype=t.dtype, pin_memory=True)
        staged.copy_(t)  # synchronous: the bytes are on the host when this returns
        t = staged
    return [head, tensor_view(t, writable=False, what=what)]


def empty_for(header: TensorHeader, *, pin_memory: bool = False) -> Any:
    """A new CPU tensor of the header's dtype and shape (uninitialised)."""
    torch = torch_module()
    return torch.empty(header.shape, dtype=header.dtype, pin_memory=pin_memory)


def tensor_from_value(buf: Any, value_nbytes: int | None = None) -> Any:
    """The tensor a whole value holds, as a view over `buf` (writable, no copy): `buf` must be
    the value's bytes from offset 0 (e.g. an `alloc_buffer`, page-aligned)."""
    torch = torch_module()
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    header = decode_header(mv, len(mv) if value_nbytes is None else value_nbytes)
    if header.data_nbytes == 0:
        return torch.empty(header.shape, dtype=header.dtype)
    flat = torch.frombuffer(mv, dtype=torch.uint8, count=header.data_nbytes,
                            offset=header.data_offset)
    return flat.view(header.dtype).reshape(header.shape)


@dataclass(slots=True)
class TensorDestination:
    """Where `get_tensor_into(key, t)` reads a value: `parts` = [header scratch, t's bytes
    (or a pinned staging copy for CUDA)]; after the read, `finish(value_nbytes)` checks the
    header against t (InvalidArgument on a dtype/shape mismatch) and copies a staged value to
    the device."""

    parts: list[memoryview]
    header: bytearray
    expect: TensorHeader
    _finish: Callable[[], None] | None = None

    def finish(self, value_nbytes: int) -> None:
        got = decode_header(self.header, value_nbytes)
        if (got.dtype_name, got.shape) != (self.expect.dtype_name, self.expect.shape):
            raise InvalidArgument(f"stored tensor is {got.dtype_name}{list(got.shape)}, the "
                                  f"destination {self.expect.dtype_name}"
                                  f"{list(self.expect.shape)}")
        if self._finish is not None:
            self._finish()


def destination_for(t: Any, what: str = "tensor") -> TensorDestination:
    """The scatter-gather destination of a value read into `t` (see TensorDestination). The
    caller checks the object's size first (`value_nbytes(t)`), so a value of another size
    never touches t."""
    head = encode_header(t, what)
    expect = decode_header(head)
    _check_layout(t, what)
    scratch = bytearray(len(head))
    if t.device.type == "cuda":
        staged = torch_module().empty(t.shape, dtype=t.dtype, pin_memory=True)
        view = tensor_view(staged, writable=True, what=what)
        return TensorDestination([memoryview(scratch), view], scratch, expect,
                                 lambda: t.copy_(staged))
    return TensorDestination([memoryview(scratch), tensor_view(t, writable=True, what=what)],
                             scratch, expect)
