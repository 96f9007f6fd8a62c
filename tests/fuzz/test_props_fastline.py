"""The master's fast line (cellar.master.fastrpc) fed random byte streams over real sockets.

A FastRpcServer runs on its own event loop thread over a real MasterServicer and MasterService
(fuzzkit.seeded_servicer). Each example opens a connection, sends a random stream (random
bytes, or frames with random methods, declared lengths and bodies), half-closes and reads
until the server closes. Properties: the server always ends the exchange (no hang: EOF within
a few seconds), every reply it sends is a well-formed frame whose code is never INTERNAL, the
bytes it holds for bodies in flight return to zero, and a well-formed request on a fresh
connection is answered afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fuzzkit import TOKENS, authed, seeded_servicer
from hypothesis import given
from hypothesis import strategies as st

from cellar.master.serving.fastrpc import FastRpcServer
from cellar.proto import cellar_pb2 as pb
from cellar.proto.fastline import FRAME, METHODS

INTERNAL = grpc.StatusCode.INTERNAL.value[0]
REPLY = struct.Struct("<IB")
MAX_MESSAGE_BYTES = 64 << 10


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def fast(request: pytest.FixtureRequest) -> Iterator[tuple[int, FastRpcServer]]:
    # the master serves on uvloop when it is installed, else on asyncio's own loop: both
    loop = asyncio.new_event_loop() if request.param == "asyncio" else _uvloop().new_event_loop()
    server = FastRpcServer(seeded_servicer(), MAX_MESSAGE_BYTES, max_connections_per_peer=64,
                           idle_timeout_s=2.0, frame_timeout_s=1.0,
                           max_pending_bytes=MAX_MESSAGE_BYTES * 4)
    port = loop.run_until_complete(server.start("127.0.0.1"))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port, server
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _uvloop() -> Any:
    return pytest.importorskip("uvloop")


def _frames() -> st.SearchStrategy[bytes]:
    method = st.one_of(st.sampled_from(sorted(METHODS)), st.integers(0, 255))
    body = st.one_of(st.binary(max_size=512),
                     authed(pb.GetReplicasRequest).map(lambda m: m.SerializeToString()),
                     authed(pb.PutStartRequest).map(lambda m: m.SerializeToString()))
    declared = st.one_of(st.none(), st.integers(0, (1 << 32) - 1))
    frame = st.builds(
        lambda m, b, n: FRAME.pack(len(b) if n is None else n, m) + b, method, body, declared)
    return st.one_of(st.binary(max_size=64), st.lists(frame, max_size=4).map(b"".join))


def _exchange(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (a bad frame): fine
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _replies(data: bytes) -> list[int]:
    codes = []
    while len(data) >= REPLY.size:
        length, code = REPLY.unpack_from(data)
        assert len(data) - REPLY.size >= length, "a truncated reply frame"
        codes.append(code)
        data = data[REPLY.size + length:]
    assert not data, "trailing bytes that are not a reply frame"
    return codes


@given(_frames())
def test_random_streams_end_cleanly(fast: tuple[int, FastRpcServer], data: bytes) -> None:
    port, server = fast
    codes = _replies(_exchange(port, data))  # TimeoutError here would be a hang
    assert INTERNAL not in codes


def test_server_still_answers_and_holds_nothing(fast: tuple[int, FastRpcServer]) -> None:
    port, server = fast
    header = pb.RequestHeader(token=TOKENS["default"])
    body = pb.GetReplicasRequest(header=header, keys=["k1"]).SerializeToString()
    reply = _exchange(port, FRAME.pack(len(body), 4) + body)
    assert _replies(reply) == [0]
    assert server.pending_bytes == 0


@contextlib.contextmanager
def _tight_connection(port: int, server: FastRpcServer) -> Iterator[tuple[socket.socket, Any]]:
    """A client socket and the server's side of it, with small kernel buffers for the replies
    on both sides, so they back up into the server's own buffer after a few dozen KiB."""
    before = set(server._conns)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        deadline = time.monotonic() + 5
        while not set(server._conns) - before:
            assert time.monotonic() < deadline, "the server never saw the connection"
            time.sleep(0.01)
        (conn,) = set(server._conns) - before
        assert conn.transport is not None
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                                           32 << 10)
        yield sock, conn


