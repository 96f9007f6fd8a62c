"""Hostile bytes at a running TcpDataServer: it never crashes, keeps serving a well-behaved
client, and no stored byte changes without a valid grant.

The gate behind the server is the storage node's own: `NodeAccess` with a real `ObjectIndex`
(`TransferNode(index=ObjectIndex())`, tests/support/transfer_node.py) over an in-memory
segment, so a refusal here is the node's refusal. Everything here is bounded (a fixed seed, a few hundred connections, a short idle timeout).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cellar.proto.grant import key_tag, sign
from cellar.storage_node.index import ObjectIndex
from cellar.transfer.frame import (
    MAX_META_BYTES,
    OP_PING,
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_MAGIC,
    RESP_FLAG_CLOSE,
    RESPONSE,
    ST_BAD_FRAME,
    ST_BAD_GRANT,
    ST_OK,
    ST_OUT_OF_RANGE,
    ST_TOO_LARGE,
    ST_UNSUPPORTED,
    VERSION,
    WriteMeta,
    decode_response,
)
from cellar.transfer.tcp import TcpTransport
from cellar.transfer.tcp_server import TcpDataServer
from tests.support.sockets import recv_exactly
from tests.support.transfer_node import SECRET, SEGMENT_ID, TransferNode, rop, route_to, wop

_allocs = itertools.count(1 << 40)  # the well-behaved client's allocation ids, never reused


LIMIT = 1 << 20
GOOD_BYTES = 64 << 10  # the well-behaved client's region; fuzzers can never touch the rest
SEED = 20240611


def _digest(access: Any) -> bytes:
    return hashlib.blake2b(access.view[GOOD_BYTES:]).digest()


@pytest.fixture
def setup(caplog: pytest.LogCaptureFixture) -> Iterator[tuple[TcpDataServer, Any, bytes]]:
    caplog.set_level(logging.ERROR, logger="cellar.transfer")
    access = TransferNode(8 << 20, index=ObjectIndex())
    assert type(access.index) is ObjectIndex  # the node's own gate, index included
    access.view[:] = random.Random(SEED).randbytes(len(access.view))
    srv = TcpDataServer(access, "127.0.0.1", 0, max_frame_payload_bytes=LIMIT,
                        max_connections=64, idle_timeout_s=0.5)
    srv.start()
    yield srv, access, _digest(access)
    srv.stop()
    # no connection ever ended in an unexpected exception
    assert not [r for r in caplog.records if r.name.startswith("cellar.transfer")]


def _header(op: int = OP_WRITE, *, rid: int = 1, meta_len: int = 0, offset: int = 0,
            length: int = 0, magic: bytes = REQUEST_MAGIC, version: int = VERSION,
            mac: bytes = b"\0" * 16, goff: int = 0, glen: int = 0, tag: int = 0,
            expiry_ms: int = 0, segment_id: int = SEGMENT_ID) -> bytes:
    return REQUEST.pack(magic, version, op, 0, meta_len, rid, segment_id, goff, glen, 1, 1,
                        expiry_ms, tag, mac, offset, length)


def _connect(srv: TcpDataServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
    return s


def _response(s: socket.socket) -> tuple[int, int, int]:
    h = decode_response(recv_exactly(s, RESPONSE.size), max_payload_bytes=LIMIT)
    recv_exactly(s, h.msg_len)
    return h.status, h.request_id, h.flags


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1 << 16) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def _assert_healthy(srv: TcpDataServer, access: Any) -> None:
    route = route_to(f"127.0.0.1:{srv.port}")
    t = TcpTransport(connections_per_node=2, chunk_bytes=16 << 10)
    try:
        data = os.urandom(GOOD_BYTES)
        alloc = next(_allocs)
        assert all(r.ok for r in t.write([wop(route, 0, data, alloc=alloc)], 5))
        out = bytearray(GOOD_BYTES)
        assert all(r.ok for r in t.read([rop(route, 0, out, alloc=alloc)], 5))
        assert out == data
    finally:
        t.close()


def test_random_bytes_and_truncated_headers(setup: tuple[TcpDataServer, Any, bytes]) -> None:
    srv, access, digest = setup
    rng = random.Random(SEED)
    valid = _header(OP_WRITE, length=10)
    for i in range(150):
        s = _connect(srv)
        try:
            kind = i % 3
            if kind == 0:
                blob = rng.randbytes(rng.randrange(1, 5000))
            elif kind == 1:  # a plausible start, random rest
                blob = REQUEST_MAGIC + bytes([VERSION, rng.choice([1, 2, 3])]) + \
                    rng.randbytes(rng.randrange(0, 400))
            else:  # a valid header cut short
                blob = valid[:rng.randrange(0, REQUEST.size)]
            s.sendall(blob)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(2)
            while True:  # whatever it answers, it must end the connection
                try:
                    if not s.recv(1 << 16):
                        break
                except ConnectionResetError:
                    break
        finally:
            s.close()
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_bad_headers_get_a_closing_reply(setup: tuple[TcpDataServer, Any, bytes]) -> None:
    srv, access, digest = setup
    cases = [
        (_header(length=2**63), ST_TOO_LARGE),
        (_header(length=LIMIT + 1), ST_TOO_LARGE),
        (_header(meta_len=MAX_META_BYTES + 1), ST_TOO_LARGE),
        (_header(op=9), ST_BAD_FRAME),
        (_header(version=VERSION + 1), ST_UNSUPPORTED),
    ]
    for raw, status in cases:
        s = _connect(srv)
        try:
            s.sendall(raw + os.urandom(1000))
            st, rid, flags = _response(s)
            assert (st, rid, flags) == (status, 1, RESP_FLAG_CLOSE)
            assert _closed(s)
        finally:
            s.close()
    stats = srv.stats.snapshot()
    assert stats["requests"]["invalid"] == len(cases)
    assert sum(stats["errors"].values()) == len(cases)
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_bad_magic_after_valid_frames(setup: tuple[TcpDataServer, Any, bytes]) -> None:
    srv, access, digest = setup
    s = _connect(srv)
    try:
        s.sendall(_header(OP_PING, rid=1) + _header(OP_PING, rid=2) + b"GARBAGE!" * 20)
        assert _response(s) == (ST_OK, 1, 0)
        assert _response(s) == (ST_OK, 2, 0)
        st, rid, flags = _response(s)
        assert (st, rid, flags) == (ST_BAD_FRAME, 0, RESP_FLAG_CLOSE)
        assert _closed(s)
    finally:
        s.close()
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_refused_writes_are_drained_and_the_connection_lives(
        setup: tuple[TcpDataServer, Any, bytes]) -> None:
    srv, access, digest = setup
    now_ms = int(time.time() * 1000)
    real = sign(SECRET, op=OP_WRITE, segment_id=SEGMENT_ID, offset=GOOD_BYTES, length=1000,
                alloc_id=1, epoch=1, expiry_ms=now_ms + 60_000, tag=key_tag("t", "k"))
    meta = WriteMeta(0, 1000, "t", "k").pack()
    s = _connect(srv)
    try:
        # forged MAC, full payload at the frame limit: refused, payload drained
        s.sendall(_header(OP_WRITE, rid=1, meta_len=len(meta), offset=GOOD_BYTES, length=LIMIT,
                          goff=GOOD_BYTES, glen=LIMIT, mac=os.urandom(16)) + meta)
        s.sendall(os.urandom(LIMIT))
        assert _response(s)[:2] == (ST_BAD_GRANT, 1)
        # a real grant, but the frame reaches past it: the node enforces the range itself
        s.sendall(_header(OP_WRITE, rid=2, meta_len=len(meta), offset=GOOD_BYTES + 1,
                          length=1000, goff=real.offset, glen=real.length, mac=real.mac,
                          tag=real.key_tag, expiry_ms=real.expiry_ms) + meta + os.urandom(1000))
        assert _response(s)[:2] == (ST_OUT_OF_RANGE, 2)
        # a write without meta, and garbage meta
        s.sendall(_header(OP_WRITE, rid=3, length=10) + os.urandom(10))
        assert _response(s)[:2] == (ST_BAD_FRAME, 3)
        s.sendall(_header(OP_WRITE, rid=4, meta_len=30, length=10) + os.urandom(40))
        assert _response(s)[:2] == (ST_BAD_FRAME, 4)
        # reads with a forged grant return no payload; meta on a read is skipped
        s.sendall(_header(OP_READ, rid=5, length=100, meta_len=7) + b"ignored")
        assert _response(s)[:2] == (ST_BAD_GRANT, 5)
        s.sendall(_header(OP_PING, rid=6))
        assert _response(s) == (ST_OK, 6, 0)
        # the real grant with one MAC bit flipped, or stretched past what was signed, and every
        # other field right: only the MAC check stands between these bytes and the segment
        flipped = bytes([real.mac[0] ^ 1]) + real.mac[1:]
        for rid, glen, mac in ((7, real.length, flipped), (8, 2 * real.length, real.mac)):
            s.sendall(_header(OP_WRITE, rid=rid, meta_len=len(meta), offset=GOOD_BYTES,
                              length=1000, goff=real.offset, glen=glen, mac=mac,
                              tag=real.key_tag, expiry_ms=real.expiry_ms) + meta + os.urandom(1000))
            assert _response(s)[:2] == (ST_BAD_GRANT, rid)
    finally:
        s.close()
    assert not access.written_calls
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_random_well_formed_frames(setup: tuple[TcpDataServer, Any, bytes]) -> None:
    """Headers that decode, with random fields and forged grants; payloads as announced."""
    srv, access, digest = setup
    rng = random.Random(SEED + 1)
    s = _connect(srv)
    try:
        for rid in range(1, 301):
            op = rng.choice([OP_READ, OP_WRITE, OP_PING])
            length = rng.choice([0, 1, rng.randrange(LIMIT), LIMIT])
            meta = rng.randbytes(rng.choice([0, 5, 20, 60, MAX_META_BYTES]))
            if op == OP_WRITE and rng.random() < 0.5:
                meta = WriteMeta(rng.getrandbits(64), length, "t", "k" * rng.randrange(50)).pack()
            raw = _header(op, rid=rid, meta_len=len(meta), length=length,
                          offset=rng.getrandbits(rng.choice([8, 24, 64])),
                          goff=rng.getrandbits(24), glen=rng.getrandbits(24),
                          mac=rng.randbytes(16), expiry_ms=rng.getrandbits(64),
                          segment_id=rng.choice([SEGMENT_ID, rng.getrandbits(64)]))
            s.sendall(raw + meta)
            if op == OP_WRITE:
                s.sendall(b"\x5a" * length)
            st, got_rid, flags = _response(s)
            assert got_rid == rid and flags == 0
            assert (st == ST_OK) == (op == OP_PING)
    finally:
        s.close()
    assert not access.written_calls
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_peer_vanishing_mid_payload(setup: tuple[TcpDataServer, Any, bytes]) -> None:
    srv, access, digest = setup
    now_ms = int(time.time() * 1000)
    real = sign(SECRET, op=OP_WRITE, segment_id=SEGMENT_ID, offset=0, length=GOOD_BYTES,
                alloc_id=1, epoch=1, expiry_ms=now_ms + 60_000, tag=key_tag("t", "k"))
    meta = WriteMeta(0, GOOD_BYTES, "t", "k").pack()
    for cut in (0, 1, 1000, GOOD_BYTES - 1):
        s = _connect(srv)
        s.sendall(_header(OP_WRITE, meta_len=len(meta), offset=0, length=GOOD_BYTES,
                          goff=0, glen=GOOD_BYTES, mac=real.mac, tag=real.key_tag,
                          expiry_ms=real.expiry_ms) + meta + os.urandom(cut))
        s.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # all four accepted, served and closed
        st = srv.stats.snapshot()
        if st["connections_total"] == 4 and not st["active_connections"]:
            break
        time.sleep(0.01)
    assert not access.written_calls  # no partial write ever completes
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_slow_senders_are_dropped_and_others_served(
        setup: tuple[TcpDataServer, Any, bytes]) -> None:
    srv, access, digest = setup
    stop = threading.Event()
    slow = [_connect(srv) for _ in range(20)]

    def dribble(s: socket.socket, data: bytes) -> None:
        for b in data:
            if stop.wait(0.05):
                return
            try:
                s.send(bytes([b]))
            except OSError:
                return

    # half send nothing at all, half dribble a header one byte at a time
    threads = [threading.Thread(target=dribble, args=(s, _header(length=5)))
               for s in slow[10:]]
    for th in threads:
        th.start()
    _assert_healthy(srv, access)  # served while the slow ones hang around
    # the silent ten are dropped (idle_timeout_s); polled, with a deadline far above it
    deadline = time.monotonic() + 10
    while srv.stats.snapshot()["active_connections"] > 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.stats.snapshot()["active_connections"] <= 10
    assert all(th.is_alive() for th in threads)  # while the dribblers still dribble
    stop.set()
    for th in threads:
        th.join()
    for s in slow:
        s.close()
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_connection_flood_is_bounded(setup: tuple[TcpDataServer, Any, bytes]) -> None:
    srv, access, digest = setup
    socks = []
    try:
        for _ in range(100):  # over max_connections=64
            socks.append(_connect(srv))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            st = srv.stats.snapshot()
            assert st["active_connections"] <= 64
            if st["connections_total"] + st["connections_refused"] == 100:
                break
            time.sleep(0.01)
        # every connection was either served (within the limit) or refused
        assert st["connections_total"] + st["connections_refused"] == 100
        assert st["connections_refused"] > 0
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 5
    while srv.stats.snapshot()["active_connections"] and time.monotonic() < deadline:
        time.sleep(0.01)
    _assert_healthy(srv, access)
    assert _digest(access) == digest


def test_ping_on_random_struct_values(setup: tuple[TcpDataServer, Any, bytes]) -> None:
    """PING ignores every grant field, including garbage ones."""
    srv, _, _ = setup
    s = _connect(srv)
    try:
        raw = bytearray(_header(OP_PING, rid=77))
        struct.pack_into("<16s", raw, 76, os.urandom(16))
        s.sendall(bytes(raw))
        assert _response(s) == (ST_OK, 77, 0)
    finally:
        s.close()
