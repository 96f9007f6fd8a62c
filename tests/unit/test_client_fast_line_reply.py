"""How the SDK reads a fast-line reply (client/rpc.py `_recv_reply`), against a scripted server
on a real loopback socket: a reply that arrives in pieces is put together whole, a reply that
arrives at once is taken in one read, and bytes past one reply mean the line is out of sync
(the call fails as a broken line, so the caller falls back to gRPC, and the connection is not
kept for the next call).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from cellar.client import rpc
from cellar.proto.fastline import FRAME


@contextmanager
def scripted_server(reply: Callable[[socket.socket], None]) -> Iterator[int]:
    """A one-connection server: reads one request frame, then runs `reply` on the socket."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            head = conn.recv(FRAME.size, socket.MSG_WAITALL)
            length, _method = FRAME.unpack(head)
            if length:
                conn.recv(length, socket.MSG_WAITALL)
            reply(conn)
            time.sleep(0.2)  # the client reads before the connection ends

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        thread.join(timeout=5)
        listener.close()


def test_a_reply_in_pieces_is_read_whole() -> None:
    body = bytes(range(256)) * 400  # 100 KiB: more than one first read takes

    def reply(conn: socket.socket) -> None:
        frame = FRAME.pack(len(body), 0) + body
        for cut in (3, FRAME.size + 10, 70_000, len(frame)):  # header split too
            conn.sendall(frame[:cut])
            frame = frame[cut:]
            time.sleep(0.02)
            if not frame:
                break

    with scripted_server(reply) as port:
        line = rpc._FastLine("127.0.0.1", port)
        try:
            assert line.call(1, b"request", 5.0) == (0, body)
        finally:
            line.close()


def test_an_error_reply_and_an_empty_body() -> None:
    def reply(conn: socket.socket) -> None:
        conn.sendall(FRAME.pack(0, 5))  # NOT_FOUND, no details

    with scripted_server(reply) as port:
        line = rpc._FastLine("127.0.0.1", port)
        try:
            assert line.call(1, b"", 5.0) == (5, b"")
        finally:
            line.close()


def test_bytes_past_the_reply_break_the_line() -> None:
    def reply(conn: socket.socket) -> None:
        conn.sendall(FRAME.pack(3, 0) + b"abc" + FRAME.pack(1, 0) + b"x")  # one reply too many

    with scripted_server(reply) as port:
        line = rpc._FastLine("127.0.0.1", port)
        try:
            with pytest.raises(rpc._FastLineDown, match="out of sync"):
                line.call(1, b"request", 5.0)
            assert line._idle == []  # that connection is not kept for the next call
        finally:
            line.close()


def test_work_meanwhile_runs_once_after_the_request_and_its_error_waits_for_the_reply() -> None:
    """Early reads (client/early_reads.py) run between a request and its reply: the request is
    on its way first (the server saw it before the work ended), the reply is still read and
    the connection kept, and an error of the work is raised by `outcome()`, not by the call."""
    seen: list[str] = []
    got_request = threading.Event()

    def reply(conn: socket.socket) -> None:
        got_request.set()
        time.sleep(0.05)
        conn.sendall(FRAME.pack(2, 0) + b"ok")

    def work() -> str:
        assert got_request.wait(5), "the request was not sent before the work ran"
        seen.append("ran")
        raise ValueError("the move failed")

    with scripted_server(reply) as port:
        line = rpc._FastLine("127.0.0.1", port)
        meanwhile = rpc.Meanwhile(work)
        try:
            assert line.call(1, b"request", 5.0, meanwhile=meanwhile) == (0, b"ok")
            assert len(line._idle) == 1  # in sync: kept for the next call
            with pytest.raises(ValueError, match="the move failed"):
                meanwhile.outcome()
            meanwhile()  # never twice
            assert seen == ["ran"]
        finally:
            line.close()
    assert rpc.Meanwhile(lambda: 7).outcome() == 7  # a call that never got to it: run now
