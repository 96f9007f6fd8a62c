"""A storage node's data plane in this process, for transport tests: the node's own gate
(`cellar.storage_node.access.NodeAccess`: grant MAC, op, epoch, expiry, range, key tag, and the
status each refusal maps to) over an in-memory segment, behind a real `TcpDataServer`, plus
helpers that build signed ops. Fixtures `access`, `server` (the TcpDataServer in front of it)
and `route` (to it) are imported by the transport test modules.

`TransferNode` is a `NodeAccess`; only its object index is a stand-in (`OpenIndex`): transport
tests write and read ranges at will (a test seeds memory directly, reads a range twice, writes
one again), which the real `ObjectIndex` refuses by design (sealing, exact allocations). The
fuzz suite (tests/fuzz/test_frame_fuzz.py) runs against a NodeAccess with the real index.
`delay_s` slows every read on purpose, after the reply header would be due, so the
cancellation tests can catch a transfer in flight; `written_calls` records each completed frame.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator

import pytest

from cellar.proto.grant import key_tag, sign
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer.base import SegmentRoute, TransferOp
from cellar.transfer.frame import OP_READ, OP_WRITE, RequestHeader, WriteMeta
from cellar.transfer.tcp_server import TcpDataServer

SECRET = b"cellar-test-secret-0123456789abc"
SEGMENT_ID = 7
SEGMENT_BYTES = 80 << 20
TENANT = "t"
EPOCH = 1
# alloc id -> the key its grants were signed for (grant() fills it; OpenIndex answers reads
# with it, so NodeAccess's key-tag check of a read holds for grants made here)
_KEY_OF_ALLOC: dict[int, str] = {}


def alloc_for(key: str) -> int:
    """The allocation id `grant()` uses for `key` unless told otherwise."""
    return zlib.crc32(key.encode()) + 1


class OpenIndex:
    """Stands in for `ObjectIndex` where transport mechanics are under test: every write the
    gate let through is admitted, every read answers with the object its grant names."""

    def admit_write(self, **_: object) -> None:
        return None

    def record_written(self, alloc_id: int, rel_start: int, rel_end: int, **_: object) -> None:
        return None  # never seals: no receipt

    def hold(self, alloc_id: int) -> None:
        return None  # nothing is counted in flight here

    def release(self, alloc_id: int) -> None:
        return None

    def sealed(self, alloc_id: int) -> None:
        return None  # nothing is ever sealed here

    def admit_read(self, *, alloc_id: int, **_: object) -> tuple[str, str]:
        return TENANT, _KEY_OF_ALLOC.get(alloc_id, "")

    def flush_journal(self) -> None:
        return None


class TransferNode(NodeAccess):
    """The storage node's `NodeAccess` over one in-memory segment (epoch 1, no clock skew),
    with `view` (the segment's memory), `written_calls` and `delay_s` for the tests."""

    def __init__(self, size: int = SEGMENT_BYTES, *, index: ObjectIndex | None = None) -> None:
        clock = MasterClock()
        clock.epoch = EPOCH
        segment = Segment.in_memory(SEGMENT_ID, size)
        super().__init__({SEGMENT_ID: segment}, index if index is not None else OpenIndex(),  # type: ignore[arg-type]
                         SECRET, clock, allowed_skew_ms=0)
        self.size = size
        self.view = segment.memory
        self.lock = threading.Lock()
        self.written_calls: list[tuple[int, int, int, str]] = []  # alloc, offset, length, key
        self.delay_s = 0.0  # every read waits this long before its reply (a slow node)

    def written(self, request: RequestHeader, meta: WriteMeta) -> bytes:
        receipt = super().written(request, meta)
        assert request.grant is not None
        with self.lock:
            self.written_calls.append((request.grant.alloc_id, request.offset, request.length,
                                       meta.key))
        return receipt

    def readable(self, request: RequestHeader) -> memoryview:
        view = super().readable(request)
        if self.delay_s:
            time.sleep(self.delay_s)  # a node slowed on purpose
        return view


def grant(op: int, offset: int, length: int, key: str = "k", *, alloc: int = 0,
          ttl_ms: int = 600_000, secret: bytes = SECRET):
    alloc = alloc or alloc_for(key)
    _KEY_OF_ALLOC.setdefault(alloc, key)
    return sign(secret, op=op, segment_id=SEGMENT_ID, offset=offset, length=length,
                alloc_id=alloc, epoch=EPOCH, expiry_ms=int(time.time() * 1000) + ttl_ms,
                tag=key_tag(TENANT, key))


def wop(route: SegmentRoute, offset: int, data, key: str = "k", **kw) -> TransferOp:
    buf = memoryview(data).cast("B")
    return TransferOp(route, grant(OP_WRITE, offset, len(buf), key, **kw), offset, buf,
                      WriteMeta(0, len(buf), TENANT, key))


def rop(route: SegmentRoute, offset: int, dst, key: str = "k", **kw) -> TransferOp:
    buf = memoryview(dst).cast("B")
    return TransferOp(route, grant(OP_READ, offset, len(buf), key, **kw), offset, buf)


def route_to(address: str) -> SegmentRoute:
    return SegmentRoute(SEGMENT_ID, "node-a", "host-a", {"tcp": address})


def pop(route: SegmentRoute, offset: int, parts, key: str = "k", *, write: bool,
        **kw) -> TransferOp:
    """A scatter-gather op over `parts` (one remote range, their concatenation)."""
    views = tuple(memoryview(p).cast("B") for p in parts)
    n = sum(len(v) for v in views)
    op = OP_WRITE if write else OP_READ
    return TransferOp(route, grant(op, offset, n, key, **kw), offset, parts=views,
                      meta=WriteMeta(0, n, TENANT, key) if write else None)


@pytest.fixture(name="access")
def access_fixture() -> TransferNode:
    return TransferNode()


@pytest.fixture(name="server")
def server_fixture(access: TransferNode) -> Iterator[TcpDataServer]:
    srv = TcpDataServer(access, "127.0.0.1", 0, socket_buffer_bytes=1 << 20)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(name="route")
def route_fixture(server: TcpDataServer) -> SegmentRoute:
    return route_to(f"127.0.0.1:{server.port}")