def test_pipelined_requests_never_read_meanwhile_are_all_answered_in_order(
        fast: tuple[int, FastRpcServer]) -> None:
    """A client that sends thousands of requests before reading one reply: the server stops
    reading while its replies wait (bounded buffers, no deadlock), and once the client reads,
    every request is answered, in order, with nothing left reserved."""
    port, server = fast
    count = 20_000  # ~7 MB of requests, ~1.5 MB of replies
    frames = []
    for i in range(count):  # Exists: no pins to run out of; the key count tells replies apart
        body = pb.KeysRequest(header=pb.RequestHeader(token=TOKENS["default"]),
                              keys=[f"k{i % 3}"] * (60 + i % 5)).SerializeToString()
        frames.append(FRAME.pack(len(body), 6) + body)
    with _tight_connection(port, server) as (sock, conn):
        deadline = time.monotonic() + 5
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 << 10)
        sender = threading.Thread(target=sock.sendall, args=(b"".join(frames),))
        sender.start()
        # no reply is read: the server's reply buffer fills, it stops serving, then reading
        while not (conn.read_paused and conn.write_paused):
            assert time.monotonic() < deadline + 5, "the server kept reading"
            time.sleep(0.001)
        data = b""
        answered: list[int] = []
        while len(answered) < count:
            chunk = sock.recv(1 << 16)
            assert chunk, f"closed after {len(answered)} of {count} replies"
            data += chunk
            while len(data) >= REPLY.size:
                length, code = REPLY.unpack_from(data)
                if len(data) - REPLY.size < length:
                    break
                assert code == 0
                reply = pb.ExistsReply.FromString(data[REPLY.size:REPLY.size + length])
                answered.append(len(reply.statuses))
                data = data[REPLY.size + length:]
        sender.join(10)
    assert answered == [60 + i % 5 for i in range(count)]
    assert server.pending_bytes == 0


def test_a_half_closed_client_gets_every_answer_then_the_close(
        fast: tuple[int, FastRpcServer]) -> None:
    """Requests, then a half-close, before any reply is read: the end of the stream reaches
    the server while its replies still wait to drain; it answers every request anyway (as a
    server reading each request to the end of the stream did), then closes."""
    port, server = fast
    # ~50 KB of requests (under the read-ahead: all read at once, the end of the stream too),
    # ~0.8 MB of replies (more than the kernel's buffers and the server's drain bound hold)
    count = 800
    header = pb.RequestHeader(token=TOKENS["default"], client_id="half-close")
    body = pb.GetReplicasRequest(header=header, keys=["k1"] * 8).SerializeToString()
    with _tight_connection(port, server) as (sock, conn):
        deadline = time.monotonic() + 5
        sock.sendall((FRAME.pack(len(body), 4) + body) * count)
        sock.shutdown(socket.SHUT_WR)
        while not (conn.eof and conn.write_paused):
            assert time.monotonic() < deadline + 5, "the end of the stream came after the replies"
            time.sleep(0.001)
        data = b""
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    replies = []
    while data:
        length, code = REPLY.unpack_from(data)
        assert len(data) - REPLY.size >= length, f"reply {len(replies) + 1} was cut short"
        assert code == 0
        replies.append(pb.GetReplicasReply.FromString(data[REPLY.size:REPLY.size + length]))
        data = data[REPLY.size + length:]
    assert len(replies) == count
    pins = [r.pin_id for reply in replies for r in reply.results]
    assert len(pins) == 8 * count and all(pins)
    unpins = [pb.UnpinRequest(header=header, pin_ids=pins[i:i + 1000]).SerializeToString()
              for i in range(0, len(pins), 1000)]  # the module's servicer is shared: no pin left
    assert _replies(_exchange(port, b"".join(FRAME.pack(len(u), 5) + u for u in unpins))) == \
        [0] * len(unpins)
    assert server.pending_bytes == 0
