"""TcpTransport against a real TcpDataServer on 127.0.0.1.

The server runs in this process on its own threads, in front of `TransferNode`: the storage
node's own `NodeAccess` (grant checks and refusal statuses) over an in-memory segment, see
tests/support/transfer_node.py. A small TCP proxy cuts connections mid-transfer.
"""

from __future__ import annotations

import mmap
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from cellar.proto.grant import sign
from cellar.transfer import _sockio, make_transport
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    SegmentRoute,
    TransferOp,
)
from cellar.transfer.frame import (
    OP_READ,
    OP_WRITE,
    ST_BAD_FRAME,
    ST_BAD_GRANT,
    ST_EXPIRED,
    ST_INTERNAL,
    ST_OUT_OF_RANGE,
    ST_UNKNOWN_SEGMENT,
    RequestHeader,
    WriteMeta,
)
from cellar.transfer.spin_wait import MAX_SPIN_US, SpinWait
from cellar.transfer.tcp import TcpTransport
from cellar.transfer.tcp_server import TcpDataServer
from tests.integration.cut_proxy import CutProxy
from tests.support.transfer_node import (  # noqa: F401 - the fixtures access, server, route
    SECRET,
    SEGMENT_ID,
    TENANT,
    TransferNode,
    access_fixture,
    alloc_for,
    grant,
    rop,
    route_fixture,
    route_to,
    server_fixture,
    wop,
)


