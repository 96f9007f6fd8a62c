"""A storage node's data plane in this process, for transport tests: `MemAccess` (a segment
backed by an anonymous mmap that checks every request's grant with `cellar.proto.grant.verify`
under a fixed secret, exactly as a storage node does) behind a real `TcpDataServer`, plus
helpers that build signed ops. Fixtures `access`, `server` (the TcpDataServer in front of it) and `route` (to it) are imported
by the transport test modules. `delay_s` slows every read on purpose, after the reply header
would be due, so the cancellation tests can catch a transfer in flight.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Iterator

import pytest

from cellar.proto.grant import GrantRejected, key_tag, sign, verify
from cellar.transfer.base import SegmentRoute, TransferOp
from cellar.transfer.frame import (
    OP_READ,
    OP_WRITE,
    ST_BAD_GRANT,
    ST_EXPIRED,
    ST_OUT_OF_RANGE,
    ST_STALE_EPOCH,
    ST_UNKNOWN_SEGMENT,
    FrameError,
    RequestHeader,
    WriteMeta,
)
from cellar.transfer.tcp_server import TcpDataServer

SECRET = b"cellar-test-secret-0123456789abc"
SEGMENT_ID = 7
SEGMENT_BYTES = 80 << 20
TENANT = "t"
_REJECTED = {
    GrantRejected.BAD_MAC: ST_BAD_GRANT, GrantRejected.WRONG_OP: ST_BAD_GRANT,
    GrantRejected.EXPIRED: ST_EXPIRED, GrantRejected.OUT_OF_RANGE: ST_OUT_OF_RANGE,
    GrantRejected.STALE_EPOCH: ST_STALE_EPOCH,
}


class MemAccess:
    """A SegmentAccess over one mmap'd segment; checks grants like a storage node."""

    def __init__(self, size: int = SEGMENT_BYTES) -> None:
        self.size = size
        self.mem = mmap.mmap(-1, size)
        self.view = memoryview(self.mem)
        self.lock = threading.Lock()
        self.written_calls: list[tuple[int, int, int, str]] = []  # alloc, offset, length, key
        self.delay_s = 0.0  # every read waits this long before its reply (a slow node)

    def _check(self, req: RequestHeader, op: int) -> None:
        if req.segment_id != SEGMENT_ID:
            raise FrameError(ST_UNKNOWN_SEGMENT, f"segment {req.segment_id}")
        assert req.grant is not None
        try:
            verify(SECRET, req.grant, op=op, segment_id=req.segment_id, offset=req.offset,
                   length=req.length, now_ms=int(time.time() * 1000))
        except GrantRejected as e:
            raise FrameError(_REJECTED[e.reason], str(e)) from None
        if req.offset + req.length > self.size:
            raise FrameError(ST_OUT_OF_RANGE, "past the segment")

    def writable(self, req: RequestHeader, meta: WriteMeta) -> memoryview:
        self._check(req, OP_WRITE)
        assert req.grant is not None
        if key_tag(meta.tenant, meta.key) != req.grant.key_tag:
            raise FrameError(ST_BAD_GRANT, "grant is for another key")
        return self.view[req.offset:req.offset + req.length]

    def written(self, req: RequestHeader, meta: WriteMeta) -> None:
        assert req.grant is not None
        with self.lock:
            self.written_calls.append((req.grant.alloc_id, req.offset, req.length, meta.key))

    def readable(self, req: RequestHeader) -> memoryview:
        self._check(req, OP_READ)
        if self.delay_s:
            time.sleep(self.delay_s)  # a node slowed on purpose
        return self.view[req.offset:req.offset + req.length]


def grant(op: int, offset: int, length: int, key: str = "k", *, alloc: int = 1,
          ttl_ms: int = 600_000, secret: bytes = SECRET):
    return sign(secret, op=op, segment_id=SEGMENT_ID, offset=offset, length=length,
                alloc_id=alloc, epoch=1, expiry_ms=int(time.time() * 1000) + ttl_ms,
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
def access_fixture() -> MemAccess:
    return MemAccess()


@pytest.fixture(name="server")
def server_fixture(access: MemAccess) -> Iterator[TcpDataServer]:
    srv = TcpDataServer(access, "127.0.0.1", 0, socket_buffer_bytes=1 << 20)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(name="route")
def route_fixture(server: TcpDataServer) -> SegmentRoute:
    return route_to(f"127.0.0.1:{server.port}")
