"""The native receive of READ replies (transfer/_replies.c through `Inbox.read_replies`), on
socketpairs: it takes exactly the replies the Python loop would accept, leaves every other one
for that loop byte-exact, and reports a closed stream, a kernel timeout and a passed deadline."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time

import pytest

from cellar.transfer import _sockio
from cellar.transfer._sockio import TIMEOUT_ERRORS, Inbox, PeerClosed, send_all, set_io_timeout
from cellar.transfer.frame import RESPONSE, pack_response
from cellar.transfer.tcp_plan import Desync, check_response

pytest.importorskip("cellar.transfer._replies", reason="the native helper is not built")

FAR = 1e12  # a deadline that never passes


def _pair(timeout_s: float = 5) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for s in (a, b):
        set_io_timeout(s, timeout_s)
    return a, b


def _inbox(sock: socket.socket, size: int = 4096) -> Inbox:
    inbox = Inbox(sock, size)
    assert inbox.native  # a plain socket and no outbox
    return inbox


def _send_in_pieces(sock: socket.socket, data: bytes, piece: int) -> threading.Thread:
    """Send `data` in `piece`-byte writes with pauses, so replies arrive split anywhere."""
    def run() -> None:
        for at in range(0, len(data), piece):
            send_all(sock, [memoryview(data)[at:at + piece]])
            time.sleep(0.0005)
    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("piece", [13, 1000, 70_000])
def test_a_run_of_ok_replies_lands_byte_exact(piece: int) -> None:
    a, b = _pair()
    sizes = [1, 27, 28, 4095, 4096, 4097, 65_536, 100_003] if piece > 100 else [1, 27, 28, 300]
    payloads = [os.urandom(n) for n in sizes]
    stream = b"".join(pack_response(0, 100 + i, n) + p
                      for i, (n, p) in enumerate(zip(sizes, payloads, strict=True)))
    sender = _send_in_pieces(a, stream, piece)
    inbox = _inbox(b)
    dests = [memoryview(bytearray(n)) for n in sizes]
    items = [(100 + i, d) for i, d in enumerate(dests)]
    done = 0
    while done < len(items):  # max_bytes cuts the run into calls, as the pump makes them
        got, error = inbox.read_replies(items[done:], FAR, 64 << 10)
        assert error is None and got >= 1
        done += got
    sender.join()
    assert [bytes(d) for d in dests] == payloads
    assert inbox.buffered == 0
    a.close()
    b.close()


def test_an_error_reply_is_left_to_the_python_loop_exactly_as_it_came() -> None:
    """OK, a refusal with its message, then OK: the run stops before the refusal; what the
    header read pulled into the refusal's destination goes back behind the header (and the
    destination is zeroed), so the Python loop reads the same header and message, and the run
    goes on after it."""
    a, b = _pair()
    first, last = os.urandom(5000), os.urandom(3000)
    refusal = pack_response(5, 2, 0, "grant expired")
    a.sendall(pack_response(0, 1, 5000) + first + refusal + pack_response(0, 3, 3000) + last)
    time.sleep(0.05)  # all of it buffered in the kernel: the header read scatters past it
    inbox = _inbox(b, 4096)
    d1, d2, d3 = (memoryview(bytearray(n)) for n in (5000, 2000, 3000))
    got, error = inbox.read_replies([(1, d1), (2, d2), (3, d3)], FAR, 1 << 20)
    assert (got, error) == (1, None) and bytes(d1) == first
    assert bytes(d2) == bytes(2000)  # nothing of the refusal or what follows stays there
    head, early = inbox.take_scatter(RESPONSE.size, d2)
    status, _flags, msg_len, length = check_response(head, 2, 2000, True)
    assert (status, length, early) == (5, 0, 0)
    assert bytes(inbox.take(msg_len)) == b"grant expired"
    got, error = inbox.read_replies([(3, d3)], FAR, 1 << 20)
    assert (got, error) == (1, None) and bytes(d3) == last
    a.close()
    b.close()


@pytest.mark.parametrize("header", [
    pack_response(0, 8, 4096),          # another request's reply
    pack_response(0, 7, 4095),          # not the size asked for
    RESPONSE.pack(b"CLRP", 1, 0, 0, 4, 7, 4096),  # an OK with a message
    b"CLRX" + pack_response(0, 7, 4096)[4:],  # bad magic
])
def test_any_other_header_stops_the_run_before_it(header: bytes) -> None:
    a, b = _pair()
    a.sendall(header + os.urandom(4096))
    inbox = _inbox(b)
    dest = memoryview(bytearray(b"\xaa" * 4096))
    assert inbox.read_replies([(7, dest)], FAR, 1 << 20) == (0, None)
    head, _ = inbox.take_scatter(RESPONSE.size, memoryview(bytearray(0)))
    assert bytes(head) == header[:RESPONSE.size]  # left unread, for the Python loop's checks
    with pytest.raises(Desync):
        check_response(head, 7, 4096, True)
    a.close()
    b.close()


def test_a_stream_that_ends_mid_payload_is_peer_closed() -> None:
    a, b = _pair()
    payload = os.urandom(10_000)
    a.sendall(pack_response(0, 1, 1000) + payload[:1000] + pack_response(0, 2, 10_000)
              + payload[:6000])
    a.close()
    inbox = _inbox(b)
    d1, d2 = memoryview(bytearray(1000)), memoryview(bytearray(10_000))
    got, error = inbox.read_replies([(1, d1), (2, d2)], FAR, 1 << 20)
    assert got == 1 and bytes(d1) == payload[:1000]
    assert isinstance(error, PeerClosed)
    b.close()


def test_a_kernel_timeout_and_a_passed_deadline_are_timeouts() -> None:
    a, b = _pair(timeout_s=0.05)
    inbox = _inbox(b)
    dest = memoryview(bytearray(100))
    started = time.monotonic()
    got, error = inbox.read_replies([(1, dest)], FAR, 1 << 20)  # nothing comes
    assert got == 0 and isinstance(error, TIMEOUT_ERRORS)
    assert time.monotonic() - started < 2
    a.sendall(pack_response(0, 1, 100) + bytes(100))
    got, error = inbox.read_replies([(1, dest)], time.monotonic() - 1, 1 << 20)
    assert got == 0 and isinstance(error, TimeoutError)
    assert inbox.read_replies([(1, dest)], FAR, 1 << 20) == (1, None)  # nothing was taken
    a.close()
    b.close()


def test_bad_arguments_are_refused_before_any_read() -> None:
    from cellar.transfer._replies import read_replies

    a, b = _pair()
    buf = bytearray(4096)
    dest = memoryview(bytearray(10))
    for args, error in [
        ((b.fileno(), buf, 10, 5, [(1, dest)], 0, 1), ValueError),       # start > end
        ((b.fileno(), buf, 0, 4097, [(1, dest)], 0, 1), ValueError),     # end past the inbox
        ((b.fileno(), bytearray(40), 0, 0, [(1, dest)], 0, 1), ValueError),  # inbox too small
        ((-1, buf, 0, 0, [(1, dest)], 0, 1), ValueError),
        ((b.fileno(), buf, 0, 0, [1], 0, 1), TypeError),                 # not (id, buffer)
        ((b.fileno(), buf, 0, 0, [(1, b"read-only")], 0, 1), BufferError),
        ((b.fileno(), bytes(4096), 0, 0, [(1, dest)], 0, 1), BufferError),  # read-only inbox
        ((b.fileno(), buf, 0, 0, [(-1, dest)], 0, 1), OverflowError),
    ]:
        with pytest.raises(error):
            read_replies(*args)  # type: ignore[arg-type]
    a.close()
    b.close()


def test_the_python_path_is_kept_where_native_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TLS socket (its records need OpenSSL), a server's inbox (it flushes its outbox
    before reads) and `$CELLAR_NATIVE_REPLIES=0` (NATIVE_REPLIES) receive in Python."""
    a, b = _pair()
    tls = ssl.create_default_context().wrap_socket(
        socket.socket(), server_hostname="node", do_handshake_on_connect=False)
    assert not Inbox(tls, 4096).native
    tls.close()
    assert not Inbox(b, 4096, outbox=_sockio.Outbox(b)).native
    monkeypatch.setattr(_sockio, "NATIVE_REPLIES", False)
    assert not Inbox(b, 4096).native
    a.close()
    b.close()
