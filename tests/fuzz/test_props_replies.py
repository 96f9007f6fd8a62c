"""The native receive of READ replies (transfer/_replies.c) against the Python loop it stands in
for, over random reply streams: both take the same replies, land the same bytes, stop at the
same reply, and leave the same bytes unread behind it.

A stream is a run of replies, each mostly plausible (the OK reply the item waits for, or one
with another id, another size, a message, a refusal with its text, a bad magic) or raw noise,
sometimes cut short; it is sent whole and the sender's side shut, so the end of the stream is
an EOF. The Python side is the pump's loop for one-destination reads (`take_scatter`,
`check_response`, `read_into`), stopping where the pump would hand the reply to its error path.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from cellar.transfer._sockio import Inbox, PeerClosed, set_io_timeout
from cellar.transfer.frame import RESPONSE, RESPONSE_MAGIC, VERSION
from cellar.transfer.tcp_plan import Desync, check_response

pytest.importorskip("cellar.transfer._replies", reason="the native helper is not built")

FAR = 1e12
INBOX_BYTES = 256  # small, so headers straddle refills and scattered bytes get handed back


@st.composite
def _streams(draw: Any) -> tuple[list[tuple[int, int]], bytes]:
    """(the items a pump waits for: (request id, size)), the bytes the node sends)."""
    n = draw(st.integers(1, 6))
    items = [(100 + i, draw(st.integers(0, 3000))) for i in range(n)]
    out = b""
    for rid, size in items:
        kind = draw(st.sampled_from(["ok"] * 6 + ["rid", "size", "msg", "refusal", "magic",
                                                  "noise"]))
        payload = draw(st.binary(min_size=size, max_size=size)) if size else b""
        if kind == "ok":
            out += RESPONSE.pack(RESPONSE_MAGIC, VERSION, 0, 0, 0, rid, size) + payload
        elif kind == "rid":
            out += RESPONSE.pack(RESPONSE_MAGIC, VERSION, 0, 0, 0, rid + 1, size) + payload
        elif kind == "size":
            out += RESPONSE.pack(RESPONSE_MAGIC, VERSION, 0, 0, 0, rid, size + 1) + payload
        elif kind == "msg":
            out += RESPONSE.pack(RESPONSE_MAGIC, VERSION, 0, 0, 3, rid, size) + b"abc" + payload
        elif kind == "refusal":
            out += RESPONSE.pack(RESPONSE_MAGIC, VERSION, 5, 0, 7, rid, 0) + b"refused"
        elif kind == "magic":
            out += RESPONSE.pack(b"CLRX", VERSION, 0, 0, 0, rid, size) + payload
        else:
            out += draw(st.binary(max_size=64))
    if draw(st.booleans()):
        out = out[:draw(st.integers(0, len(out)))]  # the stream ends early
    return items, out


def _inbox(stream: bytes) -> tuple[socket.socket, Inbox]:
    a, b = socket.socketpair()
    set_io_timeout(b, 5)
    a.sendall(stream)
    a.shutdown(socket.SHUT_WR)
    a.close()
    return b, Inbox(b, INBOX_BYTES)


def _rest(sock: socket.socket, inbox: Inbox) -> bytes:
    """Every byte still unread: the inbox's, then the socket's to its EOF."""
    out = bytes(inbox.take(inbox.buffered)) if inbox.buffered else b""
    while chunk := sock.recv(1 << 16):
        out += chunk
    return out


def _python(items: list[tuple[int, int]], stream: bytes) -> tuple[int, str, list[bytes], bytes]:
    """The pump's Python loop: (replies taken, how it stopped, the destinations, unread bytes)."""
    sock, inbox = _inbox(stream)
    dests = [memoryview(bytearray(size)) for _, size in items]
    done, why, taken = 0, "all", b""
    try:
        for (rid, size), view in zip(items, dests, strict=True):
            head, early = inbox.take_scatter(RESPONSE.size, view)
            try:
                status = check_response(head, rid, size, True)[0]
            except Desync:
                status = -1
            if status != 0:  # the error path's: the header and what followed it, unread
                taken = bytes(head) + bytes(view[:early])
                why = "stopped"
                break
            inbox.read_into(view[early:])
            done += 1
    except PeerClosed:
        why = "closed"
    rest = taken + _rest(sock, inbox) if why != "closed" else b""
    sock.close()
    return done, why, [bytes(d) for d in dests], rest


@given(_streams(), st.sampled_from([1, 700, 1 << 30]))
def test_native_and_python_take_the_same_replies(case: tuple[list[tuple[int, int]], bytes],
                                                 max_bytes: int) -> None:
    items, stream = case
    sock, inbox = _inbox(stream)
    dests = [memoryview(bytearray(size)) for _, size in items]
    done, why = 0, "all"
    while done < len(items):
        got, error = inbox.read_replies(
            [(rid, d) for (rid, _), d in zip(items[done:], dests[done:], strict=True)],
            FAR, max_bytes)
        done += got
        if error is not None:
            assert isinstance(error, PeerClosed), error
            why = "closed"
            break
        if not got:
            why = "stopped"
            break
    rest = _rest(sock, inbox) if why != "closed" else b""
    sock.close()
    want_done, want_why, want_dests, want_rest = _python(items, stream)
    event(f"{why} after {done} of {len(items)}")
    assert (done, why) == (want_done, want_why)
    # the replies taken landed the same bytes; the one stopped at holds none of what came
    assert [bytes(d) for d in dests[:done]] == want_dests[:done]
    if why == "stopped":
        assert bytes(dests[done]) == bytes(len(dests[done]))
        assert rest == want_rest  # the same header, message and everything after
