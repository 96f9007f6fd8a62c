"""The TCP data server releases every transfer it admitted (storage_node/inflight.py), on
every path: done, refused, the peer gone mid-payload or mid-reply, a grant that expires
before its transfer ends (the connection is closed then, the kernel timeouts lowered)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from cellar.storage_node.index import ObjectIndex
from cellar.transfer.frame import (
    OP_READ,
    OP_WRITE,
    RESPONSE,
    ST_BAD_GRANT,
    ST_OK,
    RequestHeader,
    WriteMeta,
    decode_response,
)
from cellar.transfer.tcp_server import TcpDataServer
from tests.support.sockets import recv_exactly
from tests.support.transfer_node import SEGMENT_ID, TENANT, TransferNode, grant

SIZE = 8 << 20  # over what the kernel buffers for a reader that stops reading
WAIT_S = 10.0   # the most a test waits for the server's thread to see what happened


@pytest.fixture
def node() -> Iterator[tuple[TransferNode, ObjectIndex, tuple[str, int]]]:
    index = ObjectIndex()
    access = TransferNode(index=index)
    server = TcpDataServer(access, "127.0.0.1", 0, socket_buffer_bytes=1 << 20)
    server.start()
    yield access, index, ("127.0.0.1", server.port)
    server.stop()


def write_frame(key: str, alloc: int, *, ttl_ms: int = 600_000, meta_key: str = "") -> bytes:
    g = grant(OP_WRITE, 0, SIZE, key, alloc=alloc, ttl_ms=ttl_ms)
    meta = WriteMeta(0, SIZE, TENANT, meta_key or key).pack()
    return RequestHeader(OP_WRITE, 1, SEGMENT_ID, 0, SIZE, len(meta), grant=g).pack() + meta


def read_frame(key: str, alloc: int, *, ttl_ms: int = 600_000) -> bytes:
    g = grant(OP_READ, 0, SIZE, key, alloc=alloc, ttl_ms=ttl_ms)
    return RequestHeader(OP_READ, 2, SEGMENT_ID, 0, SIZE, grant=g).pack()


def status_of(sock: socket.socket) -> int:
    reply = decode_response(recv_exactly(sock, RESPONSE.size), max_payload_bytes=SIZE)
    sock.recv(reply.msg_len, socket.MSG_WAITALL) if reply.msg_len else None
    return reply.status


def released(index: ObjectIndex, alloc: int) -> bool:
    deadline = time.monotonic() + WAIT_S
    while index.in_flight(alloc) and time.monotonic() < deadline:
        time.sleep(0.01)
    return index.in_flight(alloc) == 0


def stalled_reader(address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address)
    return sock


def seal(address: tuple[str, int], key: str, alloc: int) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(write_frame(key, alloc) + b"v" * SIZE)
        assert status_of(sock) == ST_OK


def test_a_write_is_released_when_done_refused_or_its_peer_goes(node) -> None:  # type: ignore[no-untyped-def]
    _, index, address = node
    seal(address, "done", 11)
    assert index.in_flight(11) == 0
    with socket.create_connection(address) as sock:  # refused: never held
        sock.sendall(write_frame("other", 12, meta_key="not-the-grants") + b"x" * SIZE)
        assert status_of(sock) == ST_BAD_GRANT
    assert index.in_flight(12) == 0
    with socket.create_connection(address) as sock:  # the peer goes mid-payload
        sock.sendall(write_frame("gone", 13) + b"x" * (SIZE // 2))
        deadline = time.monotonic() + WAIT_S
        while not index.in_flight(13) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert index.in_flight(13) == 1
    assert released(index, 13)


def test_a_write_whose_grant_expires_mid_payload_is_cut_and_released(node) -> None:  # type: ignore[no-untyped-def]
    _, index, address = node
    with socket.create_connection(address) as sock:
        sock.settimeout(WAIT_S)
        sock.sendall(write_frame("slow", 21, ttl_ms=1500) + b"x" * (SIZE // 2))
        assert sock.recv(1) == b""  # closed by the node, the payload never finished
    assert released(index, 21)
    entry = index.get(21)
    assert entry is not None and entry.received_bytes == 0


def test_a_read_is_released_once_its_reply_left_or_its_reader_went(node) -> None:  # type: ignore[no-untyped-def]
    _, index, address = node
    seal(address, "obj", 31)
    with socket.create_connection(address) as sock:  # a reply taken whole
        sock.sendall(read_frame("obj", 31))
        assert status_of(sock) == ST_OK
        got = sock.recv(SIZE, socket.MSG_WAITALL)
        assert len(got) == SIZE
    assert released(index, 31)
    with stalled_reader(address) as sock:  # a reader that stops reading, then goes
        sock.sendall(read_frame("obj", 31))
        deadline = time.monotonic() + WAIT_S
        while not index.in_flight(31) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert index.in_flight(31) == 1  # the reply waits on the reader
    assert released(index, 31)


def test_a_read_whose_grant_expires_before_its_reply_left_is_cut_and_released(node) -> None:  # type: ignore[no-untyped-def]
    _, index, address = node
    seal(address, "obj", 41)
    with stalled_reader(address) as sock:
        sock.sendall(read_frame("obj", 41, ttl_ms=1500))
        # never read: the node closes the connection once the grant is past
        assert released(index, 41)
        assert index.get(41) is not None  # the object itself is untouched
