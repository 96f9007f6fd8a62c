"""Socket plumbing shared by the TCP client and server: buffered frame reads, gathered sends.

Payload bytes never become Python `bytes` objects here. `Inbox` reads small things (headers,
meta, error messages) through one preallocated per-connection buffer, so a pipelined stream of
small frames costs one `recv_into` for many of them; a payload goes to its destination with
`recv_into` on the destination memoryview itself, except for the few bytes that a header read
already pulled into the buffer (at most `Inbox` size, copied once). `send_all` writes a list
of memoryviews with `sendmsg`, so header, meta and payload leave in one syscall without being
concatenated.

Every read is bounded: `take(n)` refuses n larger than the buffer, and callers check lengths
against the frame limits before asking.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xxhash import xxh3_64

if TYPE_CHECKING:
    from cellar.transfer.spin_wait import SpinWait

try:  # the native helper (setup.py builds it when a C compiler is there)
    from cellar.transfer._replies import read_replies as _read_replies
except ImportError:  # pragma: no cover - depends on the install
    _read_replies = None
# `$CELLAR_NATIVE_REPLIES=0` receives READ replies in Python even with the helper built (the
# fallback's tests, and A/B measurements).
NATIVE_REPLIES = _read_replies is not None and os.environ.get("CELLAR_NATIVE_REPLIES") != "0"
MAX_DEADLINE_S = 9e9  # a later deadline (or none: inf) is this one, within int64 ns

Buffer = bytes | bytearray | memoryview

# Plain ints: the socket module's flags are IntFlag members, and OR-ing those per call is slow.
MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
MSG_WAITALL = int(socket.MSG_WAITALL)
MSG_PEEK = int(socket.MSG_PEEK)

# sendmsg takes at most IOV_MAX (1024 on Linux) buffers per call; stay well below.
MAX_IOV = 512
# Queued replies that a receive in the middle of a payload lets leave (Inbox._recv_into).
# Below the TCP client's refill point (half of its 64-frame window), so a writer always gets
# replies before it waits for them.
PAYLOAD_FLUSH_PARTS = 16


class PeerClosed(ConnectionError):
    """The peer closed the stream (EOF) where more bytes were due."""


# Sockets stay in blocking mode (no Python-level timeout, which would add a poll() before
# every recv/send) and get kernel timeouts instead: SO_RCVTIMEO / SO_SNDTIMEO. A call that
# times out then raises BlockingIOError (EAGAIN); both it and TimeoutError mean "timed out".
TIMEOUT_ERRORS = (TimeoutError, BlockingIOError)


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Bound every later recv/send on `sock` by `seconds` (>= 1 ms; 0 would mean forever).
    A TLS socket (`tls_sock`) gets a Python timeout instead: OpenSSL would report the kernel's
    as a want-read error, and it only polls once a record is incomplete."""
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(max(seconds, 1e-3))
        return
    us = max(int(seconds * 1e6), 1000)
    tv = struct.pack("ll", us // 1_000_000, us % 1_000_000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def tune_socket(sock: socket.socket, buffer_bytes: int) -> None:
    """TCP_NODELAY, and big kernel buffers when asked (set before connect/listen, so the
    window scale negotiated in the handshake can use them)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer_bytes > 0:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)
            except OSError:
                pass  # the kernel caps it; autotuning still applies


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); ValueError if malformed."""
    host, sep, port_s = address.rpartition(":")
    if not sep or not host or not port_s.isdigit():
        raise ValueError(f"bad address {address!r}: want host:port")
    port = int(port_s)
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def send_all(sock: socket.socket, parts: Sequence[Buffer]) -> int:
    """Send every byte of `parts` (byte-format buffers) with as few `sendmsg` calls as the
    kernel allows; returns the byte count. Partial sends resume where they stopped."""
    views = [p if isinstance(p, memoryview) else memoryview(p) for p in parts if len(p)]
    total = sum(len(v) for v in views)
    while views:
        advance_views(views, sock.sendmsg(views[:MAX_IOV]))
    return total


def idle_alive(sock: socket.socket) -> bool:
    """Whether an idle connection is still usable: it must have nothing to read, so EOF or
    stray bytes mean it is dead (e.g. the node restarted while it sat in a pool). One
    non-blocking syscall."""
    try:
        sock.recv(1, MSG_PEEK | MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def advance_views(views: list[memoryview], done: int) -> None:
    """Drop the first `done` bytes from a list of views in place (fully used views leave the
    list, a partly used one is trimmed): the bookkeeping of a partial sendmsg/recvmsg_into."""
    k = 0
    while done and k < len(views):
        n = len(views[k])
        if done >= n:
            done -= n
            k += 1
        else:
            views[k] = views[k][done:]
            done = 0
    del views[:k]


class Outbox:
    """Corked replies: parts queue up and leave together in one `sendmsg` when flushed.

    The owner flushes before it could block on a read (Inbox does this for it), and `add`
    flushes on its own once `max_bytes` or `max_parts` are queued, so nothing waits long and
    memory held by queued views stays bounded.
    """

    __slots__ = ("_sock", "parts", "nbytes", "max_bytes", "max_parts", "before_send")

    def __init__(self, sock: socket.socket, *, max_bytes: int = 1 << 20,
                 max_parts: int = MAX_IOV // 2,
                 before_send: Callable[[], None] | None = None) -> None:
        self._sock = sock
        # Called before queued replies leave (a storage node makes writes durable there).
        self.before_send = before_send
        self.parts: list[Buffer] = []
        self.nbytes = 0
        self.max_bytes = max_bytes
        self.max_parts = max_parts

    def add(self, part: Buffer, payload: Buffer | None = None) -> None:
        self.parts.append(part)
        self.nbytes += len(part)
        if payload is not None:
            self.parts.append(payload)
            self.nbytes += len(payload)
        if self.nbytes >= self.max_bytes or len(self.parts) >= self.max_parts:
            self.flush()

    def flush(self) -> None:
        if self.parts:
            if self.before_send is not None:
                self.before_send()
            parts, self.parts, self.nbytes = self.parts, [], 0
            self._send(parts)

    def _send(self, parts: list[Buffer]) -> None:
        """Send the flushed `parts` (a server's outbox bounds this by deadlines)."""
        send_all(self._sock, parts)


class Inbox:
    """A per-connection receive buffer for headers, meta and messages; payloads bypass it.

    A recv into the buffer asks for at most `readahead` bytes. Where what follows a header may
    be a payload (a WRITE request on the server), readahead stays small, so at most a few KiB
    of payload ever pass through here (copied once); where nothing but headers and messages
    follow (requests of READs, replies to WRITEs), a large readahead brings many pipelined
    frames per syscall. Payloads are received with `recv_into` on their destination itself
    (`read_into`), and `take_scatter` reads a reply header and the start of its payload with
    one `recvmsg_into` into [this buffer, destination], so a READ reply costs one syscall and
    no copy. With an `outbox`, queued replies are flushed before any recv for a header that
    would block, so the peer never waits for replies we sit on; in the middle of a payload
    only once PAYLOAD_FLUSH_PARTS replies are queued (the peer sent that payload in the same
    burst as the frames still unanswered, so it is not waiting for them yet).

    The socket must be in blocking mode (timeouts through `set_io_timeout`): in Python's
    timeout mode every recv polls first, and the non-blocking probe would wait.

    Invariant: the unread bytes are buf[start:end); a view returned by `take` stays valid
    until the next call on this inbox.
    """

    __slots__ = ("_sock", "_buf", "_view", "_start", "_end", "size", "readahead", "outbox",
                 "read_ahead_of_payload", "native", "spin")

    def __init__(self, sock: socket.socket, size: int, *, readahead: int = 64 << 10,
                 outbox: Outbox | None = None, read_ahead_of_payload: bool = False) -> None:
        self._sock = sock
        self.size = size
        self.readahead = min(readahead, size)
        self.outbox = outbox
        # read_into ends a payload with one recvmsg_into([payload rest, this buffer]), so the
        # next frame's header (and `readahead` bytes) come with it: one syscall per pipelined
        # frame instead of two (a storage node receiving WRITEs).
        self.read_ahead_of_payload = read_ahead_of_payload
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        # `read_replies` may run natively: a plain socket (the helper reads its fd; TLS records
        # need OpenSSL) and no replies of our own to flush before a read (a server's outbox).
        self.native = NATIVE_REPLIES and outbox is None and not isinstance(sock, ssl.SSLSocket)
        # Set by a server (transfer/tcp_server.py): poll for the next request's header this
        # long before blocking, replies flushed first (spin_wait.py says why and its bounds).
        self.spin: SpinWait | None = None

    @property
    def buffered(self) -> int:
        return self._end - self._start

    def _recv_into(self, view: memoryview, flags: int = 0, *, mid_payload: bool = False) -> int:
        outbox = self.outbox
        # Waiting for the rest of a payload, replies are held back until PAYLOAD_FLUSH_PARTS
        # queued: a pipelining writer has more frames in flight (it only waits for replies
        # with at least that many outstanding), and one sendmsg (plus the node's journal
        # write) per frame cost more than the frame's own Python. Waiting for a header, i.e.
        # for a request that may never come, the replies always leave first.
        spin = None if mid_payload else self.spin
        if outbox is not None and outbox.parts and (
                not mid_payload or len(outbox.parts) >= PAYLOAD_FLUSH_PARTS):
            try:
                got = self._sock.recv_into(view, 0, MSG_DONTWAIT)
            except BlockingIOError:
                got = -1
            if got <= 0:  # would block, or the peer is done sending: it gets its replies
                outbox.flush()
            if got < 0:
                if spin is not None:
                    spin.wait(self._sock)
                got = self._sock.recv_into(view, 0, flags)
        else:
            if spin is not None:
                spin.wait(self._sock)
            got = self._sock.recv_into(view, 0, flags)
        if not got:
            raise PeerClosed("peer closed the connection")
        return got

    def _make_room(self, n: int) -> None:
        """Compact so that n bytes from `start` fit in the buffer."""
        have = self._end - self._start
        if have == 0:
            self._start = self._end = 0
        elif self.size - self._start < n:
            self._view[:have] = self._view[self._start:self._end]
            self._start, self._end = 0, have

    def _fill(self, n: int) -> None:
        """Receive until at least n (<= size) bytes are buffered."""
        self._make_room(n)
        while self._end - self._start < n:
            want = max(n - (self._end - self._start), self.readahead)
            end = min(self._end + want, self.size)
            self._end += self._recv_into(self._view[self._end:end])

    def take(self, n: int) -> memoryview:
        """The next n bytes (n <= size), reading as needed."""
        if n > self.size:
            raise ValueError(f"take({n}) over the inbox size {self.size}")
        if self._end - self._start < n:
            self._fill(n)
        v = self._view[self._start:self._start + n]
        self._start += n
        return v

    def take_scatter(self, n: int, dst: memoryview) -> tuple[memoryview, int]:
        """The next n bytes (a header), plus k bytes that followed it straight into dst[:k].

        dst is where the caller expects the payload behind the header; if the header says
        otherwise (an error reply), the caller hands those k bytes back with `unread`.
        Returns (header view, k); k <= min(len(dst), size).
        """
        if n > self.size:
            raise ValueError(f"take({n}) over the inbox size {self.size}")
        if self._end - self._start >= n or not len(dst):
            return self.take(n), 0
        self._make_room(n)
        tail = dst[:self.size]
        while True:
            hdr_end = self._start + n
            got, _, _, _ = self._sock.recvmsg_into([self._view[self._end:hdr_end], tail])
            if not got:
                raise PeerClosed("peer closed the connection")
            into_header = min(got, hdr_end - self._end)
            self._end += into_header
            if self._end == hdr_end:
                return self.take(n), got - into_header

    def unread(self, data: memoryview) -> None:
        """Put bytes back in front of the unread ones (len(data) + buffered <= size)."""
        have = self._end - self._start
        k = len(data)
        if k + have > self.size:
            raise ValueError("unread over the inbox size")
        if k <= self._start:
            self._start -= k
        else:
            self._view[k:k + have] = self._view[self._start:self._end]
            self._start, self._end = 0, k + have
        self._view[self._start:self._start + k] = data

    def read_into(self, dst: memoryview) -> None:
        """Fill all of `dst` (a writable byte view): buffered bytes first, the rest straight
        from the socket into `dst`. PeerClosed if the stream ends first."""
        n = len(dst)
        have = self._end - self._start
        pos = have if have < n else n
        if pos:
            dst[:pos] = self._view[self._start:self._start + pos]
            self._start += pos
        if pos < n and self.read_ahead_of_payload:
            pos += self._recv_with_next(dst[pos:])
        while pos < n:  # WAITALL: one wakeup per payload, not one per arriving segment
            pos += self._recv_into(dst[pos:], MSG_WAITALL, mid_payload=True)

    def read_into_hashed(self, dst: memoryview, landed: int, piece_bytes: int,
                         digest: xxh3_64) -> None:
        """`read_into(dst[landed:])` piece_bytes at a time, each piece fed to `digest` right
        after it lands, while the CPU's cache still holds it (the first `landed` bytes, already
        in `dst`, first). Measured on these 2-core VMs (a 4 MiB payload over loopback into 64 MiB
        of destinations): receiving and hashing 256 KiB at a time ran at the rate of receiving
        alone, hashing the whole payload after it landed at 0.75-0.85x."""
        if landed:
            digest.update(dst[:landed])
        pos, n = landed, len(dst)
        while pos < n:
            end = min(pos + piece_bytes, n)
            piece = dst[pos:end]
            self.read_into(piece)
            digest.update(piece)
            pos = end

    def read_replies(self, items: list[tuple[int, memoryview]], deadline: float,
                     max_bytes: int) -> tuple[int, BaseException | None]:
        """Receive the OK READ replies of `items` ((request id, destination), in the order they
        are due) in one native call (`native` must be True; transfer/_replies.c): each header
        checked as `tcp_plan.check_response` checks an OK read's, its payload straight into the
        destination. Stops after `max_bytes` of payload, or before a reply that is anything
        else (left unread, as `take_scatter` would find it). Returns (how many items got their
        reply, the error that stopped it or None); after an error the stream is out of step.
        `deadline`: time.monotonic() s, checked before each reply."""
        assert _read_replies is not None
        done, self._start, self._end, code, err = _read_replies(
            self._sock.fileno(), self._buf, self._start, self._end, items,
            int(min(deadline, MAX_DEADLINE_S) * 1e9), max_bytes)
        if code == 0:
            return done, None
        if code == 1:
            return done, TimeoutError("deadline passed")
        if code == 2:
            return done, PeerClosed("peer closed the connection")
        err = err or errno.EIO
        return done, OSError(err, os.strerror(err))

    def read_into_views(self, views: Sequence[memoryview], skip: int = 0) -> None:
        """`read_into` for a payload spread over several destinations (scatter-gather), in
        order, of which the first `skip` bytes already landed (`take_scatter`): buffered bytes
        first, the rest with recvmsg_into straight into the views (one iovec each)."""
        rest = self.drain_into(views, skip)
        while rest:
            got = self._sock.recvmsg_into(rest[:MAX_IOV], 0, MSG_WAITALL)[0]
            if not got:
                raise PeerClosed("peer closed the connection")
            advance_views(rest, got)

    def drain_into(self, views: Sequence[memoryview], skip: int = 0) -> list[memoryview]:
        """Copy buffered bytes into `views` past their first `skip` bytes; returns the parts
        of the views still to fill from the socket, in order."""
        rest: list[memoryview] = []
        for v in views:
            if skip >= len(v):
                skip -= len(v)
                continue
            rest.append(v[skip:] if skip else v)
            skip = 0
        while rest and self._end > self._start:
            v = rest[0]
            k = min(len(v), self._end - self._start)
            v[:k] = self._view[self._start:self._start + k]
            self._start += k
            advance_views(rest, k)
        return rest

    def discard_buffered(self, n: int) -> int:
        """Drop up to n buffered bytes; returns how many were dropped."""
        k = min(n, self._end - self._start)
        self._start += k
        return k

    def _recv_with_next(self, rest: memoryview) -> int:
        """Without waiting: as much of `rest` as has arrived and, once all of it has, up to
        `readahead` bytes behind it into the (empty) buffer. Returns the bytes put in `rest`;
        the caller waits for what is missing (with MSG_WAITALL, one wakeup)."""
        assert self._start == self._end, "a payload read ends with the buffer drained"
        want = len(rest)
        try:
            got = self._sock.recvmsg_into([rest, self._view[:self.readahead]], 0,
                                          MSG_DONTWAIT)[0]
        except BlockingIOError:
            return 0
        if not got:
            raise PeerClosed("peer closed the connection")
        if got <= want:
            return got
        self._start, self._end = 0, got - want
        return want

    def skip(self, n: int) -> None:
        """Discard the next n bytes, reusing this buffer as scratch."""
        while n > 0:
            k = min(self._end - self._start, n)
            self._start += k
            n -= k
            if n:
                self._start = self._end = 0
                self._end = self._recv_into(self._view[:min(n, self.size)])
