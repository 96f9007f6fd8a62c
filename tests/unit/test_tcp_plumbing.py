"""Socket plumbing and pure helpers of the TCP transport, on socketpairs (no server)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from xxhash import xxh3_64, xxh3_64_intdigest

import cellar.transfer.tcp_plan as tcp_plan
import cellar.transfer.tcp_reads as tcp_reads
from cellar.proto.grant import Grant
from cellar.transfer import available_transports, make_transport
from cellar.transfer._sockio import (
    Inbox,
    Outbox,
    PeerClosed,
    parse_address,
    send_all,
    set_io_timeout,
)
from cellar.transfer.base import byte_view
from cellar.transfer.frame import OP_READ, OP_WRITE
from cellar.transfer.tcp import TcpTransport, _Pool
from cellar.transfer.tcp_async import AsyncTcpTransport
from cellar.transfer.tcp_plan import Chunk, Plan, deal


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for s in (a, b):  # blocking mode with kernel timeouts, as the transport runs them
        set_io_timeout(s, 5)
    return a, b


def test_inbox_take_read_into_skip() -> None:
    a, b = _pair()
    data = os.urandom(300_000)
    t = threading.Thread(target=send_all, args=(a, [memoryview(data)]))
    t.start()
    inbox = Inbox(b, 4096)
    assert bytes(inbox.take(10)) == data[:10]
    assert bytes(inbox.take(4096)) == data[10:4106]  # compacts to fit exactly the buffer
    dst = bytearray(100_000)
    inbox.read_into(memoryview(dst))
    assert dst == data[4106:104_106]
    inbox.skip(150_000)
    rest = bytearray(len(data) - 254_106)
    inbox.read_into(memoryview(rest))
    assert rest == data[254_106:]
    t.join()
    with pytest.raises(ValueError):
        inbox.take(4097)
    a.close()
    with pytest.raises(PeerClosed):
        inbox.take(1)
    b.close()


def test_inbox_read_ahead_of_payload_keeps_the_stream_in_order() -> None:
    """Payload reads that also pull in what follows them (a storage node's WRITEs): every
    byte still comes out exactly once, in order, whether or not it had arrived yet."""
    a, b = _pair()
    frames = [(os.urandom(40), os.urandom(n)) for n in (1, 5000, 65536, 70_000, 3, 200_000)]
    stream = b"".join(h + p for h, p in frames)

    def trickle() -> None:  # in pieces, so some reads find the payload only partly there
        for pos in range(0, len(stream), 50_000):
            a.sendall(stream[pos:pos + 50_000])
            time.sleep(0.005)

    t = threading.Thread(target=trickle)
    t.start()
    inbox = Inbox(b, 4096, readahead=1024, read_ahead_of_payload=True)
    for head, payload in frames:
        assert bytes(inbox.take(len(head))) == head
        dst = bytearray(len(payload))
        inbox.read_into(memoryview(dst))
        assert dst == payload
    t.join()
    assert inbox.buffered == 0
    a.close()
    with pytest.raises(PeerClosed):
        inbox.read_into(memoryview(bytearray(1)))
    b.close()


def test_inbox_eof_mid_payload() -> None:
    a, b = _pair()
    a.sendall(b"x" * 10)
    a.close()
    inbox = Inbox(b, 64)
    with pytest.raises(PeerClosed):
        inbox.read_into(memoryview(bytearray(11)))
    b.close()


def test_send_all_many_views_and_partial_sends() -> None:
    a, b = _pair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    parts = [os.urandom(n) for n in (1, 0, 5000, 70_000, 3)] * 300  # > MAX_IOV buffers
    total = sum(map(len, parts))
    got = bytearray()

    def reader() -> None:
        while len(got) < total:
            time.sleep(0.0005)  # slow reader: forces partial sendmsg
            got.extend(b.recv(1 << 16))

    t = threading.Thread(target=reader)
    t.start()
    assert send_all(a, [memoryview(p) for p in parts]) == total
    t.join()
    assert got == b"".join(parts)
    a.close()
    b.close()


@pytest.mark.parametrize(("address", "expected"), [
    ("127.0.0.1:80", ("127.0.0.1", 80)),
    ("node-1.example:65535", ("node-1.example", 65535)),
    ("[::1]:9000", ("::1", 9000)),
])
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["", "host", "host:", ":80", "host:0", "host:70000",
                                     "host:-1", "host:http"])
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(ValueError):
        parse_address(address)


def _chunks(sizes: list[int]) -> list[Chunk]:
    g = Grant(1, 1, 0, 1 << 30, 1, 1, 1, 1, b"m" * 16)
    return [(i, 0, (memoryview(bytearray(n)),), n, g) for i, n in enumerate(sizes)]


def test_deal_balances_bytes_and_keeps_order() -> None:
    chunks = _chunks([100] * 10 + [1000] + [100] * 10)
    lanes = deal(chunks, 4)
    assert sorted(c[0] for lane in lanes for c in lane) == list(range(21))
    for lane in lanes:
        assert [c[0] for c in lane] == sorted(c[0] for c in lane)
    loads = [sum(c[3] for c in lane) for lane in lanes]
    assert max(loads) - min(loads) <= 1000
    assert deal(chunks, 1) == [chunks]


def test_byte_view_flattens_and_checks() -> None:
    import numpy as np

    arr = np.zeros((4, 8), dtype=np.float32)
    v = byte_view(arr, writable=True)
    assert v.format == "B" and len(v) == arr.nbytes
    with pytest.raises(ValueError):
        byte_view(arr[:, ::2], writable=True)
    with pytest.raises(ValueError):
        byte_view(b"readonly", writable=True)
    assert len(byte_view(b"readonly", writable=False)) == 8


def test_pool_bounds_and_waits() -> None:
    pool = _Pool("h:1", 2)
    got = pool.acquire(5, time.monotonic() + 1)
    assert got == [None, None] and pool.total == 2
    assert pool.acquire(1, time.monotonic() + 0.05) == []  # full: times out, holds nothing
    released = threading.Timer(0.05, pool.release_slot)
    released.start()
    assert pool.acquire(3, time.monotonic() + 2) == [None]  # woken by the release
    pool.drop_idle(closing=True)
    assert pool.acquire(1, time.monotonic() + 1) is None


def test_make_transport() -> None:
    assert "tcp" in available_transports()
    t = make_transport("tcp", connections_per_node=2)
    assert isinstance(t, TcpTransport) and t.name == "tcp" and t.connections_per_node == 2
    t.close()
    with pytest.raises(ValueError, match="available: rdma, shm, tcp"):
        make_transport("carrier-pigeon")
    with pytest.raises(ValueError):
        TcpTransport(chunk_bytes=0)


def test_outbox_flushes_before_the_inbox_blocks_or_ends() -> None:
    a, b = _pair()
    outbox = Outbox(b, max_bytes=1 << 20)
    inbox = Inbox(b, 4096, outbox=outbox)
    a.sendall(b"r1r2")
    assert bytes(inbox.take(2)) == b"r1"
    outbox.add(b"reply1")
    assert bytes(inbox.take(2)) == b"r2"  # buffered: no recv, nothing flushed yet
    outbox.add(b"reply2", memoryview(b"+payload"))
    assert outbox.parts
    a.sendall(b"r3")
    assert bytes(inbox.take(2)) == b"r3"  # data was ready: still corked
    assert outbox.parts
    t = threading.Timer(0.1, a.sendall, args=(b"r4",))
    t.start()
    assert bytes(inbox.take(2)) == b"r4"  # had to block: flushed first
    t.join()
    assert a.recv(100) == b"reply1reply2+payload"
    outbox.add(b"last")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerClosed):
        inbox.take(1)
    assert a.recv(100) == b"last"  # the peer stopped sending, still got its reply
    a.close()
    b.close()


def test_outbox_bounds() -> None:
    a, b = _pair()
    outbox = Outbox(b, max_bytes=10, max_parts=3)
    outbox.add(b"12345")
    outbox.add(b"1234")
    assert outbox.parts
    outbox.add(b"x")  # 10 bytes: sent
    assert not outbox.parts and a.recv(100) == b"123451234x"
    a.close()
    b.close()


def test_lanes_policy() -> None:
    t = TcpTransport(connections_per_node=4, chunk_bytes=4 << 20, min_stripe_bytes=8 << 20,
                     read_connections_per_node=2)
    mib = 1 << 20
    w, r = OP_WRITE, OP_READ
    assert t._lanes(1, 64 * mib, w) == 1                # one frame: nothing to stripe
    assert t._lanes(128, 128 * (64 << 10), w) == 1      # small frames: CPU-bound, one lane
    assert t._lanes(16, 16 * 4 * mib, w) == 4           # large frames: striped
    assert t._lanes(16, 16 * 4 * mib, r) == 2           # reads: read_connections_per_node
    assert t._lanes(512, 2048 * mib, r) == 4            # ...up to READ_FEW_LANES_MAX_BYTES
    assert t._lanes(16, 16 * 4 * mib, r, "127.0.0.1:7000") == 2
    assert t._lanes(16, 16 * 4 * mib, r, "tls://127.0.0.1:7000") == 4  # TLS: as writes
    assert t._lanes(4, 16 * mib, w) == 2                # at most one lane per min_stripe_bytes
    assert t._lanes(2, 8 * mib, w) == 1
    t0 = TcpTransport(connections_per_node=4, chunk_bytes=64 << 10, min_stripe_bytes=0)
    assert t0._lanes(3, 3 * (64 << 10), w) == 3
    assert t0._lanes(100, 100 * (64 << 10), w) == 4


def test_read_lanes_follow_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a read stripes over one lane per READ_LANE_CPUS CPUs, within the pool."""
    for cpus, lanes in ((1, 1), (2, 1), (4, 2), (8, 4), (64, 4)):
        monkeypatch.setattr(tcp_plan, "usable_cpus", lambda cpus=cpus: cpus)
        assert TcpTransport(connections_per_node=4).read_connections_per_node == lanes
        assert AsyncTcpTransport(connections_per_node=4).read_connections_per_node == lanes
    with pytest.raises(ValueError):
        TcpTransport(connections_per_node=2, read_connections_per_node=3)
    with pytest.raises(ValueError):
        TcpTransport(read_connections_per_node=0)


def test_read_into_hashed_hashes_what_landed() -> None:
    """A payload received piece by piece and hashed as each lands (the bytes already taken
    into the destination included) has the digest of the whole, and the stream stays in step."""
    a, b = _pair()
    inbox = Inbox(b, 64)
    payload = os.urandom(300_001)
    sender = threading.Thread(target=send_all,
                              args=(a, [memoryview(b"HDR1" + payload + b"NEXT")]))
    sender.start()
    dst = memoryview(bytearray(len(payload)))
    head, early = inbox.take_scatter(4, dst)
    assert bytes(head) == b"HDR1"
    digest = xxh3_64()
    inbox.read_into_hashed(dst, early, 65536, digest)
    assert digest.intdigest() == xxh3_64_intdigest(payload)
    assert bytes(dst) == payload
    assert bytes(inbox.take(4)) == b"NEXT"
    sender.join()
    a.close()
    b.close()


def test_take_scatter_and_unread() -> None:
    a, b = _pair()
    inbox = Inbox(b, 64)
    payload = os.urandom(1000)
    a.sendall(b"HDR1" + payload + b"HDR2msg!HDR3")
    dst = memoryview(bytearray(1000))
    head, early = inbox.take_scatter(4, dst)
    assert bytes(head) == b"HDR1" and 0 < early <= 64  # no more than the inbox could take back
    assert bytes(dst[:early]) == payload[:early]
    inbox.read_into(dst[early:])
    assert bytes(dst) == payload
    # an "error reply": what landed in dst was not payload, hand it back
    dst2 = memoryview(bytearray(100))
    time.sleep(0.05)
    head, early = inbox.take_scatter(4, dst2)
    assert bytes(head) == b"HDR2" and bytes(dst2[:early]) == b"msg!HDR3"
    inbox.unread(dst2[:early])
    assert bytes(inbox.take(4)) == b"msg!"
    assert bytes(inbox.take(4)) == b"HDR3"
    # header already buffered: nothing is scattered
    a.sendall(b"HDR4HDR5")
    assert bytes(inbox.take(4)) == b"HDR4"
    head, early = inbox.take_scatter(4, dst2)
    assert bytes(head) == b"HDR5" and early == 0
    inbox.unread(memoryview(b"x" * 10))
    assert bytes(inbox.take(10)) == b"x" * 10
    with pytest.raises(ValueError):
        inbox.unread(memoryview(b"x" * 65))
    a.close()
    b.close()


def test_check_response_matches_a_reply_to_its_request_or_desyncs() -> None:
    """Both TCP clients match replies with tcp_plan.check_response (one source of the rule)."""
    from cellar.proto.receipt import RECEIPT_BYTES
    from cellar.transfer.frame import RESPONSE, pack_response
    from cellar.transfer.tcp_plan import Desync, check_response

    ok_read = pack_response(0, 7, 4096)
    assert check_response(ok_read, 7, 4096, True) == (0, 0, 0, 4096)
    assert check_response(pack_response(0, 7), 7, 4096, False) == (0, 0, 0, 0)
    # a write's OK that completed the allocation carries its receipt, and only that
    assert check_response(pack_response(0, 7, RECEIPT_BYTES), 7, 16, False) == \
        (0, 0, 0, RECEIPT_BYTES)
    refused = pack_response(5, 7, 0, "no")
    status, _flags, msg_len, _ = check_response(refused[:RESPONSE.size], 7, 4096, True)
    assert status == 5 and msg_len == 2
    bad = [
        (ok_read, 8, 4096, True, "expected 8"),                 # another request's reply
        (ok_read, 7, 4095, True, "response over the limits|response length"),
        (pack_response(0, 7, 4096), 7, 4096, False, "over the limits"),  # a write's OK
        (pack_response(0, 7, RECEIPT_BYTES - 1), 7, 4096, False, "response length"),
        (pack_response(5, 7, 16), 7, 4096, True, "error response with a payload"),
        (b"\0" * len(ok_read), 7, 4096, True, "bad response header"),
        (RESPONSE.pack(b"CLRP", 1, 0, 0, 2, 7, 4096), 7, 4096, True, "OK response with a"),
    ]
    for head, rid, size, is_read, why in bad:
        with pytest.raises(Desync, match=why):
            check_response(head, rid, size, is_read)


def test_a_multi_frame_read_is_hashed_only_when_one_lane_had_every_frame() -> None:
    """`tcp_reads.receive_payload`: frames of one op received in order give the op's checksum
    at its last frame; a run that misses a frame (another lane had it) gives none, so the
    caller hashes the op itself."""
    a, b = _pair()
    inbox = Inbox(b, 64)
    frame_bytes = 100_000
    payload = os.urandom(3 * frame_bytes)
    first = 4096
    sender = threading.Thread(target=send_all, args=(a, [memoryview(payload + payload)]))
    sender.start()
    dst = memoryview(bytearray(len(payload)))

    def plan() -> Plan:
        p = Plan([None], [b""], [False], [None], [b""])
        p.spans[0] = (first, first + len(payload))
        return p

    whole = plan()
    for k in range(3):  # every frame, in order: hashed as they land
        piece = dst[k * frame_bytes:(k + 1) * frame_bytes]
        tcp_reads.receive_payload(inbox, piece, 0, 0, first + k * frame_bytes, whole)
        assert whole.sums[0] is None if k < 2 else whole.sums[0] == xxh3_64_intdigest(payload)
    assert bytes(dst) == payload and not whole.runs
    gap = plan()
    for k in (0, 2):  # the middle frame went to another lane: no checksum from this one
        piece = dst[k * frame_bytes:(k + 1) * frame_bytes]
        tcp_reads.receive_payload(inbox, piece, 0, 0, first + k * frame_bytes, gap)
        if k == 0:
            inbox.skip(frame_bytes)  # the other lane's frame, as far as this stream goes
    assert gap.sums[0] is None and not gap.runs
    assert bytes(dst[2 * frame_bytes:]) == payload[2 * frame_bytes:]
    sender.join()
    a.close()
    b.close()
