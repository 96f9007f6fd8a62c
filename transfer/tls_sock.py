"""TLS on the TCP data plane: the endpoint flag, the contexts, and a socket the frame code can use.

What it owns: a node that serves its data port over TLS advertises its tcp endpoint as
`tls://HOST:PORT` (TLS_SCHEME); a client that sees that prefix speaks TLS to it, verifying the
node's certificate against the CA it was given (the one it already uses for the master) or, with
none, the system's trust store. It never falls back to plaintext: a client that cannot verify
the node gets ST_CONNECT_FAILED, and a client that does not know the prefix cannot even parse
the address. A plain `HOST:PORT` endpoint stays plaintext, exactly as fast as before: nothing
here runs on that path.

Why a socket subclass (`TlsSocket`, an `ssl.SSLSocket` made by our contexts through
`sslsocket_class`): the frame code (`_sockio.Inbox/Outbox`, tcp, control, tcp_async, the node's
server) calls `sendmsg`, `recvmsg_into` and `recv_into(..., MSG_WAITALL | MSG_DONTWAIT)`, which
an SSLSocket refuses. `TlsSocket` gives them the same meaning over TLS records, so one frame
code serves both and the plaintext path keeps its syscalls:
- `sendmsg(views)`: one TLS write of the leading views (small ones coalesced up to one record,
  TLS_RECORD_BYTES, so a header does not cost a record of its own); returns the bytes taken. On a
  non-blocking socket a write that would block is remembered and retried first with the same
  bytes, as OpenSSL requires, and BlockingIOError is raised meanwhile.
- `recv_into` / `recvmsg_into`: MSG_WAITALL loops; MSG_DONTWAIT reads with a zero timeout;
  later views of a recvmsg_into are filled only from bytes already decrypted (`pending()`),
  so the call never blocks after its first byte. SSLWantRead/WriteError become BlockingIOError
  (the asyncio transport waits for the fd as with a plain socket).
- `recv(n, MSG_PEEK | MSG_DONTWAIT)` (`_sockio.idle_alive`): TLS cannot peek, so this reads;
  it is only asked of a connection that must have nothing to read, where any byte means dead.
Timeouts: `_sockio.set_io_timeout` gives a TLS socket a Python timeout (the kernel's
SO_RCVTIMEO would surface as SSLWantReadError); a timeout raises TimeoutError as before, except
that a MSG_WAITALL read cut short after some bytes returns their count (as the kernel does), and
a timed-out write is retried first with the same bytes: a caller may go on after a timeout.

Contexts: TLS 1.2+, the server sends no session tickets (clients never resume: one handshake
per pooled connection). Import rule: standard library and cellar.transfer._sockio only.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from cellar.transfer._sockio import MSG_DONTWAIT, MSG_WAITALL, parse_address, tune_socket

TLS_SCHEME = "tls://"
# Plaintext bytes of one TLS record: small parts are coalesced up to this into one write.
TLS_RECORD_BYTES = 16 << 10
_WOULD_BLOCK = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


def is_tls_endpoint(address: str) -> bool:
    return address.startswith(TLS_SCHEME)


def tls_endpoint(address: str) -> str:
    """The advertised form of a TLS node's `HOST:PORT`."""
    return TLS_SCHEME + address


def split_endpoint(address: str) -> tuple[str, int, bool]:
    """'HOST:PORT' or 'tls://HOST:PORT' -> (host, port, tls); ValueError if malformed."""
    tls = address.startswith(TLS_SCHEME)
    host, port = parse_address(address[len(TLS_SCHEME):] if tls else address)
    return host, port, tls


