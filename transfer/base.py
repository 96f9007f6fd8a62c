"""The transport interface every data-plane implementation (tcp, shm, rdma) provides.

Client side: a `Transport` moves batches of `TransferOp`s, each one contiguous remote range
(inside a segment, covered by a grant) paired with one local buffer of the same length, or with
several local buffers (`parts`, scatter-gather: the remote range is their concatenation in
order), and returns one `TransferResult` per op in input order. Chunking, striping over
connections and pipelining are the transport's business (chunks may cross part boundaries); a
failed op never fails its neighbours. `AsyncTransport` is the same contract for an asyncio
event loop (the AsyncClient's data plane), with `aclose()` instead of `close()`.

Cancellation guarantee (both kinds): when `read(ops, timeout_s)` returns, whatever it returns
and however late the node is, no byte of any op's buffer or parts is written afterwards. A
connection caught mid-frame by the deadline is closed, never read again into a caller's memory.

Server side: a storage node implements `SegmentAccess`; the transport's server calls it to
turn a checked request into a memoryview over segment memory, so that payload bytes go
straight between the socket and the segment.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from xxhash import xxh3_64, xxh3_64_intdigest

from cellar.proto.grant import Grant
from cellar.transfer.frame import ST_OK, STATUS_NAMES, RequestHeader, WriteMeta


@dataclass(slots=True, frozen=True)
class SegmentRoute:
    """How to reach one segment: its node, host and one address per transport."""

    segment_id: int
    node_id: str
    host_id: str
    endpoints: dict[str, str] = field(default_factory=dict)  # transport name -> address


_NO_BUFFER = memoryview(b"")


@dataclass(slots=True)
class TransferOp:
    route: SegmentRoute
    grant: Grant
    offset: int           # absolute offset in the segment where this op starts
    # Source (write) or destination (read); len(buffer) bytes move. Unused when `parts` is set.
    buffer: memoryview = _NO_BUFFER
    meta: WriteMeta | None = None  # writes: what the node records in its index
    # Reads: the caller will verify the bytes' xxh3_64. A transport may compute it as soon as
    # they land (while they are still in cache) and return it in TransferResult.checksum;
    # one that does not leaves that None and the caller hashes the buffer itself.
    # Writes (only to a transport whose `hashes_writes` is set): `meta.checksum` is a
    # placeholder; the transport hashes the bytes as it copies them, records that digest as
    # the checksum the node is told, and returns it in TransferResult.checksum.
    want_checksum: bool = False
    # Scatter-gather: when non-empty, the op moves the concatenation of these buffers, in
    # order (sum of their lengths bytes, starting at `offset`), and `buffer` is not used. No
    # transport stages them into one contiguous copy (tcp: one iovec each; shm: one memcpy each).
    parts: tuple[memoryview, ...] = ()
    # Writes by a transport that copies into the segment itself (shm, rdma): CLAIM the
    # allocation at the node before copying (the master flagged the replica: its range may
    # still be served to an old read grant; transfer/frame.py OP_CLAIM). tcp ignores it.
    claim: bool = False


@dataclass(slots=True)
class TransferResult:
    status: int = ST_OK
    message: str = ""
    checksum: int | None = None  # xxh3_64 of a read's bytes, when the op asked and it was done
    # Writes: the node's receipt (cellar.proto.receipt) from the frame or COMMIT that
    # completed the allocation; b"" if no reply carried one (e.g. a server that signs none).
    receipt: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == ST_OK

    def __str__(self) -> str:
        name = STATUS_NAMES.get(self.status, str(self.status))
        return f"{name}: {self.message}" if self.message and self.message != name else name


# Client-side statuses beyond the frame statuses (never sent on the wire).
ST_CONNECT_FAILED = 100   # could not reach the node
ST_CONNECTION_LOST = 101  # connection broke mid-transfer
ST_TIMEOUT = 102
STATUS_NAMES.update({ST_CONNECT_FAILED: "connect failed", ST_CONNECTION_LOST: "connection lost",
                     ST_TIMEOUT: "timed out"})


class Transport(ABC):
    """Moves bytes between local buffers and remote segment ranges."""

    name: str = ""
    # Whether write ops may leave their checksum to the transport (`TransferOp.want_checksum`).
    hashes_writes: bool = False
    # Whether a read copies out of the client's own mapping of the segment (shm), so no node
    # checks its grant: a write grant's range then serves a read as well (client/early_reads.py
    # reads a key this client just put under its write grant).
    reads_own_mapping: bool = False

    @abstractmethod
    def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        """Copy each op's buffer into its remote range; one result per op, in order."""

    @abstractmethod
    def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        """Copy each op's remote range into its buffer; one result per op, in order."""

    def can_reach(self, route: SegmentRoute) -> bool:
        """Whether this transport can serve the segment (shm: same host and file opens)."""
        return self.name in route.endpoints

    def forget(self, route: SegmentRoute) -> None:  # noqa: B027 - optional hook
        """Drop cached connections or mappings for a segment (e.g. its node restarted)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and mappings."""


class AsyncTransport(ABC):
    """`Transport` for an asyncio event loop: the same ops, results and guarantees, awaited.

    An instance belongs to the loop it was first used on (its sockets are that loop's). The
    payload never goes through a thread: tcp uses the loop's non-blocking sockets, shm copies
    inline (in bounded pieces, checking the deadline) and sends its COMMITs on the loop.
    """

    name: str = ""
    hashes_writes: bool = False  # as `Transport.hashes_writes`
    reads_own_mapping: bool = False  # as `Transport.reads_own_mapping`

    @abstractmethod
    async def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        """Copy each op's buffer (or parts) into its remote range; one result per op, in order."""

    @abstractmethod
    async def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        """Copy each op's remote range into its buffer (or parts); one result per op, in order.
        When it returns, no byte of any op's destination is written afterwards."""

    def can_reach(self, route: SegmentRoute) -> bool:
        """Whether this transport can serve the segment (shm: same host and file opens)."""
        return self.name in route.endpoints

    def forget(self, route: SegmentRoute) -> None:  # noqa: B027 - optional hook
        """Drop cached connections or mappings for a segment (e.g. its node restarted)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections and mappings."""