@pytest.fixture(params=["native", "python"])
def transport(request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[TcpTransport]:
    """Every test on this fixture runs with READ replies received by the native helper
    (transfer/_replies.c) and by the Python loop it falls back to."""
    if request.param == "native" and not _sockio.NATIVE_REPLIES:
        pytest.skip("the native helper is not built (or CELLAR_NATIVE_REPLIES=0)")
    monkeypatch.setattr(_sockio, "NATIVE_REPLIES", request.param == "native")
    # small chunks force striping over all four connections (reads too, whatever the CPUs)
    t = TcpTransport(connections_per_node=4, chunk_bytes=64 << 10,
                     socket_buffer_bytes=1 << 20, read_connections_per_node=4)
    yield t
    t.close()


def test_reads_take_the_native_path_only_where_it_runs(route: SegmentRoute,
                                                       access: TransferNode,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of reads over plain TCP receives its replies natively (when built); with
    NATIVE_REPLIES off it never does, and the bytes are the same either way."""
    if not _sockio.NATIVE_REPLIES:
        pytest.skip("the native helper is not built (or CELLAR_NATIVE_REPLIES=0)")
    calls = []
    real = _sockio._read_replies

    def counted(*args: object) -> tuple[int, int, int, int, int]:
        calls.append(args)
        assert real is not None
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_sockio, "_read_replies", counted)
    data = os.urandom(16 << 16)
    access.view[:len(data)] = data
    for native in (True, False):
        monkeypatch.setattr(_sockio, "NATIVE_REPLIES", native)
        calls.clear()
        t = TcpTransport(connections_per_node=1)
        try:
            outs = [bytearray(64 << 10) for _ in range(16)]
            res = t.read([rop(route, i << 16, outs[i]) for i in range(16)], 10)
        finally:
            t.close()
        assert all(r.ok for r in res)
        assert b"".join(outs) == data
        assert bool(calls) is native


SIZES = [1, 2, 4095, 4096, 4097, (64 << 10) - 1, 64 << 10, (64 << 10) + 1, 3 << 16,
         (1 << 20) + 7, 32 << 20]


def test_exact_bytes_over_chunk_boundaries(transport: TcpTransport, route: SegmentRoute,
                                           server: TcpDataServer, access: TransferNode) -> None:
    offset, ops, datas = 0, [], []
    for n in SIZES:
        data = os.urandom(n)
        ops.append(wop(route, offset, data, key=f"k{n}"))
        datas.append((offset, data))
        offset += n + 4096
    assert all(r.ok for r in transport.write(ops, 30))
    for off, data in datas:
        assert access.view[off:off + len(data)] == data
    outs = [bytearray(len(d)) for _, d in datas]
    res = transport.read([rop(route, off, out, key=f"k{len(out)}")
                          for (off, _), out in zip(datas, outs, strict=True)], 30)
    assert all(r.ok for r in res)
    assert [bytes(o) for o in outs] == [d for _, d in datas]
    # striped: the batch used every connection, and they are reused, not reopened
    stats = server.stats.snapshot()
    assert stats["active_connections"] == 4 == stats["connections_total"]
    transport.read([rop(route, 0, bytearray(1), key="k1")], 5)
    assert server.stats.snapshot()["connections_total"] == 4
    # every written frame lies inside its op's range and they cover it exactly
    by_key: dict[str, int] = {}
    for _, _, length, key in access.written_calls:
        by_key[key] = by_key.get(key, 0) + length
    assert by_key == {f"k{n}": n for n in SIZES}


def test_reads_report_their_checksum_when_asked(transport: TcpTransport,
                                               route: SegmentRoute) -> None:
    """A one-frame read with want_checksum comes back with the xxh3_64 of the bytes read, so
    does one cut into frames that all came over one lane (hashed as they land); one whose
    frames were striped over several lanes, or one that did not ask, leaves checksum None
    (the caller hashes)."""
    import xxhash

    small, large = os.urandom(1000), os.urandom((64 << 10) * 3 + 5)  # large: 4 frames
    assert all(r.ok for r in transport.write([wop(route, 0, small, key="s"),
                                              wop(route, 1 << 20, large, key="l")], 30))
    outs = [bytearray(len(small)), bytearray(len(large)), bytearray(len(small))]
    ops = [rop(route, 0, outs[0], key="s"), rop(route, 1 << 20, outs[1], key="l"),
           rop(route, 0, outs[2], key="s")]
    ops[0].want_checksum = ops[1].want_checksum = True
    res = transport.read(ops, 30)
    assert all(r.ok for r in res)
    assert res[0].checksum == xxhash.xxh3_64_intdigest(small)
    # under min_stripe_bytes: one lane, which had every frame of the large read
    assert res[1].checksum == xxhash.xxh3_64_intdigest(large) and bytes(outs[1]) == large
    assert res[2].checksum is None and bytes(outs[2]) == small
    striped = TcpTransport(connections_per_node=4, chunk_bytes=64 << 10, min_stripe_bytes=0,
                           read_connections_per_node=4)
    try:
        outs = [bytearray(len(small)), bytearray(len(large))]
        ops = [rop(route, 0, outs[0], key="s"), rop(route, 1 << 20, outs[1], key="l")]
        ops[0].want_checksum = ops[1].want_checksum = True
        res = striped.read(ops, 30)
        assert res[1].checksum is None and bytes(outs[1]) == large  # frames on several lanes
        assert res[0].checksum == xxhash.xxh3_64_intdigest(small)
    finally:
        striped.close()


def test_one_bad_op_fails_alone(transport: TcpTransport, route: SegmentRoute,
                                access: TransferNode) -> None:
    access.view[:1 << 20] = os.urandom(1 << 20)
    before = bytes(access.view[:1 << 20])
    n = 100_000  # two chunks each
    good = [os.urandom(n) for _ in range(4)]
    forged = wop(route, 1 * n, os.urandom(n), secret=b"not-the-cluster-secret-000000000")
    expired = wop(route, 3 * n, os.urandom(n), ttl_ms=-60_000)
    outside = wop(route, 5 * n, os.urandom(n))
    outside.offset = 5 * n + 10  # beyond the granted range by 10 bytes
    wrong_key = wop(route, 7 * n, os.urandom(n), key="k")
    wrong_key.meta = WriteMeta(0, n, TENANT, "another-key")
    ops = [wop(route, 0, good[0]), forged, wop(route, 2 * n, good[1]), expired,
           wop(route, 4 * n, good[2]), outside, wop(route, 6 * n, good[3]), wrong_key]
    res = transport.write(ops, 10)
    assert [r.status for r in res] == [0, ST_BAD_GRANT, 0, ST_EXPIRED, 0, ST_OUT_OF_RANGE, 0,
                                       ST_BAD_GRANT]
    assert "out" in res[5].message and not res[0].message
    after = bytes(access.view[:1 << 20])
    for i in range(8):
        if i % 2 == 0:
            assert after[i * n:(i + 1) * n] == good[i // 2]
        else:
            assert after[i * n:(i + 1) * n] == before[i * n:(i + 1) * n], f"op {i} wrote"
    assert after[8 * n:] == before[8 * n:]

    # the same for reads: bad ones fail alone (a failed read's own buffer is unspecified:
    # a reply header and what follows may have been received into it)
    outs = [bytearray(n) for _ in range(4)]
    bad_out = bytearray(b"\xaa" * n)
    read_outside = rop(route, 0, bytearray(n))
    read_outside.offset = 1
    res = transport.read([rop(route, 0, outs[0]), rop(route, n, bad_out, ttl_ms=-1000),
                          rop(route, 2 * n, outs[1]), read_outside,
                          rop(route, 4 * n, outs[2]),
                          TransferOp(route, grant(OP_WRITE, 0, n), 0, memoryview(bytearray(n))),
                          rop(route, 6 * n, outs[3])], 10)
    assert [r.status for r in res] == [0, ST_EXPIRED, 0, ST_OUT_OF_RANGE, 0, ST_BAD_GRANT, 0]
    assert [bytes(o) for o in outs] == good


def test_a_read_of_one_frame_ends_as_in_a_batch(transport: TcpTransport, route: SegmentRoute,
                                                  access: TransferNode,
                                                  server: TcpDataServer) -> None:
    """One op that fits one frame skips the batch's planning (`_one_frame`): a write lands, a
    read brings the same bytes and checksum, and each failure has the status a batch gives
    it: refused by the node (expired, a write grant), outside its grant, a dead node, a
    silent one; the connection that carried a refusal is used again."""
    import xxhash

    data = os.urandom(50_000)
    (written,) = transport.write([wop(route, 0, data)], 10)
    assert written.ok and bytes(access.view[:len(data)]) == data
    out = bytearray(b"\xaa" * (len(data) + 10))
    op = rop(route, 0, memoryview(out)[:len(data)])
    op.want_checksum = True
    (ok,) = transport.read([op], 10)
    assert ok.ok and ok.checksum == xxhash.xxh3_64_intdigest(data)
    assert bytes(out[:len(data)]) == data and out[len(data):] == b"\xaa" * 10
    outside = rop(route, 0, bytearray(100))
    outside.offset = 1
    write_grant = TransferOp(route, grant(OP_WRITE, 0, 100), 0, memoryview(bytearray(100)))
    for bad, status in ((rop(route, 0, bytearray(100), ttl_ms=-1000), ST_EXPIRED),
                        (write_grant, ST_BAD_GRANT), (outside, ST_OUT_OF_RANGE)):
        (res,) = transport.read([bad], 10)
        assert res.status == status, res
    (again,) = transport.read([rop(route, 0, bytearray(len(data)))], 10)
    assert again.ok
    assert server.stats.snapshot()["connections_total"] == 1  # one read at a time: one
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        (refused,) = transport.read([rop(route_to(f"127.0.0.1:{dead.getsockname()[1]}"), 0,
                                         bytearray(100))], 1)
        (timed_out,) = transport.read([rop(route_to(f"127.0.0.1:{silent.getsockname()[1]}"), 0,
                                           bytearray(100))], 0.3)
        assert (refused.status, timed_out.status) == (ST_CONNECT_FAILED, ST_TIMEOUT)
    finally:
        dead.close()
        silent.close()


def test_write_without_meta_and_unknown_segment(transport: TcpTransport, route: SegmentRoute) -> None:
    no_meta = wop(route, 0, b"abc")
    no_meta.meta = None
    other = SegmentRoute(99, "node-a", "host-a", route.endpoints)
    g = sign(SECRET, op=OP_READ, segment_id=99, offset=0, length=3, alloc_id=1, epoch=1,
             expiry_ms=int(time.time() * 1000) + 10_000, tag=0)
    res = transport.write([no_meta], 5) + transport.read(
        [TransferOp(other, g, 0, memoryview(bytearray(3)))], 5)
    assert [r.status for r in res] == [ST_BAD_FRAME, ST_UNKNOWN_SEGMENT]


@pytest.mark.parametrize("inflight", [1, 7, 64])
def test_pipelined_batch_of_100(route: SegmentRoute, access: TransferNode, inflight: int) -> None:
    t = TcpTransport(connections_per_node=2, chunk_bytes=16 << 10, min_stripe_bytes=0,
                     max_inflight_per_connection=inflight)
    try:
        sizes = [(i * 7919) % 50_000 + 1 for i in range(100)]
        offsets = [sum(sizes[:i]) for i in range(100)]
        datas = [os.urandom(s) for s in sizes]
        res = t.write([wop(route, o, d) for o, d in zip(offsets, datas, strict=True)], 30)
        assert all(r.ok for r in res)
        outs = [bytearray(s) for s in sizes]
        res = t.read([rop(route, o, b) for o, b in zip(offsets, outs, strict=True)], 30)
        assert all(r.ok for r in res) and len(res) == 100
        assert outs == datas
    finally:
        t.close()


def test_concurrent_batches_from_8_threads(route: SegmentRoute, server: TcpDataServer) -> None:
    # fewer connections than threads: batches queue for connections instead of opening more
    t = TcpTransport(connections_per_node=3, chunk_bytes=32 << 10, min_stripe_bytes=0)
    errors: list[str] = []
    region = 4 << 20

    def worker(w: int) -> None:
        rng = np.random.default_rng(w)
        for it in range(6):
            sizes = rng.integers(1, 300_000, size=8)
            base = w * region
            offsets = [base + int(sum(sizes[:i])) for i in range(len(sizes))]
            datas = [rng.integers(0, 256, int(s), dtype=np.uint8) for s in sizes]
            res = t.write([wop(route, o, d) for o, d in zip(offsets, datas, strict=True)], 30)
            outs = [np.empty_like(d) for d in datas]
            res += t.read([rop(route, o, b) for o, b in zip(offsets, outs, strict=True)], 30)
            if not all(r.ok for r in res):
                errors.append(f"worker {w} iter {it}: {[str(r) for r in res if not r.ok]}")
            elif not all(np.array_equal(a, b) for a, b in zip(datas, outs, strict=True)):
                errors.append(f"worker {w} iter {it}: wrong bytes")

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    t.close()
    assert not errors
    assert server.stats.snapshot()["connections_total"] <= 3


def test_reads_into_numpy_bytearray_and_mmap(transport: TcpTransport, route: SegmentRoute,
                                            access: TransferNode) -> None:
    data = os.urandom(200_000)
    access.view[:len(data)] = data
    as_u8 = np.empty(len(data), dtype=np.uint8)
    as_f32 = np.empty(len(data) // 4, dtype=np.float32)
    ba = bytearray(len(data))
    mm = mmap.mmap(-1, 1 << 20)
    into_mm = memoryview(mm)[4096:4096 + len(data)]
    ops = [rop(route, 0, as_u8), rop(route, 0, as_f32), rop(route, 0, ba), rop(route, 0, into_mm)]
    ops.append(TransferOp(route, grant(OP_READ, 0, len(data)), 0, memoryview(bytes(len(data)))))
    res = transport.read(ops, 10)
    assert [r.ok for r in res] == [True, True, True, True, False]  # bytes is read-only
    assert as_u8.tobytes() == data and as_f32.tobytes() == data and ba == data
    assert into_mm == data
    del ops  # the transport kept no reference: the mapping can close
    into_mm.release()
    mm.close()


def test_zero_length_ops(transport: TcpTransport, route: SegmentRoute, access: TransferNode) -> None:
    res = transport.write([wop(route, 100, b"", key="empty")], 5)
    res += transport.read([rop(route, 100, bytearray(0), key="empty")], 5)
    assert all(r.ok for r in res)
    assert (alloc_for("empty"), 100, 0, "empty") in access.written_calls


@pytest.fixture
def proxy(server: TcpDataServer) -> Iterator[CutProxy]:
    p = CutProxy(("127.0.0.1", server.port))
    yield p
    p.close()


def test_connection_cut_mid_read_fails_that_op_and_retry_succeeds(
        proxy: CutProxy, access: TransferNode) -> None:
    route = route_to(f"127.0.0.1:{proxy.port}")
    n = 1 << 20
    data = os.urandom(4 * n)
    access.view[:4 * n] = data
    # one op per connection
    t = TcpTransport(connections_per_node=4, chunk_bytes=n, min_stripe_bytes=0,
                     read_connections_per_node=4)
    try:
        # open the four connections first, so the cut hits one of four streams in flight
        assert all(r.ok for r in t.read([rop(route, i * n, bytearray(n)) for i in range(4)], 10))
        proxy.arm("down", n // 2)
        outs = [bytearray(n) for _ in range(4)]
        res = t.read([rop(route, i * n, outs[i]) for i in range(4)], 10)
        assert proxy.cuts == 1
        assert sorted(r.status for r in res) == [0, 0, 0, ST_CONNECTION_LOST]
        for i, r in enumerate(res):
            if r.ok:
                assert outs[i] == data[i * n:(i + 1) * n]
        bad = [i for i, r in enumerate(res) if not r.ok]
        retry = t.read([rop(route, i * n, outs[i]) for i in bad], 10)
        assert retry[0].ok and outs[bad[0]] == data[bad[0] * n:(bad[0] + 1) * n]
    finally:
        t.close()


def test_connection_cut_mid_write_is_never_written(proxy: CutProxy, access: TransferNode,
                                                   server: TcpDataServer) -> None:
    route = route_to(f"127.0.0.1:{proxy.port}")
    t = TcpTransport(connections_per_node=1, chunk_bytes=4 << 20)
    try:
        data = os.urandom(2 << 20)
        proxy.arm("up", 1 << 20)
        res = t.write([wop(route, 0, data, key="cut")], 10)
        assert res[0].status == ST_CONNECTION_LOST
        deadline = time.monotonic() + 5
        while server.stats.snapshot()["active_connections"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not [c for c in access.written_calls if c[3] == "cut"]
        res = t.write([wop(route, 0, data, key="cut")], 10)
        assert res[0].ok and access.view[:len(data)] == data
        assert [c for c in access.written_calls if c[3] == "cut"] == [(alloc_for("cut"), 0, len(data), "cut")]
    finally:
        t.close()


def test_unreachable_and_silent_nodes_fail_alone(transport: TcpTransport, route: SegmentRoute,
                                                 access: TransferNode) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        dead_route = route_to(f"127.0.0.1:{dead.getsockname()[1]}")
        silent_route = route_to(f"127.0.0.1:{silent.getsockname()[1]}")
        no_tcp = SegmentRoute(SEGMENT_ID, "node-x", "host-x", {"shm": "/dev/shm/x"})
        t0 = time.monotonic()
        res = transport.write([wop(dead_route, 0, b"x"), wop(route, 0, b"good"),
                               wop(silent_route, 0, b"y" * 100_000), wop(no_tcp, 0, b"z")], 0.5)
        # the outcome, not the time: the silent node's op ends by its deadline (ST_TIMEOUT)
        print(f"batch with a dead and a silent node returned after {time.monotonic() - t0:.2f}s")
        assert [r.status for r in res][:3] == [ST_CONNECT_FAILED, 0, ST_TIMEOUT]
        assert not res[3].ok and "tcp endpoint" in res[3].message
        assert access.view[:4] == b"good"
    finally:
        dead.close()
        silent.close()


def test_server_restart_reconnects_and_forget(access: TransferNode) -> None:
    srv = TcpDataServer(access, "127.0.0.1", 0)
    port = srv.start()
    route = route_to(f"127.0.0.1:{port}")
    t = TcpTransport(connections_per_node=1)
    try:
        assert t.write([wop(route, 0, b"before")], 5)[0].ok
        srv.stop()
        srv = TcpDataServer(access, "127.0.0.1", port)
        srv.start()
        # the pooled connection died with the old server: noticed at checkout, reconnected
        assert t.write([wop(route, 0, b"after!")], 5)[0].ok
        assert access.view[:6] == b"after!"
        assert srv.stats.snapshot()["connections_total"] == 1
        t.forget(route)
        assert t.read([rop(route, 0, bytearray(6))], 5)[0].ok
        assert srv.stats.snapshot()["connections_total"] == 2
        assert t.ping(route.endpoints["tcp"], 1.0) > 0
    finally:
        t.close()
        srv.stop()
    res = t.read([rop(route, 0, bytearray(1))], 1)  # closed transport: fails, never hangs
    assert res[0].status == ST_CONNECT_FAILED


def test_ping_and_stats(server: TcpDataServer, route: SegmentRoute,
                        transport: TcpTransport) -> None:
    rtts = [transport.ping(route.endpoints["tcp"], 1.0) for _ in range(20)]
    assert all(r > 0 for r in rtts)  # each answered (a timed-out ping raises)
    transport.write([wop(route, 0, b"x" * 1000)], 5)
    transport.read([rop(route, 0, bytearray(1000)), rop(route, 0, bytearray(10), ttl_ms=-5)], 5)
    s = server.stats.snapshot()
    assert s["requests"] == {"read": 2, "write": 1, "ping": 20, "commit": 0, "claim": 0,
                             "rdma_connect": 0, "invalid": 0}
    assert s["bytes_in"] == 1000 and s["bytes_out"] == 1000
    assert s["errors"] == {"grant expired": 1}
    with pytest.raises(ConnectionError):
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))
        try:
            transport.ping(f"127.0.0.1:{dead.getsockname()[1]}", 1.0)
        finally:
            dead.close()


def test_max_connections_refuses_beyond_the_limit(access: TransferNode) -> None:
    with TcpDataServer(access, "127.0.0.1", 0, max_connections=2) as srv:
        route = route_to(srv.address)
        t = TcpTransport(connections_per_node=1)
        extra = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
        try:
            deadline = time.monotonic() + 5
            while srv.stats.snapshot()["connections_refused"] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            s = srv.stats.snapshot()
            assert s["active_connections"] == 2 and s["connections_refused"] == 1
            assert t.write([wop(route, 0, b"x")], 2)[0].status == ST_CONNECTION_LOST
            extra.pop().close()
            extra.pop().close()
            time.sleep(0.1)
            assert t.write([wop(route, 0, b"x")], 2)[0].ok
        finally:
            t.close()
            for s_ in extra:
                s_.close()


def test_make_transport_tcp_end_to_end(route: SegmentRoute) -> None:
    t = make_transport("tcp", chunk_bytes=1 << 16)
    try:
        assert t.write([wop(route, 0, b"hello")], 5)[0].ok
        out = bytearray(5)
        assert t.read([rop(route, 0, out)], 5)[0].ok and out == b"hello"
    finally:
        t.close()


class FaultyAccess(TransferNode):
    """Bugs in a storage node's access layer: they must cost one op, not the connection."""

    def writable(self, req: RequestHeader, meta: WriteMeta) -> memoryview:
        if meta.key == "boom":
            raise RuntimeError("node bug")
        return super().writable(req, meta)

    def readable(self, req: RequestHeader) -> memoryview:
        view = super().readable(req)
        return view[:-1] if req.length == 7 else view  # wrong length for 7-byte reads


def test_access_layer_bugs_fail_one_op(caplog: pytest.LogCaptureFixture) -> None:
    access = FaultyAccess(1 << 20)
    with TcpDataServer(access, "127.0.0.1", 0) as srv:
        route = route_to(srv.address)
        t = TcpTransport(connections_per_node=1)
        try:
            res = t.write([wop(route, 0, b"a" * 100), wop(route, 100, b"b" * 100, key="boom"),
                           wop(route, 200, b"c" * 100)], 5)
            assert [r.status for r in res] == [0, ST_INTERNAL, 0]
            assert access.view[100:200] == bytes(100)  # drained, never landed
            res = t.read([rop(route, 0, bytearray(7)), rop(route, 200, bytearray(100))], 5)
            assert [r.status for r in res] == [ST_INTERNAL, 0]
            assert srv.stats.snapshot()["connections_total"] == 1  # the connection survived
        finally:
            t.close()
    assert any("segment access failed" in r.message for r in caplog.records)


def test_close_while_batches_run(route: SegmentRoute) -> None:
    t = TcpTransport(connections_per_node=2, chunk_bytes=64 << 10, min_stripe_bytes=0)
    data = os.urandom(4 << 20)
    results: list[list[int]] = []

    def worker() -> None:
        for _ in range(20):
            results.append([r.status for r in t.write([wop(route, 0, data)], 5)])

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    time.sleep(0.05)
    t.close()
    for th in threads:
        th.join(10)
        assert not th.is_alive()
    assert len(results) == 80
    assert {s for r in results for s in r} <= {0, ST_CONNECT_FAILED, ST_CONNECTION_LOST}


class _CountingSpin(SpinWait):
    def __init__(self) -> None:
        super().__init__(MAX_SPIN_US)
        self.asked = 0

    def wait(self, sock: socket.socket) -> bool:
        self.asked += 1
        return super().wait(sock)


def test_a_batch_spins_for_its_reply_only_when_it_is_one_chunk(
        route: SegmentRoute, access: TransferNode) -> None:
    """transfer/spin_wait.py: a batch of one chunk polls once before its reply; a batch of
    more chunks (one lane or striped over lanes on other threads) never spins, nor does a
    transport over TLS."""
    spin = _CountingSpin()
    t = TcpTransport(connections_per_node=4, chunk_bytes=64 << 10, min_stripe_bytes=0,
                     spin=spin)
    try:
        data = os.urandom(64 << 10)
        assert all(r.ok for r in t.write([wop(route, 0, data, key="one")], 30))
        assert spin.asked == 1
        out = bytearray(len(data))
        assert all(r.ok for r in t.read([rop(route, 0, out, key="one")], 30))
        assert spin.asked == 2 and bytes(out) == data
        big = os.urandom(1 << 20)  # 16 chunks over 4 lanes
        assert all(r.ok for r in t.write([wop(route, 0, big, key="big")], 30))
        two = [wop(route, 0, data, key="a"), wop(route, 1 << 20, data, key="b")]
        assert all(r.ok for r in TcpTransport(connections_per_node=1, spin=spin).write(two, 30))
        assert spin.asked == 2
    finally:
        t.close()
    assert TcpTransport(spin=spin, tls_context=ssl.create_default_context()).spin is None


def test_a_server_spins_only_for_proven_plain_connections(
        access: TransferNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """`spin_us`: a connection polls for its next request before blocking once it proved a
    grant (never a stranger's, which only pings here), never over TLS, never with 0; the
    bytes served are the same."""
    from cellar.transfer import tcp_server
    from cellar.transfer.spin_wait import NATIVE, SpinWait

    if not NATIVE:
        pytest.skip("the native spin helper is not built")
    waits: list[SpinWait] = []

    class Counted(SpinWait):
        def wait(self, sock: socket.socket) -> bool:
            waits.append(self)
            return super().wait(sock)

    monkeypatch.setattr(tcp_server, "SpinWait", Counted)
    assert TcpDataServer(access, "127.0.0.1", 0, spin_us=300,
                         ssl_context=ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                         ).spin_us == 0
    with pytest.raises(ValueError):
        TcpDataServer(access, "127.0.0.1", 0, spin_us=MAX_SPIN_US + 1)
    access.view[:4096] = os.urandom(4096)
    for spin_us, auth_timeout_s in ((0, None), (300, 5.0)):
        waits.clear()
        with TcpDataServer(access, "127.0.0.1", 0, spin_us=spin_us,
                           auth_timeout_s=auth_timeout_s) as srv:
            route = route_to(srv.address)
            t = TcpTransport(connections_per_node=1)
            try:
                for _ in range(5):
                    t.ping(srv.address, 1.0)  # a fresh connection each, no grant: no spin
                assert not waits
                for _ in range(20):
                    out = bytearray(4096)
                    assert t.read([rop(route, 0, out)], 5)[0].ok
                    assert bytes(out) == bytes(access.view[:4096])
            finally:
                t.close()
        assert bool(waits) is bool(spin_us)
        if spin_us:
            assert sum(w.hits for w in set(waits)) >= 1  # some request came within a window