class TlsSocket(ssl.SSLSocket):
    """An SSLSocket that also takes the calls the frame code makes (module docstring)."""

    _unsent: Any = None  # a write that would have blocked: retried first, with the same bytes

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        n = nbytes or len(buffer)
        if not flags:
            try:
                return super().recv_into(buffer, n)
            except _WOULD_BLOCK:
                raise BlockingIOError("TLS record incomplete") from None
        if flags & MSG_DONTWAIT:
            return self._read_now(memoryview(buffer)[:n])
        view = memoryview(buffer)[:n]
        pos = 0
        while pos < n:  # MSG_WAITALL
            try:
                got = self.recv_into(view[pos:])
            except (TimeoutError, BlockingIOError):
                if pos:  # as the kernel's: a timeout after some bytes returns their count
                    return pos
                raise
            if not got:
                break  # EOF: the caller sees the short count, then 0
            pos += got
        return pos

    def _read_now(self, view: memoryview) -> int:
        timeout = self.gettimeout()
        if timeout == 0.0 or self.pending():
            return self.recv_into(view, min(len(view), self.pending()) or None)
        self.settimeout(0.0)
        try:
            return self.recv_into(view)
        finally:
            self.settimeout(timeout)

    def recvmsg_into(self, buffers: Any, ancbufsize: int = 0,  # type: ignore[override]
                     flags: int = 0) -> tuple[int, list[Any], int, Any]:
        got = 0
        for buf in buffers:
            view = memoryview(buf)
            if not len(view):
                continue
            if not got or flags & MSG_WAITALL:
                n = self.recv_into(view, None, flags)
            else:
                ready = self.pending()  # decrypted already: never blocks
                if not ready:
                    break
                n = self.recv_into(view, min(ready, len(view)))
            got += n
            if n < len(view):
                break
        return got, [], 0, None

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        if not flags:
            return super().recv(buflen)
        buf = bytearray(buflen)
        n = self._read_now(memoryview(buf)) if flags & MSG_DONTWAIT else self.recv_into(buf)
        return bytes(buf[:n])

    def shutdown(self, how: int) -> None:
        """The TCP shutdown only: SSLSocket's also drops the TLS state, under the feet of a
        thread still reading (a node stopping its connections, a reply lingering)."""
        socket.socket.shutdown(self, how)

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0,  # type: ignore[override]
                address: Any = None) -> int:
        data = self._unsent
        if data is None:
            data = _coalesce(buffers)
        try:
            sent: int = self.write(data)
        except _WOULD_BLOCK:
            self._unsent = data
            raise BlockingIOError("TLS write would block") from None
        except TimeoutError:  # the caller may go on (tcp_server_io.py): the same bytes again
            self._unsent = data
            raise
        self._unsent = None
        return sent


def _coalesce(buffers: Sequence[Any]) -> Any:
    """The leading buffers as one write: the first as is when large, else up to one record of
    them copied together (only headers and small payload heads are ever copied)."""
    first = buffers[0]
    if len(buffers) == 1 or len(first) >= TLS_RECORD_BYTES:
        return first
    out = bytearray()
    for buf in buffers:
        room = TLS_RECORD_BYTES - len(out)
        if len(buf) >= room:
            out += memoryview(buf)[:room]
            break
        out += buf
    return out


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """Verifies a node against `ca_file` (None: the system's trust store), TLS 1.2+."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.sslsocket_class = TlsSocket
    return context


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A node's data port: its certificate, TLS 1.2+, no session tickets."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.num_tickets = 0
    context.sslsocket_class = TlsSocket
    return context


def dial(address: str, timeout_s: float, buffer_bytes: int,
         tls_context: ssl.SSLContext | None) -> socket.socket:
    """A connected blocking socket to a node's tcp endpoint, over TLS (handshake done) when
    the endpoint says so. Raises OSError / ValueError / TimeoutError (ssl.SSLError is an
    OSError: a certificate that does not verify fails like a refused connection)."""
    host, port, tls = split_endpoint(address)
    family, stype, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, stype, proto)
    try:
        tune_socket(sock, buffer_bytes)
        sock.settimeout(timeout_s)
        sock.connect(addr)
        if not tls:
            sock.settimeout(None)  # blocking from here on; set_io_timeout bounds each call
            return sock
        context = tls_context if tls_context is not None else client_context(None)
        # the timeout stays until the caller's set_io_timeout: it bounds the handshake too
        return context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def wrap_server(sock: socket.socket, context: ssl.SSLContext, timeout_s: float,
                wrapped: Callable[[socket.socket], None] | None = None) -> socket.socket:
    """A node's accepted connection after its TLS handshake (each read of it bounded by
    `timeout_s`). Raises OSError (ssl.SSLError) for a peer that does not speak TLS.
    `wrapped(tls)` is called before the handshake: wrapping detaches the plain socket, so
    whoever may have to cut the connection short meanwhile (the node's eviction of a
    connection that has not proved a grant) must hold the TLS socket from then on."""
    sock.settimeout(timeout_s)
    tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    try:
        if wrapped is not None:
            wrapped(tls)
        tls.do_handshake()
    except BaseException:
        tls.close()  # it holds the connection's descriptor now (wrap_socket closed it so)
        raise
    return tls