class TransportUnavailable(Exception):
    """A transport that cannot be opened here (no device, no asyncio form yet, ...)."""


@dataclass(slots=True, frozen=True)
class FileRange:
    """Where a write's payload goes when its segment is a disk-backed file (a node's disk
    tier): `length` bytes at `offset` of the file open as `fd`. A transport server receives it
    through a small buffer and pwrite, not by stores into the segment's mapping: a store into
    a page of a disk-backed mapping never written, or written back since, faults through the
    filesystem 4 KiB at a time (transfer/memcopy.py `_write_file` measured both)."""

    fd: int
    offset: int
    length: int


@dataclass(slots=True, frozen=True)
class Discard:
    """What a write's `length` payload bytes are for when they must land nowhere (a retried
    chunk of an allocation that very write sealed already, its reply lost): a server receives
    them through a bounded buffer of its own and drops them, then calls `written` as usual."""

    length: int


class SegmentAccess(Protocol):
    """Implemented by a storage node; called by transport servers from their own threads.

    Each method checks the request (segment known, grant valid for this op and range, range
    inside the segment, allocation not sealed for writes) and raises `FrameError` with the
    matching status if anything is wrong. It must be safe to call from several threads.
    """

    def writable(self, request: RequestHeader, meta: WriteMeta) -> memoryview:
        """The segment memory [offset, offset+length) to receive a write's payload."""
        ...

    def written(self, request: RequestHeader, meta: WriteMeta) -> bytes | None:
        """The payload of `request` landed completely (called once per successful write).
        Non-empty bytes (a write receipt, cellar.proto.receipt) go back as the OK reply's
        payload: a storage node returns one from the write that completed an allocation."""
        ...

    def readable(self, request: RequestHeader) -> memoryview:
        """The segment memory [offset, offset+length) to send for a read."""
        ...

    # Optional: `flush()`, called by a server before its replies leave, so that whatever
    # `written` deferred (a storage node's journal appends) is done before a client hears OK.
    # Optional: `receiver(request, meta)`, `writable` for a server that can write a file: the
    # same checks, and a `FileRange` instead of memory where the segment is a disk-backed file.
    # Either may answer a `Discard` instead (the payload must land nowhere).
    # Optional: `release(request)`. A storage node counts each transfer it admitted
    # (`writable`/`receiver`/`readable` returned) as in flight on its allocation until the
    # server calls this, exactly once: when a write's payload arrived (after `written`) or
    # never will, and when a read's reply was handed to the kernel or never will be. Until
    # then the node seals nothing else of that allocation and admits no newer allocation in
    # its range.
    # Optional: `time_left_s(request)`: seconds until the grant of an admitted `request`
    # expires (the node's clock). The transfer must be over by then: a server closes the
    # connection of one that is not (the master's quarantine and claim windows end with the
    # grants), and lowers its socket timeouts to keep that bound.


def byte_view(buf: Any, *, writable: bool) -> memoryview:
    """A flat byte view of a caller's buffer (numpy, bytearray, mmap, ...); no copy."""
    if type(buf) is memoryview and buf.ndim == 1 and buf.format == "B" and buf.c_contiguous \
            and not (writable and buf.readonly):
        return buf  # the SDK hands over flat byte views: nothing to make
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if not mv.c_contiguous:
        raise ValueError("buffer is not contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if writable and mv.readonly:
        raise ValueError("read destination is read-only")
    return mv


def op_views(op: TransferOp, *, writable: bool) -> tuple[memoryview, ...]:
    """The flat byte views an op moves, in order: its parts, else its buffer (no copy).
    ValueError/TypeError for a non-contiguous or (destination) read-only one."""
    if op.parts:
        return tuple(byte_view(p, writable=writable) for p in op.parts)
    return (byte_view(op.buffer, writable=writable),)


def op_nbytes(op: TransferOp) -> int:
    """How many bytes an op moves."""
    if op.parts:
        return sum(memoryview(p).nbytes for p in op.parts)
    return memoryview(op.buffer).nbytes


def slice_views(views: Sequence[memoryview], start: int, length: int) -> tuple[memoryview, ...]:
    """Bytes [start, start+length) of the concatenation of `views`, as views into them (no
    copy), so a chunk of a scatter-gather op may begin and end inside any part."""
    out: list[memoryview] = []
    pos = 0
    end = start + length
    for v in views:
        n = len(v)
        if pos + n > start and pos < end:
            lo = max(start - pos, 0)
            hi = min(end - pos, n)
            out.append(v if lo == 0 and hi == n else v[lo:hi])
        pos += n
        if pos >= end:
            break
    assert sum(len(v) for v in out) == length, "slice outside the views"
    return tuple(out)


def hash_views(views: Sequence[memoryview]) -> int:
    """xxh3_64 of the concatenation of `views` (streaming: nothing is joined)."""
    if len(views) == 1:
        return xxh3_64_intdigest(views[0])
    h = xxh3_64()
    for v in views:
        h.update(v)
    return h.intdigest()


def local_host_id() -> str:
    """This machine's id, the same for every process on it: /etc/machine-id, else the hostname.
    Storage nodes advertise it; same-host clients compare it to choose shm."""
    try:
        with open("/etc/machine-id") as f:
            machine_id = f.read().strip()
        if machine_id:
            return machine_id
    except OSError:
        pass
    return socket.gethostname()
