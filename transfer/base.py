"""The transport interface every data-plane implementation (tcp, shm, rdma) provides.

Client side: a `Transport` moves batches of `TransferOp`s, each one contiguous remote range
(inside a segment, covered by a grant) paired with one local buffer of the same length, and
returns one `TransferResult` per op in input order. Chunking, striping over connections and
pipelining are the transport's business; a failed op never fails its neighbours.

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

from cellar.proto.grant import Grant
from cellar.transfer.frame import ST_OK, STATUS_NAMES, RequestHeader, WriteMeta


@dataclass(slots=True, frozen=True)
class SegmentRoute:
    """How to reach one segment: its node, host and one address per transport."""

    segment_id: int
    node_id: str
    host_id: str
    endpoints: dict[str, str] = field(default_factory=dict)  # transport name -> address


@dataclass(slots=True)
class TransferOp:
    route: SegmentRoute
    grant: Grant
    offset: int           # absolute offset in the segment where this op starts
    buffer: memoryview    # source (write) or destination (read); len(buffer) bytes move
    meta: WriteMeta | None = None  # writes: what the node records in its index
    # Reads: the caller will verify the bytes' xxh3_64. A transport may compute it as soon as
    # they land (while they are still in cache) and return it in TransferResult.checksum;
    # one that does not leaves that None and the caller hashes the buffer itself.
    want_checksum: bool = False


@dataclass(slots=True)
class TransferResult:
    status: int = ST_OK
    message: str = ""
    checksum: int | None = None  # xxh3_64 of a read's bytes, when the op asked and it was done

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


class SegmentAccess(Protocol):
    """Implemented by a storage node; called by transport servers from their own threads.

    Each method checks the request (segment known, grant valid for this op and range, range
    inside the segment, allocation not sealed for writes) and raises `FrameError` with the
    matching status if anything is wrong. It must be safe to call from several threads.
    """

    def writable(self, request: RequestHeader, meta: WriteMeta) -> memoryview:
        """The segment memory [offset, offset+length) to receive a write's payload."""
        ...

    def written(self, request: RequestHeader, meta: WriteMeta) -> None:
        """The payload of `request` landed completely (called once per successful write)."""
        ...

    def readable(self, request: RequestHeader) -> memoryview:
        """The segment memory [offset, offset+length) to send for a read."""
        ...

    # Optional: `flush()`, called by a server before its replies leave, so that whatever
    # `written` deferred (a storage node's journal appends) is done before a client hears OK.


def byte_view(buf: Any, *, writable: bool) -> memoryview:
    """A flat byte view of a caller's buffer (numpy, bytearray, mmap, ...); no copy."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if not mv.c_contiguous:
        raise ValueError("buffer is not contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if writable and mv.readonly:
        raise ValueError("read destination is read-only")
    return mv


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
