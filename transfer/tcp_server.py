"""The TCP data-plane server a storage node runs: frames in, segment memory out, and back.

Model: one listener thread accepts; each connection gets its own thread with a blocking socket
(CPython releases the GIL inside `recv_into`/`sendmsg`, so on a few cores this is the fastest
simple model). A connection serves its requests strictly in order, so responses leave in
request order and a client can pipeline as deep as it likes. A connection that proved a grant
polls for its next request `spin_us` before its thread blocks (never over TLS, whose records
OpenSSL may hold decrypted where a poll of the socket cannot see them; transfer/spin_wait.py).

Per request: the fixed header is read through a preallocated per-connection buffer and decoded
with its bounds checked (`decode_request`), then the meta (at most MAX_META_BYTES), then:
- WRITE: `access.writable()` returns a memoryview of segment memory and the payload is received
  straight into it (only the few KiB that arrived with the header pass through the buffer);
  only when every byte arrived is `access.written()` called, then OK (its payload: the write
  receipt `written()` returns when this write completed the allocation, RECEIPT_BYTES).
  Where the access layer has a `receiver` and answers a `FileRange` (a storage node's disk
  tier), the payload goes through a FILE_CHUNK_BYTES bounce buffer and pwrite instead
  (`receive_file`; FileRange says why): 16 x 4 MiB TCP puts into the disk tier went ~52 ->
  ~35 ms a batch in an alternated A/B here. A failed pwrite refuses that write only (its
  payload is drained). Bound: one bounce buffer per connection receiving such a write,
  BOUNCES_KEPT kept between writes.
  A `Discard` instead (a retried chunk of an allocation already sealed) is drained through
  the connection's own buffer, then `written` as usual.
- READ: `access.readable()` returns a memoryview of segment memory; the reply header and that
  view are sent with `sendmsg` (no copy into bytes).
- Holds: every WRITE or READ the access layer admitted is handed back with its optional
  `release(request)` exactly once: a write when its payload arrived (after `written`) or never
  will (refused, peer gone, timed out), a read once the flush carrying its reply returned or
  the connection is going (HoldingOutbox). A storage node admits no newer allocation over a
  range, and seals no allocation, while such a transfer is in flight (storage_node/inflight.py).
- PING: OK.
- COMMIT / RDMA_CONNECT (shm and rdma control frames, no payload): `access.commit()` checks
  and records a range the client copied into segment memory itself; `access.rdma_connect`
  answers a granted queue-pair exchange with the node's QP description as the reply payload.
Replies are corked: they queue (READ payloads as views) while more requests are already
waiting in the socket, and leave together in one `sendmsg` before the connection would block
on a read, or once 1 MiB is queued. A pipelined run of small requests thus costs a few
syscalls, not two per request. Just before replies leave, the server calls the access
layer's optional `flush()` (a storage node journals the objects those writes sealed there, in
one write, so no write is acknowledged before it is journaled). Counters are per connection
(no lock per request) and summed by `stats.snapshot()`.

Errors and what they cost:
- `FrameError` from the access layer (bad grant, expired, out of range, sealed...): the reply
  carries that status and message; a refused WRITE's payload (already bounded by
  max_frame_payload_bytes) is drained through the connection's own buffer, so the stream stays
  in sync and the connection stays usable.
- a malformed header (bad magic, version, op, meta or length over the limits): an error reply
  flagged RESP_FLAG_CLOSE, then the connection is closed; nothing after it can be trusted.
- the peer vanishing mid-payload or a recv/send timing out: that connection closes; a write
  whose payload did not fully arrive is never `written`.
- connections beyond max_connections, or beyond max_connections_per_peer from one peer
  address, are accepted and closed at once (counted as refused, by reason), so one client
  cannot take every slot. With `auth_timeout_s` (a storage node) the rule is stricter and
  kinder (transfer/tcp_admission.py): only connections that have not yet sent an authentic
  grant count against the per-peer limit, they must send one within auth_timeout_s or be
  closed, and a newer one pushes out the oldest of them, never an authenticated connection.
- every refusal (a request's or a connection's) goes to `on_refusal(peer, reason, detail)`
  when given (the node logs it at most once per peer per interval, cellar.refusals).

Deadlines (against slowloris, and tied to grants): every request's header and meta must have
arrived within idle_timeout_s of the moment the server started waiting for it, however the
bytes trickle in (a deadline per frame, not per recv: one byte a minute no longer keeps a
connection). A WRITE payload must arrive within frame_timeout_s of its header and before its
grant expires; a READ reply must be handed to the kernel before its grant expires (the access
layer's optional `time_left_s`, the node's clock; one already past is refused ST_EXPIRED).
Replies holding no read are bounded by idle_timeout_s. Past a deadline the connection closes
(and its transfers are released). The kernel timeouts follow the nearest deadline within
REARM_SLACK_S without a syscall per op (tcp_server_io.py says how).

TLS (optional, `ssl_context` from `tls_sock.server_context`): each connection's thread does
the handshake first (each of its reads bounded by frame_timeout_s; a peer that does not speak
TLS fails it and is closed, never served), then the same loop runs over `tls_sock.TlsSocket`,
whose sendmsg/recvmsg_into/recv_into flags carry the same meaning over TLS records. COMMIT and
RDMA_CONNECT frames thus go over TLS too.

It never interprets grants itself (the `SegmentAccess` the node provides does) and never lets an
exception from one connection reach another or the listener.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from cellar.transfer._sockio import TIMEOUT_ERRORS, PeerClosed, set_io_timeout, tune_socket
from cellar.transfer.base import Discard, FileRange, SegmentAccess
from cellar.transfer.frame import (
    DEFAULT_MAX_FRAME_PAYLOAD_BYTES,
    MAX_META_BYTES,
    OP_RDMA_CONNECT,
    OP_READ,
    OP_WRITE,
    OPS_COMMIT_LIKE,
    REQUEST,
    REQUEST_ID_OFFSET,
    REQUEST_MAGIC,
    RESP_FLAG_CLOSE,
    ST_EXPIRED,
    ST_INTERNAL,
    ST_OK,
    ST_UNSUPPORTED,
    STATUS_NAMES,
    FrameError,
    RequestHeader,
    decode_commit_meta,
    decode_request,
    decode_write_meta,
    pack_response,
)
from cellar.transfer.memcopy import pwritev_all
from cellar.transfer.spin_wait import MAX_SPIN_US, SpinWait
from cellar.transfer.tcp_admission import (
    AUTH_TIMEOUT,
    AUTHENTIC_REFUSALS,
    Admission,
    Slot,
)
from cellar.transfer.tcp_server_io import (
    FILE_CHUNK_BYTES,
    Bounces,
    DeadlineInbox,
    HoldingOutbox,
    IoTimer,
)
from cellar.transfer.tcp_stats import OP_NAMES, ConnectionCounters, DataServerStats
from cellar.transfer.tls_sock import wrap_server

log = logging.getLogger(__name__)

# Per-connection receive buffer for headers and meta. Each recv into it asks for at most
# READAHEAD_BYTES: enough for a header, its meta and a run of pipelined READ requests, while at
# most that much of a WRITE payload is ever copied (the rest lands in segment memory directly).
INBOX_BYTES = 64 << 10
READAHEAD_BYTES = 4 << 10
assert REQUEST.size + MAX_META_BYTES <= INBOX_BYTES
# Replies queue up (READ payloads as views of segment memory) until the connection would block
# on a read, or this many bytes / buffers are queued.
OUTBOX_BYTES = 1 << 20
# After a fatal reply, how long and how much to keep reading before closing, so the peer sees
# the reply instead of a reset caused by its own unread bytes.
LINGER_S = 0.2
LINGER_BYTES = 1 << 20
_REQUEST_ID = struct.Struct("<Q")


class _Fatal(Exception):
    """Stop serving this connection (after the reply already sent, if any)."""


class TcpDataServer:
    """Serves READ/WRITE/PING frames for the segments behind `access`."""

    def __init__(self, access: SegmentAccess, host: str, port: int, *,
                 max_frame_payload_bytes: int = DEFAULT_MAX_FRAME_PAYLOAD_BYTES,
                 max_connections: int = 256, socket_buffer_bytes: int = 4 << 20,
                 idle_timeout_s: float = 300.0, frame_timeout_s: float = 30.0,
                 max_connections_per_peer: int = 64,
                 ssl_context: ssl.SSLContext | None = None,
                 auth_timeout_s: float | None = None,
                 unauthenticated_backoff_s: float = 10.0,
                 on_refusal: Callable[[str, str, str], None] | None = None,
                 spin_us: int = 0) -> None:
        if (max_frame_payload_bytes <= 0 or max_connections <= 0 or idle_timeout_s <= 0
                or frame_timeout_s <= 0 or max_connections_per_peer <= 0
                or (auth_timeout_s is not None and auth_timeout_s <= 0)):
            raise ValueError("limits must be positive")
        if not 0 <= spin_us <= MAX_SPIN_US:
            raise ValueError(f"spin_us must be in 0..{MAX_SPIN_US}")
        self.access = access
        self.bounces = Bounces()  # receive_file's buffers
        self.host = host
        self.port = port
        self.max_frame_payload_bytes = max_frame_payload_bytes
        self.max_connections = max_connections
        self.socket_buffer_bytes = socket_buffer_bytes
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.max_connections_per_peer = max_connections_per_peer
        self.ssl_context = ssl_context  # every connection speaks TLS (tls_sock.server_context)
        # None: no grant needed to hold a connection (the transfer layer on its own); a storage
        # node sets it: see transfer/tcp_admission.py
        self.auth_timeout_s = auth_timeout_s
        self.on_refusal = on_refusal  # (peer, reason, detail), e.g. a rate-limited log
        self.spin_us = 0 if ssl_context is not None else spin_us
        self.stats = DataServerStats()
        self.admission = Admission(max_connections, max_connections_per_peer,
                                   strict=auth_timeout_s is not None,
                                   unauthenticated_backoff_s=unauthenticated_backoff_s)
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> int:
        """Bind and listen; returns the bound port (port 0 picks a free one)."""
        if self._listener is not None:
            raise RuntimeError("already started")
        infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, stype, proto, _, addr = infos[0]
        ls = socket.socket(family, stype, proto)
        try:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tune_socket(ls, self.socket_buffer_bytes)  # accepted sockets inherit the buffers
            ls.bind(addr)
            ls.listen(min(self.max_connections, socket.SOMAXCONN))
        except BaseException:
            ls.close()
            raise
        self._listener = ls
        self.port = ls.getsockname()[1]
        self._stopping = False
        self._accept_thread = threading.Thread(target=self._accept_loop,
                                               name=f"cellar-tcp-accept:{self.port}",
                                               daemon=True)
        self._accept_thread.start()
        return self.port

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the listener and every connection, then join their threads."""
        self._stopping = True
        ls, self._listener = self._listener, None
        if ls is not None:
            try:
                ls.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
            except OSError:
                pass
            ls.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout_s)
            self._accept_thread = None
        slots = self.admission.slots()
        for slot in slots:
            _shut(slot.sock)
        deadline = time.monotonic() + timeout_s
        for slot in slots:
            if slot.thread is not None:
                slot.thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> TcpDataServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        ls = self._listener
        assert ls is not None
        while not self._stopping:
            try:
                sock, peer = ls.accept()
            except OSError:
                if self._stopping:
                    return
                time.sleep(0.01)  # EMFILE and friends: back off instead of spinning
                continue
            host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            started = time.monotonic()
            slot, why, victims = self.admission.admit(sock, host, self._stopping)
            for victim, reason in victims:  # pushed out to make room (tcp_admission.py)
                self._refused(victim.host, reason, "closed to make room for a newer connection")
                _shut(victim.sock)
            if slot is None:
                self._refused(host, why, "connection refused at accept")
                sock.close()
                continue
            slot.thread = threading.Thread(target=self._serve, args=(slot, started),
                                           name=f"cellar-tcp-conn:{self.port}", daemon=True)
            slot.thread.start()

    def _refused(self, peer: str, reason: str, detail: str) -> None:
        self.stats.refused(reason)
        if self.on_refusal is not None:
            self.on_refusal(peer, reason, detail)

    # -- one connection --------------------------------------------------------------------

    def _serve(self, slot: Slot, started: float) -> None:
        counters = self.stats.opened()
        sock = slot.sock
        auth_deadline = None if self.auth_timeout_s is None else started + self.auth_timeout_s
        outbox: HoldingOutbox | None = None
        try:
            sock.settimeout(None)  # blocking; the kernel enforces the idle timeout
            tune_socket(sock, 0)  # buffers were inherited from the listener
            if self.ssl_context is not None:  # the handshake here, never in the accept loop
                handshake_s = self.frame_timeout_s if auth_deadline is None else max(
                    0.001, min(self.frame_timeout_s, auth_deadline - time.monotonic()))
                # stop() and eviction must shut the TLS socket down (the plain one is spent
                # once wrapped, before its handshake: an eviction during it must reach it)
                sock = wrap_server(sock, self.ssl_context, handshake_s,
                                   lambda tls: self.admission.replace_sock(slot, tls))
            timer = IoTimer(sock, self.idle_timeout_s)
            timer.set(self.idle_timeout_s)
            # access.flush (optional): e.g. journal what was written, before any reply says so
            outbox = HoldingOutbox(sock, timer, self.idle_timeout_s,
                                   getattr(self.access, "release", None), max_bytes=OUTBOX_BYTES,
                                   before_send=getattr(self.access, "flush", None))
            inbox = DeadlineInbox(sock, INBOX_BYTES, timer, readahead=READAHEAD_BYTES,
                                  outbox=outbox, read_ahead_of_payload=True)
            conn = _Connection(self, slot, inbox, outbox, counters, auth_deadline)
            if auth_deadline is None and self.spin_us:  # no grant needed to hold it
                inbox.spin = SpinWait(self.spin_us)
            while not self._stopping:
                conn.serve_one()
        except TIMEOUT_ERRORS:  # a frame's deadline, the kernel's timeout, or no grant in time
            if auth_deadline is not None and not slot.authenticated and not slot.evicted:
                self._refused(slot.host, AUTH_TIMEOUT,
                              f"no authentic grant within {self.auth_timeout_s} s")
        except (_Fatal, PeerClosed, OSError):
            pass  # peer gone, timed out, or a fatal reply already sent
        except Exception:  # never let one connection take anything else down
            log.exception("data connection failed")
        finally:
            if outbox is not None:
                outbox.release_all()  # reads whose replies never left (access.release)
            self.admission.release(slot)
            try:
                sock.close()
            except OSError:
                pass
            self.stats.closed(counters)


