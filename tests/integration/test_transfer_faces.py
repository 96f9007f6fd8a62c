"""Scatter-gather, the asyncio TCP transport and the cancellation guarantee, against a real
TcpDataServer on 127.0.0.1 (in this process, in front of `TransferNode`, the storage node's own
grant checks; see tests/support/transfer_node.py).

The cancellation tests slow the node on purpose (a read that waits before its reply, or a link
that trickles the reply), let the transport's deadline pass, and then wait until the node has
sent everything: the destination buffers must be exactly as they were when `read` returned.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
from xxhash import xxh3_64_intdigest

from cellar.transfer import TransportUnavailable, make_async_transport, open_async_transports
from cellar.transfer.base import ST_TIMEOUT, SegmentRoute, TransferOp
from cellar.transfer.frame import ST_OUT_OF_RANGE
from cellar.transfer.tcp import TcpTransport
from cellar.transfer.tcp_async import AsyncTcpTransport
from cellar.transfer.tcp_server import TcpDataServer
from tests.support.slow_proxy import SlowProxy
from tests.support.transfer_node import (  # noqa: F401 - the fixtures access, server, route
    TransferNode,
    access_fixture,
    pop,
    rop,
    route_fixture,
    route_to,
    server_fixture,
    wop,
)

CHUNK = 64 << 10


def _uvloop_run(coro):
    uvloop = pytest.importorskip("uvloop")
    return uvloop.run(coro)


# The AsyncClient may run on the default loop or on uvloop: the transport must work on both.
RUNNERS = pytest.mark.parametrize("run", [asyncio.run, _uvloop_run], ids=["asyncio", "uvloop"])


@pytest.fixture
def sync_tcp() -> Iterator[TcpTransport]:
    t = TcpTransport(connections_per_node=4, chunk_bytes=CHUNK, socket_buffer_bytes=1 << 20,
                     min_stripe_bytes=0, read_connections_per_node=4)  # reads striped too
    yield t
    t.close()


def _split(data: bytes, sizes: list[int]) -> list[bytearray]:
    out, pos = [], 0
    for n in sizes:
        out.append(bytearray(data[pos:pos + n]))
        pos += n
    out.append(bytearray(data[pos:]))
    return out


# Part sizes that put chunk boundaries (every 64 KiB) inside parts, on part edges, and through
# empty parts; the last part takes the rest.
PART_SIZES = [1, 0, CHUNK - 1, 2, CHUNK, 0, 3 * CHUNK + 5, 4096]
TOTAL = sum(PART_SIZES) + 70_000


def _async_tcp() -> AsyncTcpTransport:
    return AsyncTcpTransport(connections_per_node=4, chunk_bytes=CHUNK,
                             socket_buffer_bytes=1 << 20, min_stripe_bytes=0,
                             read_connections_per_node=4)  # reads striped too


# -- scatter-gather ------------------------------------------------------------------------

def test_sync_parts_write_and_read_across_chunk_and_part_boundaries(
        sync_tcp: TcpTransport, route: SegmentRoute, access: TransferNode) -> None:
    data = os.urandom(TOTAL)
    parts = _split(data, PART_SIZES)
    assert [r.ok for r in sync_tcp.write([pop(route, 4096, parts, write=True)], 30)] == [True]
    assert access.view[4096:4096 + TOTAL] == data
    # read back into differently cut parts, striped over several connections
    dst = _split(bytes(TOTAL), [7, CHUNK + 3, 0, 2 * CHUNK])
    res = sync_tcp.read([pop(route, 4096, dst, write=False)], 30)
    assert res[0].ok and b"".join(dst) == data


def test_sync_one_frame_parts_read_reports_the_checksum_over_all_parts(
        sync_tcp: TcpTransport, route: SegmentRoute) -> None:
    data = os.urandom(5000)
    assert sync_tcp.write([wop(route, 0, data)], 30)[0].ok
    dst = _split(bytes(5000), [10, 0, 990])
    op = pop(route, 0, dst, write=False)
    op.want_checksum = True
    res = sync_tcp.read([op], 30)
    assert res[0].ok and res[0].checksum == xxh3_64_intdigest(data)
    assert b"".join(dst) == data


def test_parts_op_outside_its_grant_fails_alone_before_a_byte_moves(
        sync_tcp: TcpTransport, route: SegmentRoute, access: TransferNode) -> None:
    good = pop(route, 0, [b"ab", b"cd"], write=True)
    bad = pop(route, 8192, [b"x" * 10, b"y" * 10], write=True)
    bad.parts = (*bad.parts, memoryview(b"z"))  # 21 bytes against a 20-byte grant
    res = sync_tcp.write([good, bad], 10)
    assert res[0].ok and res[1].status == ST_OUT_OF_RANGE
    assert access.view[0:4] == b"abcd" and access.view[8192:8213] == bytes(21)


# -- the asyncio transport -----------------------------------------------------------------

def test_async_plain_and_parts_roundtrip_exact_bytes(route: SegmentRoute,
                                                     access: TransferNode) -> None:
    async def main() -> None:
        t = _async_tcp()
        try:
            plain = os.urandom(3 * CHUNK + 11)
            data = os.urandom(TOTAL)
            res = await t.write([wop(route, 0, plain, key="a"),
                                 pop(route, 1 << 20, _split(data, PART_SIZES), key="b",
                                     write=True)], 30)
            assert [r.ok for r in res] == [True, True]
            assert access.view[0:len(plain)] == plain
            assert access.view[1 << 20:(1 << 20) + TOTAL] == data
            got_plain = bytearray(len(plain))
            dst = _split(bytes(TOTAL), [CHUNK + 1, 0, 5])
            one = bytearray(100)
            op_one = rop(route, 1 << 20, one)
            op_one.want_checksum = True
            res = await t.read([rop(route, 0, got_plain), pop(route, 1 << 20, dst,
                                                              write=False), op_one], 30)
            assert all(r.ok for r in res)
            assert got_plain == plain and b"".join(dst) == data
            assert res[2].checksum == xxh3_64_intdigest(data[:100])
        finally:
            await t.aclose()

    asyncio.run(main())


@RUNNERS
def test_async_reads_hashed_as_they_land(route: SegmentRoute, access: TransferNode,
                                         run) -> None:
    """The asyncio transport hashes a large one-frame read piece by piece as it lands and a
    multi-frame read whose frames all came over one channel frame by frame: each reports the
    xxh3_64 of its bytes; striped over four channels, the multi-frame read reports None (the
    caller hashes), its bytes exact all the same."""
    one_frame = os.urandom(1 << 20)   # > HASHED_PIECE_BYTES, one 4 MiB-chunk frame
    frames = os.urandom(5 * CHUNK + 7)  # six frames of CHUNK
    access.view[0:len(one_frame)] = one_frame
    access.view[2 << 20:(2 << 20) + len(frames)] = frames

    async def read(t: AsyncTcpTransport) -> tuple[list[int | None], list[bytes]]:
        outs = [bytearray(len(one_frame)), bytearray(len(frames))]
        ops = [rop(route, 0, outs[0]), rop(route, 2 << 20, outs[1])]
        for op in ops:
            op.want_checksum = True
        try:
            res = await t.read(ops, 30)
        finally:
            await t.aclose()
        assert all(r.ok for r in res)
        return [r.checksum for r in res], [bytes(o) for o in outs]

    whole = AsyncTcpTransport(connections_per_node=4, chunk_bytes=4 << 20)
    sums, outs = run(read(whole))
    assert sums == [xxh3_64_intdigest(one_frame), xxh3_64_intdigest(frames)]  # both one frame
    assert outs == [one_frame, frames]
    one_lane = AsyncTcpTransport(connections_per_node=4, chunk_bytes=CHUNK,
                                 read_connections_per_node=1)
    sums, outs = run(read(one_lane))
    assert sums == [xxh3_64_intdigest(one_frame), xxh3_64_intdigest(frames)]
    assert outs == [one_frame, frames]
    sums, outs = run(read(_async_tcp()))  # four channels
    assert sums[1] is None and outs == [one_frame, frames]


@RUNNERS
def test_async_64_concurrent_reads_on_one_loop(route: SegmentRoute, access: TransferNode,
                                               run) -> None:
    blobs = [os.urandom(64 << 10) for _ in range(64)]
    for i, b in enumerate(blobs):
        access.view[i * (64 << 10):(i + 1) * (64 << 10)] = b

    async def one(t: AsyncTcpTransport, i: int) -> bytes:
        dst = bytearray(64 << 10)
        res = await t.read([rop(route, i * (64 << 10), dst)], 30)
        assert res[0].ok, res[0]
        return bytes(dst)

    async def main() -> None:
        t = _async_tcp()
        try:
            for _ in range(3):
                got = await asyncio.gather(*(one(t, i) for i in range(64)))
                assert got == blobs
            assert t.stats["channels"] <= 4  # pooled: never more than the per-node bound
            assert t.stats["in_flight"] == 0
        finally:
            await t.aclose()

    run(main())


def test_async_bad_op_fails_alone_and_unreachable_node_fails_alone(
        route: SegmentRoute, access: TransferNode) -> None:
    async def main() -> None:
        t = _async_tcp()
        try:
            dead = route_to("127.0.0.1:1")  # nothing listens on port 1
            good = bytearray(10)
            access.view[0:10] = b"0123456789"
            bad = rop(route, 0, bytearray(10))
            bad.offset = 1 << 40  # outside its grant
            res = await t.read([rop(route, 0, good), bad, rop(dead, 0, bytearray(4)),
                                rop(route, 64, bytearray(0))], 10)
            assert res[0].ok and good == b"0123456789"
            assert res[1].status == ST_OUT_OF_RANGE
            assert not res[2].ok
            assert res[3].ok  # a zero-length read is a frame like any other
            empty = await t.write([wop(route, 128, b"", key="empty")], 10)
            assert empty[0].ok
        finally:
            await t.aclose()

    asyncio.run(main())


def test_open_async_transports_choices() -> None:
    names = [t.name for t in open_async_transports("auto")]
    assert names[-1] == "tcp" and "rdma" not in names
    assert [t.name for t in open_async_transports("tcp")] == ["tcp"]
    with pytest.raises(TransportUnavailable):
        open_async_transports("rdma")
    with pytest.raises(ValueError):
        make_async_transport("carrier-pigeon")


# -- the cancellation guarantee --------------------------------------------------------------

SENTINEL = 0xA5


def _sentinel_bufs(sizes: list[int]) -> list[bytearray]:
    return [bytearray([SENTINEL]) * n for n in sizes]


def _wait_until(predicate, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < end:
        time.sleep(0.02)


def test_sync_read_that_times_out_never_writes_afterwards(route: SegmentRoute,
                                                          access: TransferNode,
                                                          sync_tcp: TcpTransport) -> None:
    access.view[0:1 << 20] = os.urandom(1 << 20)
    access.delay_s = 0.5  # every read reply waits half a second
    bufs = _sentinel_bufs([300 << 10, 100])
    ops = [rop(route, 0, bufs[0]), pop(route, 512 << 10, [bufs[1]], write=False)]
    res = sync_tcp.read(ops, 0.1)
    assert [r.status for r in res] == [ST_TIMEOUT, ST_TIMEOUT]
    snapshot = [bytes(b) for b in bufs]
    time.sleep(1.5)  # the node answers every request meanwhile
    assert [bytes(b) for b in bufs] == snapshot
    access.delay_s = 0
    assert sync_tcp.read([rop(route, 0, bufs[0])], 10)[0].ok  # the transport recovered


@RUNNERS
def test_async_read_cancelled_mid_payload_never_writes_afterwards(server: TcpDataServer,
                                                                  access: TransferNode,
                                                                  run) -> None:
    proxy = SlowProxy(("127.0.0.1", server.port), piece_bytes=16 << 10, pause_s=0.01)
    route = route_to(proxy.address)
    size = 2 << 20  # ~128 pieces: ~1.3 s to trickle through
    access.view[0:size] = os.urandom(size)

    async def main() -> None:
        t = AsyncTcpTransport(connections_per_node=1, chunk_bytes=4 << 20,
                              socket_buffer_bytes=64 << 10)
        try:
            plain = bytearray([SENTINEL]) * size
            parted = _sentinel_bufs([100, size - 100])
            res = await t.read([rop(route, 0, plain), pop(route, 0, parted, write=False)], 0.3)
            assert [r.status for r in res] == [ST_TIMEOUT, ST_TIMEOUT]
            snapshot = (bytes(plain), [bytes(p) for p in parted])
            assert snapshot[0] != bytes([SENTINEL]) * size  # it was caught mid-payload
            # let the node's replies trickle in completely while the loop runs
            end = asyncio.get_running_loop().time() + 10
            while proxy.down_bytes < 2 * size and asyncio.get_running_loop().time() < end:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            assert proxy.down_bytes >= 2 * size
            assert (bytes(plain), [bytes(p) for p in parted]) == snapshot
            # a read cancelled by its caller's task keeps the same guarantee
            again = bytearray([SENTINEL]) * size
            task = asyncio.ensure_future(t.read([rop(route, 0, again)], 30))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            frozen = bytes(again)
            await asyncio.sleep(1.8)
            assert bytes(again) == frozen
        finally:
            await t.aclose()

    try:
        run(main())
    finally:
        proxy.close()


def test_async_zero_budget_returns_at_once_untouched(route: SegmentRoute,
                                                     access: TransferNode) -> None:
    async def main() -> None:
        t = _async_tcp()
        try:
            bufs = _sentinel_bufs([1000, 2000])
            res = await t.read([rop(route, 0, bufs[0]), rop(route, 4096, bufs[1])], 0)
            assert [r.status for r in res] == [ST_TIMEOUT, ST_TIMEOUT]
            await asyncio.sleep(0.2)
            assert bufs == _sentinel_bufs([1000, 2000])
            ok = await t.read([rop(route, 0, bufs[0])], 10)  # and the channel still works
            assert ok[0].ok
        finally:
            await t.aclose()

    asyncio.run(main())


def test_transfer_op_with_parts_ignores_buffer() -> None:
    op = TransferOp(route_to("127.0.0.1:9"), None, 0, parts=(memoryview(b"ab"),))  # type: ignore[arg-type]
    assert len(op.buffer) == 0 and op.parts


@RUNNERS
def test_a_refused_read_leaves_no_refusal_text_in_the_callers_buffer(
        route: SegmentRoute, sync_tcp: TcpTransport, run) -> None:  # type: ignore[no-untyped-def]
    """A node refuses a read (a forged grant): its reply header and message may arrive in one
    receive, which lands what follows the header straight in the caller's buffer. The
    transport hands those bytes back to its inbox and clears them from the buffer, on both
    faces: the caller's memory holds no refusal text, only what it held or zeros."""
    forged = {"secret": b"f" * 32}
    buf = bytearray(b"\xee" * 4096)
    (res,) = sync_tcp.read([rop(route, 0, buf, **forged)], 10)
    assert not res.ok and res.message
    assert set(bytes(buf)) <= {0xEE, 0}, bytes(buf[:64])

    async def main() -> None:
        t = _async_tcp()
        try:
            abuf = bytearray(b"\xee" * 4096)
            (ares,) = await t.read([rop(route, 0, abuf, **forged)], 10)
            assert not ares.ok and ares.message
            assert set(bytes(abuf)) <= {0xEE, 0}, bytes(abuf[:64])
        finally:
            await t.aclose()

    run(main())