class _Connection:
    """One client connection's request loop state."""

    __slots__ = ("access", "receiver", "max_payload", "sock", "inbox", "outbox", "counters",
                 "idle_timeout_s", "frame_timeout_s", "server", "slot", "auth_deadline",
                 "release", "time_left_s")

    def __init__(self, server: TcpDataServer, slot: Slot, inbox: DeadlineInbox,
                 outbox: HoldingOutbox, counters: ConnectionCounters,
                 auth_deadline: float | None) -> None:
        self.access = server.access
        # optional hooks (transfer/base.py SegmentAccess): the end of an admitted transfer,
        # and the seconds its grant has left
        self.release: Callable[[RequestHeader], None] | None = getattr(
            server.access, "release", None)
        self.time_left_s: Callable[[RequestHeader], float] | None = getattr(
            server.access, "time_left_s", None)
        # the access's `receiver` where it has one (a FileRange for disk-tier ranges)
        self.receiver: Callable[[RequestHeader, Any], Any] = getattr(
            server.access, "receiver", server.access.writable)
        self.max_payload = server.max_frame_payload_bytes
        self.idle_timeout_s = server.idle_timeout_s
        self.frame_timeout_s = server.frame_timeout_s
        self.server = server
        self.slot = slot
        # monotonic time by which this connection must have sent an authentic grant; None
        # once it has (or when the server asks for none)
        self.auth_deadline = auth_deadline
        self.sock = slot.sock
        self.inbox = inbox
        self.outbox = outbox
        self.counters = counters

    def within(self, timeout_s: float) -> float:
        """`timeout_s`, cut to what is left of the auth deadline while there is one."""
        if self.auth_deadline is None:
            return timeout_s
        return min(timeout_s, self.auth_deadline - time.monotonic())

    def proved(self) -> None:
        """This connection sent an authentic grant: it keeps the usual deadlines now."""
        self.auth_deadline = None
        if self.server.spin_us:  # a stranger's connection never makes the node spin
            self.inbox.spin = SpinWait(self.server.spin_us)
        self.server.admission.authenticated(self.slot)

    def serve_one(self) -> None:
        inbox = self.inbox
        inbox.expect(self.within(self.idle_timeout_s), arm=True)  # header and meta: one deadline
        raw = inbox.take(REQUEST.size)
        try:
            req = decode_request(raw, max_payload_bytes=self.max_payload)
        except FrameError as e:
            rid = _REQUEST_ID.unpack_from(raw, REQUEST_ID_OFFSET)[0] \
                if raw[:4] == REQUEST_MAGIC else 0
            self.fatal(e.status, rid, e.message)
        self.counters.requests[req.op] += 1
        # A view of the inbox: valid until its next read, so decoded (WRITE) or copied first
        meta = inbox.take(req.meta_len)
        if req.op == OP_WRITE:
            self.write(req, meta)
        elif req.op == OP_READ:
            self.read(req)
        elif req.op in OPS_COMMIT_LIKE or req.op == OP_RDMA_CONNECT:  # shm / rdma control
            self.control(req, bytes(meta))
        else:
            self.outbox.add(pack_response(ST_OK, req.request_id))

    def write(self, req: RequestHeader, meta: memoryview) -> None:
        try:
            wmeta = decode_write_meta(meta)  # before the inbox moves on (meta is its view)
            target = self.receiver(req, wmeta)
        except Exception as e:  # refused before the payload: drain it, stay in sync
            self.refuse_and_drain(req, e)
            return
        try:  # admitted: held in flight until its payload arrived or never will
            self.receive(req, wmeta, target)
        finally:
            if self.release is not None:
                self.release(req)

    def receive(self, req: RequestHeader, wmeta: Any, target: Any) -> None:
        """An admitted WRITE's payload into `target`, by its deadline: frame_timeout_s after
        its header and before its grant expires (module docstring), then `written`."""
        try:
            within_s = min(self.frame_timeout_s, self.grant_left_s(req))
            if isinstance(target, FileRange | Discard):
                if target.length != req.length:
                    raise FrameError(ST_INTERNAL, f"target is {target.length} bytes, "
                                     f"request {req.length}")
            else:
                target = _byte_view(target, req.length, writable=True)
        except Exception as e:
            self.refuse_and_drain(req, e)
            return
        if self.auth_deadline is not None:
            self.proved()
        self.inbox.expect(within_s, arm=True)
        if isinstance(target, FileRange):
            failed = self.receive_file(target)
            if failed is not None:
                self.refuse(req, failed)  # the allocation stays unsealed: nothing recorded
                return
        elif isinstance(target, Discard):  # a retried chunk of a sealed allocation
            self.inbox.skip(req.length)  # through this connection's buffer: no allocation
        else:
            self.inbox.read_into(target)  # PeerClosed / timeout here: the write never completes
        del target
        self.counters.bytes_in += req.length
        try:
            receipt = self.access.written(req, wmeta)
        except Exception as e:
            self.refuse(req, e)
            return
        if receipt:  # the write that completed the allocation: its receipt is the payload
            self.outbox.add(pack_response(ST_OK, req.request_id, len(receipt)) + receipt)
        else:
            self.outbox.add(pack_response(ST_OK, req.request_id))

    def refuse_and_drain(self, req: RequestHeader, e: Exception) -> None:
        """Refuse a WRITE and drain its payload (bounded by the frame limit) through this
        connection's buffer, so the stream stays in sync."""
        self.refuse(req, e)  # counted first: a stranger's drain may be cut short
        self.inbox.expect(self.within(self.frame_timeout_s), arm=self.auth_deadline is not None)
        self.inbox.skip(req.length)

    def grant_left_s(self, req: RequestHeader) -> float:
        """Seconds the admitted request's grant has left (access `time_left_s`); ST_EXPIRED
        when none: a transfer begun past its grant's expiry could not end before it."""
        if self.time_left_s is None:
            return float("inf")
        left = self.time_left_s(req)
        if left <= 0:
            raise FrameError(ST_EXPIRED, "the grant expired before its transfer began")
        return left

    def receive_file(self, target: FileRange) -> FrameError | None:
        """Receive a payload into a disk-backed file: FILE_CHUNK_BYTES at a time into this
        connection's bounce buffer, each chunk pwritten while still in cache (FileRange says
        why not into the mapping). A failed pwrite drains the rest of the payload (the
        connection stays in sync) and is returned, not raised."""
        bounce = self.server.bounces.take()
        failed: FrameError | None = None
        done = 0
        try:
            while done < target.length:
                n = min(FILE_CHUNK_BYTES, target.length - done)
                chunk = bounce[:n]
                self.inbox.read_into(chunk)  # PeerClosed / timeout: the write never completes
                if failed is None:
                    try:
                        pwritev_all(target.fd, [chunk], target.offset + done)
                    except OSError as exc:
                        failed = FrameError(ST_INTERNAL, "write into the segment file: "
                                            f"{exc.strerror or exc}")
                done += n
        finally:
            self.server.bounces.give_back(bounce)
        return failed

    def control(self, req: RequestHeader, meta: bytes) -> None:
        """COMMIT (shm/rdma: the payload already landed; check and record it), CLAIM (the
        same, before the copy: the range's older entries go) and RDMA_CONNECT (queue-pair
        exchange; the reply's payload is the node's QP description)."""
        reply = b""
        try:
            if req.op in OPS_COMMIT_LIKE:
                commit = getattr(self.access, "commit", None)
                if commit is None:
                    raise FrameError(ST_UNSUPPORTED, "this server takes no commits")
                wmeta, dev, ino = decode_commit_meta(meta)
                reply = commit(req, wmeta, dev, ino) or b""  # the receipt, if it sealed
            else:
                connect = getattr(self.access, "rdma_connect", None)
                if connect is None:
                    raise FrameError(ST_UNSUPPORTED, "this node serves no rdma")
                reply = bytes(connect(req, meta))  # checks its grant first
        except Exception as e:
            self.refuse(req, e)
            return
        if self.auth_deadline is not None:  # served under a grant the access layer checked
            self.proved()
        self.outbox.add(pack_response(ST_OK, req.request_id, len(reply)) + reply)

    def read(self, req: RequestHeader) -> None:
        try:
            view = self.access.readable(req)
        except Exception as e:
            self.refuse(req, e)
            return
        try:  # admitted: held until its reply is with the kernel (HoldingOutbox), by its grant
            view = _byte_view(view, req.length, writable=False)
            deadline = time.monotonic() + self.grant_left_s(req)
        except Exception as e:
            if self.release is not None:
                self.release(req)
            self.refuse(req, e)
            return
        if self.auth_deadline is not None:
            self.proved()
        self.outbox.add_held(pack_response(ST_OK, req.request_id, req.length), view, req, deadline)
        self.counters.bytes_out += req.length

    def refuse(self, req: RequestHeader, e: Exception) -> None:
        if isinstance(e, FrameError):
            status, message = e.status, e.message
        else:
            log.exception("segment access failed for op %d", req.op)
            status, message = ST_INTERNAL, f"internal error: {type(e).__name__}"
        self.counters.error(status, req.op)
        if self.auth_deadline is not None and status in AUTHENTIC_REFUSALS:
            self.proved()  # refused after its grant's MAC verified: not a stranger
        on_refusal = self.server.on_refusal
        if on_refusal is not None:
            on_refusal(self.slot.host, f"{OP_NAMES.get(req.op, req.op)}: "
                       f"{STATUS_NAMES.get(status, status)}", message)
        self.outbox.add(pack_response(status, req.request_id, 0, message))

    def fatal(self, status: int, request_id: int, message: str) -> NoReturn:
        """Reply, stop reading requests, linger briefly so the reply is not lost to a reset."""
        self.counters.requests[0] += 1
        self.counters.error(status)
        if self.server.on_refusal is not None:
            self.server.on_refusal(self.slot.host, f"bad frame: {STATUS_NAMES.get(status, status)}",
                                   message)
        sock = self.sock
        try:
            self.outbox.add(pack_response(status, request_id, 0, message, RESP_FLAG_CLOSE))
            self.outbox.flush()
            sock.shutdown(socket.SHUT_WR)
            set_io_timeout(sock, LINGER_S)
            scratch = bytearray(64 << 10)
            deadline = time.monotonic() + LINGER_S
            left = LINGER_BYTES
            while left > 0 and time.monotonic() < deadline:
                got = sock.recv_into(scratch)
                if not got:
                    break
                left -= got
        except OSError:
            pass
        raise _Fatal(message)


def _shut(sock: Any) -> None:
    """Wake and end a connection's thread (its recv returns); the thread closes the socket."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _byte_view(view: Any, length: int, *, writable: bool) -> memoryview:
    """The access layer's buffer as a flat byte memoryview of exactly `length` bytes."""
    mv = view if isinstance(view, memoryview) else memoryview(view)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if len(mv) != length:
        raise FrameError(ST_INTERNAL, f"segment view is {len(mv)} bytes, request {length}")
    if writable and mv.readonly:
        raise FrameError(ST_INTERNAL, "segment view is read-only")
    return mv
