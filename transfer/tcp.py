"""The TCP transport: batches of remote-range transfers over persistent, pipelined connections.

How a batch moves:
1. Every op is cut into chunks of at most `chunk_bytes`; each chunk is one frame whose range
   lies inside the op's grant (writes carry the op's WriteMeta on every chunk, so the node can
   account each frame on its own). An op whose range is not inside its grant fails before a
   byte moves, so a multi-frame op never lands partly because of its own range. A
   scatter-gather op (`TransferOp.parts`) is cut the same way over the concatenation of its
   parts: a chunk is the tuple of part slices it covers, sent as one iovec each and received
   with `recvmsg_into` straight into them. (This step, the striping policy and the dealing
   are `tcp_plan`'s, shared with the asyncio transport `tcp_async`.)
2. Chunks are grouped by node address (route.endpoints["tcp"]). For each node the batch checks
   out connections from that node's pool (waiting only for the first one; extra ones only if
   idle or creatable right away) and deals the chunks out to them, least-loaded first, so a
   large object is striped across connections. How many: at most `connections_per_node`, at
   most one per `min_stripe_bytes` of the node's share, and just one when the frames are much
   smaller than `chunk_bytes` (measured on a 2-core loopback: small frames are bound by
   per-frame CPU, where more lanes only add GIL handoffs; large frames gain from parallel
   kernel copies).
3. Each checked-out connection is one *lane*, driven by one thread with a blocking socket: it
   sends up to `max_inflight_per_connection` requests (gathered into as few `sendmsg` calls as
   possible: header, meta and payload memoryviews, never concatenated) before it reads their
   responses in order. A READ reply is read with one `recvmsg_into([inbox, destination])`, so
   its payload goes straight into the op's own destination slice, the rest with `recv_into`
   (MSG_WAITALL) on that slice: no intermediate buffer, no copy. A read whose op asked for
   its checksum (`want_checksum`) is hashed (xxh3_64) by its lane as it lands, while it is
   still in cache (a large one HASHED_PIECE_BYTES at a time; a multi-frame one when this lane
   had all of its frames, `tcp_reads.frame_digest`): on these VMs hashing a just-received
   MiB runs at ~40 GB/s against ~9 GB/s for the whole batch afterwards. A read batch stripes
   over fewer lanes than a write (`tcp_plan.READ_LANE_CPUS` says why). Lanes run on a bounded
   pool of threads owned by the transport; the last lane of a batch runs on the calling
   thread, so a batch that needs one connection costs no thread hop.

Invariants:
- A connection belongs to exactly one lane at a time. Pools are taken in address order and
  lanes never wait for anything but their own socket, so concurrent batches cannot deadlock,
  and sockets per node never exceed `connections_per_node`.
- Request ids are per connection and every response is checked against the request it should
  answer (id, length); any mismatch, short read, timeout or socket error means the stream can
  no longer be trusted: the connection is closed, never returned to its pool, and only the ops
  with chunks on it fail (ST_CONNECTION_LOST / ST_TIMEOUT / ST_CONNECT_FAILED). The next batch
  reconnects; an idle pooled connection whose node went away is noticed at checkout (one
  non-blocking peek) and replaced before use.
- An op fails if any of its chunks fails; a failed op never fails its neighbours. A failed
  read's own destination holds unspecified bytes.
- Timeouts: every syscall is bounded by the time left to the batch deadline (kernel socket
  timeouts), and the deadline is checked between frames.
- Cancellation: `read` returns only after every lane of the batch has ended, and a lane that
  timed out closed its connection, so no byte lands in a read's destination after it returned.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cellar.transfer._sockio import (
    MAX_IOV,
    TIMEOUT_ERRORS,
    Inbox,
    PeerClosed,
    idle_alive,
    send_all,
    set_io_timeout,
)
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    SegmentRoute,
    TransferOp,
    TransferResult,
    Transport,
    byte_view,
    hash_views,
)
from cellar.transfer.frame import (
    DEFAULT_MAX_FRAME_PAYLOAD_BYTES,
    MAX_MESSAGE_BYTES,
    OP_PING,
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_MAGIC,
    RESP_FLAG_CLOSE,
    RESPONSE,
    ST_OK,
    VERSION,
    FrameError,
)
from cellar.transfer.spin_wait import SpinWait
from cellar.transfer.tcp_plan import (
    Chunk,
    Desync,
    Plan,
    add_request,
    check_response,
    deal,
    fail_chunks,
    finish,
    lanes_for,
    plan_batch,
    read_lanes,
)
from cellar.transfer.tcp_reads import Pending, native_reads, receive_payload
from cellar.transfer.tls_sock import dial

# Per-connection receive buffer for response headers and error messages.
INBOX_BYTES = 64 << 10
assert RESPONSE.size + MAX_MESSAGE_BYTES <= INBOX_BYTES
_ZERO_MAC = bytes(16)
RESPONSE_SIZE = RESPONSE.size
NO_CONNECTION = "no free connection before the deadline"


class _Conn:
    __slots__ = ("sock", "inbox", "next_id", "gen", "io_timeout_s")

    def __init__(self, sock: socket.socket, gen: int) -> None:
        self.sock = sock
        self.inbox = Inbox(sock, INBOX_BYTES)
        self.next_id = 1
        self.gen = gen
        self.io_timeout_s = 0.0

    def bound_io(self, remaining_s: float) -> None:
        """Kernel timeouts close to `remaining_s` (within 10%: skips two syscalls per call
        when consecutive batches use the same timeout)."""
        if not 0.9 * remaining_s <= self.io_timeout_s <= 1.1 * remaining_s:
            set_io_timeout(self.sock, remaining_s)
            self.io_timeout_s = remaining_s

    def alive(self) -> bool:
        return idle_alive(self.sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Pool:
    """Connections to one node address: at most `limit` exist, idle ones wait in `idle`.

    `acquire` hands out idle connections and, while under the limit, reserved slots (None) that
    the caller fills by connecting itself (outside the lock, in parallel).
    """

    def __init__(self, address: str, limit: int) -> None:
        self.address = address
        self.limit = limit
        self.cond = threading.Condition()
        self.idle: list[_Conn] = []
        self.total = 0      # idle + checked out + reserved slots
        self.gen = 0        # bumped by forget(): older connections are closed on release
        self.closed = False

    def acquire(self, want: int, deadline: float) -> list[_Conn | None] | None:
        """Up to `want` (>= 1) connections or slots, waiting only for the first one.

        [] if the deadline passed first, None if the transport is closed."""
        with self.cond:
            while not self.idle and self.total >= self.limit:
                if self.closed:
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self.cond.wait(remaining)
            if self.closed:
                return None
            got: list[_Conn | None] = []
            while len(got) < want and self.idle:
                got.append(self.idle.pop())
            while len(got) < want and self.total < self.limit:
                self.total += 1
                got.append(None)
            return got

    def release(self, conn: _Conn, reusable: bool) -> None:
        with self.cond:
            keep = reusable and not self.closed and conn.gen == self.gen
            if keep:
                self.idle.append(conn)
            else:
                self.total -= 1
            self.cond.notify()
        if not keep:
            conn.close()

    def release_slot(self) -> None:
        with self.cond:
            self.total -= 1
            self.cond.notify()

    def drop_idle(self, closing: bool) -> None:
        with self.cond:
            self.gen += 1
            self.closed = self.closed or closing
            idle, self.idle = self.idle, []
            self.total -= len(idle)
            self.cond.notify_all()
        for conn in idle:
            conn.close()


class TcpTransport(Transport):
    """Persistent, striped, pipelined TCP connections to storage nodes; thread-safe.

    connections_per_node: pool bound per node address (and most lanes one batch stripes over).
    chunk_bytes: largest frame payload sent or asked for; <= max_frame_payload_bytes, which
        must not exceed the nodes' own limit.
    connect_timeout_s: per connection attempt (also bounded by the batch deadline).
    socket_buffer_bytes: SO_SNDBUF/SO_RCVBUF before connect (0: leave to kernel autotuning).
    max_inflight_per_connection: requests sent on a connection before reading its replies.
    max_threads: the lane thread pool shared by all batches.
    min_stripe_bytes: a node's share of a batch uses at most one lane per this many bytes
        (0: no byte floor).
    read_connections_per_node: most lanes a read batch of one node stripes over (None: one per
        READ_LANE_CPUS of this process's CPUs, at most connections_per_node; `tcp_plan`).
    tls_context: verifies nodes whose endpoint is `tls://HOST:PORT` (`tls_sock`; None: the
        system's trust store). Plain endpoints never use it.
    `ping(address, timeout_s)` measures one round trip for latency probes.
    """

    name = "tcp"

    def __init__(self, *, connections_per_node: int = 4, chunk_bytes: int = 4 << 20,
                 max_frame_payload_bytes: int = DEFAULT_MAX_FRAME_PAYLOAD_BYTES,
                 connect_timeout_s: float = 5.0, socket_buffer_bytes: int = 4 << 20,
                 max_inflight_per_connection: int = 64, max_threads: int = 16,
                 min_stripe_bytes: int = 8 << 20,
                 read_connections_per_node: int | None = None,
                 tls_context: ssl.SSLContext | None = None,
                 spin: SpinWait | None = None) -> None:
        if connections_per_node < 1 or max_inflight_per_connection < 1 or max_threads < 1:
            raise ValueError("connections_per_node, max_inflight_per_connection and "
                             "max_threads must be >= 1")
        read_connections_per_node = read_lanes(connections_per_node, read_connections_per_node)
        if not 0 < chunk_bytes <= max_frame_payload_bytes:
            raise ValueError("chunk_bytes must be in (0, max_frame_payload_bytes]")
        self.connections_per_node = connections_per_node
        self.chunk_bytes = chunk_bytes
        self.max_frame_payload_bytes = max_frame_payload_bytes
        self.connect_timeout_s = connect_timeout_s
        self.socket_buffer_bytes = socket_buffer_bytes
        self.max_inflight_per_connection = max_inflight_per_connection
        self.max_threads = max_threads
        self.min_stripe_bytes = min_stripe_bytes
        self.read_connections_per_node = read_connections_per_node
        self.tls_context = tls_context
        # polls for the reply of a one-chunk transfer before blocking (transfer/spin_wait.py);
        # not over TLS, where a readable socket may hold only part of a record
        self.spin = spin if tls_context is None else None
        self._lock = threading.Lock()
        self._pools: dict[str, _Pool] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    # -- Transport -------------------------------------------------------------------------

    def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        return self._batch(ops, timeout_s, OP_WRITE)

    def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        return self._batch(ops, timeout_s, OP_READ)

    def forget(self, route: SegmentRoute) -> None:
        address = route.endpoints.get(self.name)
        with self._lock:
            pool = self._pools.get(address) if address else None
        if pool is not None:
            pool.drop_idle(closing=False)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools = list(self._pools.values())
            self._pools.clear()
            executor, self._executor = self._executor, None
        for pool in pools:
            pool.drop_idle(closing=True)
        if executor is not None:
            executor.shutdown(wait=True)

    def ping(self, address: str, timeout_s: float = 1.0) -> float:
        """Round-trip seconds of one PING frame on a pooled connection to `address`.

        Raises TimeoutError, or ConnectionError if the node cannot be reached or answers wrong.
        """
        deadline = time.monotonic() + timeout_s
        pool = self._pool(address)
        if pool is None:
            raise ConnectionError("transport closed")
        got = pool.acquire(1, deadline)
        if got is None:
            raise ConnectionError("transport closed")
        if not got:
            raise TimeoutError(f"{address}: no free connection within {timeout_s} s")
        conn, reusable = got[0], False
        try:
            if conn is not None and not conn.alive():
                conn.close()  # keep its slot and reconnect below
                conn = None
            if conn is None:
                try:
                    conn = self._connect(pool, deadline)
                except OSError as e:
                    pool.release_slot()
                    raise ConnectionError(f"{address}: {e}") from e
            sock = conn.sock
            conn.bound_io(deadline - time.monotonic())
            rid = conn.next_id
            conn.next_id += 1
            t0 = time.perf_counter()
            send_all(sock, (REQUEST.pack(REQUEST_MAGIC, VERSION, OP_PING, 0, 0, rid, 0, 0, 0, 0,
                                         0, 0, 0, _ZERO_MAC, 0, 0),))
            status, _, _, _ = check_response(conn.inbox.take(RESPONSE_SIZE), rid, 0, False)
            rtt = time.perf_counter() - t0
            if status != ST_OK:
                raise ConnectionError(f"{address}: bad ping reply (status {status})")
            reusable = True
            return rtt
        except TIMEOUT_ERRORS as e:
            raise TimeoutError(f"{address}: ping timed out") from e
        except (OSError, FrameError, Desync) as e:
            raise ConnectionError(f"{address}: {e}") from e
        finally:
            if conn is not None:
                pool.release(conn, reusable)

    # -- a batch ---------------------------------------------------------------------------

    def _batch(self, ops: Sequence[TransferOp], timeout_s: float,
               op_code: int) -> list[TransferResult]:
        deadline = time.monotonic() + timeout_s
        if len(ops) == 1:
            one = self._one_frame(ops[0], op_code, deadline)
            if one is not None:
                return one
        plan = plan_batch(ops, self.name, op_code, self.chunk_bytes)
        fail = plan.fail
        # Pools are taken in address order, and every lane but the newest is already running
        # on the executor while the batch waits for the next pool: a batch only ever waits
        # for a pool later in the order than any connection it holds, so no cycle can form.
        futures: list[Future[None]] = []
        inline: tuple[_Pool, _Conn | None, list[Chunk], int, float, Plan] | None = None
        for address in sorted(plan.by_address):
            chunks = plan.by_address[address]
            pool = self._pool(address)
            want = self._lanes(len(chunks), plan.bytes_by_address[address], op_code, address)
            got = pool.acquire(want, deadline) if pool is not None else None
            if not got:
                status, why = ((ST_TIMEOUT, NO_CONNECTION)
                               if got is not None else (ST_CONNECT_FAILED, "transport closed"))
                fail_chunks(fail, chunks, status, f"{address}: {why}")
                continue
            assert pool is not None  # `got` came from it
            for conn, lane_chunks in zip(got, deal(chunks, len(got)), strict=True):
                if inline is not None:
                    futures.append(self._submit(inline))
                inline = (pool, conn, lane_chunks, op_code, deadline, plan)
        if inline is not None:  # the last lane runs here: one connection, no thread hop
            # it may spin for its reply only when it is the batch's one chunk: beside lanes on
            # other threads, or while the node works through more frames, the spinning vCPU
            # is one they need (batches of 16 x 64 KiB: 0.86x with spinning)
            one_op = not futures and len(inline[2]) == 1
            self._run_lane(*inline, spin=self.spin if one_op else None)
        # Every lane has ended (each is bounded by the deadline through kernel timeouts) before
        # this returns: no lane is left that could still receive into a caller's buffer.
        for fut in futures:
            fut.result()
        return finish(plan)

    def _one_frame(self, op: TransferOp, op_code: int,
                   deadline: float) -> list[TransferResult] | None:
        """One op that fits one frame: the lane and pump of a batch, without the batch's
        planning (grouping by address, lanes, the per-op lists of a whole batch). A single
        get's read is one; measured here 110-111 -> 99-100 us (p50, 64 KiB, loopback). None
        when `op` is anything else, or the transport is closed: `_batch` answers it."""
        address = op.route.endpoints.get(self.name)
        is_read = op_code == OP_READ
        if op.parts or not address or not (is_read or op.meta is not None):
            return None
        try:
            view = byte_view(op.buffer, writable=is_read)
        except (ValueError, TypeError):
            return None
        n, grant = len(view), op.grant
        if n > self.chunk_bytes or not grant.covers(grant.segment_id, op.offset, n):
            return None
        try:  # packed once it is sure to be sent from here (else plan_batch packs it)
            meta = b"" if is_read else op.meta.pack()  # type: ignore[union-attr]
        except FrameError:
            return None
        pool = self._pool(address)
        got = pool.acquire(1, deadline) if pool is not None else None
        if pool is None or got is None:
            return None
        if not got:
            return [TransferResult(ST_TIMEOUT, f"{address}: {NO_CONNECTION}")]
        plan = Plan([None], [meta], [op.want_checksum and is_read], [None], [b""])
        self._run_lane(pool, got[0], [(0, op.offset, (view,), n, grant)], op_code, deadline,
                       plan, self.spin)
        return finish(plan)

    def _lanes(self, n_chunks: int, nbytes: int, op_code: int, address: str = "") -> int:
        return lanes_for(n_chunks, nbytes, chunk_bytes=self.chunk_bytes,
                         connections_per_node=self.connections_per_node,
                         min_stripe_bytes=self.min_stripe_bytes, is_read=op_code == OP_READ,
                         read_connections_per_node=self.read_connections_per_node,
                         address=address)

    def _submit(self, lane: tuple[Any, ...]) -> Future[None]:
        with self._lock:
            if not self._closed:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(self.max_threads,
                                                        thread_name_prefix="cellar-tcp-lane")
                return self._executor.submit(self._run_lane, *lane)
        done: Future[None] = Future()  # closed meanwhile: run it here, never leak a thread pool
        self._run_lane(*lane)
        done.set_result(None)
        return done

    def _pool(self, address: str) -> _Pool | None:
        with self._lock:
            if self._closed:
                return None
            pool = self._pools.get(address)
            if pool is None:
                pool = self._pools[address] = _Pool(address, self.connections_per_node)
            return pool

    def _connect(self, pool: _Pool, deadline: float) -> _Conn:
        timeout = min(self.connect_timeout_s, deadline - time.monotonic())
        if timeout <= 0:
            raise TimeoutError("deadline passed before connecting")
        return _Conn(dial(pool.address, timeout, self.socket_buffer_bytes, self.tls_context),
                     pool.gen)

    def _run_lane(self, pool: _Pool, conn: _Conn | None, chunks: list[Chunk], op_code: int,
                  deadline: float, plan: Plan, spin: SpinWait | None = None) -> None:
        """Drive one connection through its chunks; never raises."""
        reusable = False
        try:
            if conn is not None and not conn.alive():
                conn.close()  # keep its slot and reconnect below
                conn = None
            if conn is None:
                try:
                    conn = self._connect(pool, deadline)
                except (OSError, ValueError) as e:
                    pool.release_slot()
                    fail_chunks(plan.fail, chunks, ST_CONNECT_FAILED, f"{pool.address}: {e}")
                    return
            reusable = self._pump(conn, pool.address, chunks, op_code, deadline, plan, spin)
        except BaseException as e:  # a bug here must still fail only these ops
            fail_chunks(plan.fail, chunks, ST_CONNECTION_LOST, f"{pool.address}: {e!r}")
            reusable = False
        finally:
            if conn is not None:
                pool.release(conn, reusable)

    def _pump(self, conn: _Conn, address: str, chunks: list[Chunk], op_code: int,
              deadline: float, plan: Plan, spin: SpinWait | None = None) -> bool:
        """Pipelined requests and in-order responses; True if the connection is still in sync."""
        sock, inbox = conn.sock, conn.inbox
        metas, fail, hashed, sums = plan.metas, plan.fail, plan.hashed, plan.sums
        receipts = plan.receipts
        window = self.max_inflight_per_connection
        refill_at = window // 2
        is_write = op_code == OP_WRITE
        native = not is_write and inbox.native
        # `spin`: once per pump, before the first reply it would block for
        pending: deque[Pending] = deque()
        n = len(chunks)
        i = 0
        try:
            while i < n or pending:
                if i < n and len(pending) <= refill_at:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError("deadline passed")
                    conn.bound_io(remaining)
                    parts: list[bytes | memoryview] = []
                    while i < n and len(pending) < window and len(parts) < MAX_IOV - 2:
                        chunk = chunks[i]
                        op_i, offset, views, size, _ = chunk
                        rid = conn.next_id
                        conn.next_id = rid + 1
                        add_request(parts, op_code, rid, chunk, metas[op_i])
                        pending.append((rid, op_i, views, size, offset))
                        i += 1
                    send_all(sock, parts)
                rid, op_i, views, size, offset = pending[0]
                view = views[0]
                if time.monotonic() > deadline:
                    raise TimeoutError("deadline passed")
                if spin is not None and i >= n and inbox.buffered < RESPONSE_SIZE:
                    spin.wait(sock)
                    spin = None
                if native:  # a run of READ replies in one native call, then this loop's rest
                    got, error = native_reads(inbox, pending, deadline, plan,
                                              len(pending) - refill_at if i < n else len(pending))
                    if error is not None:
                        raise error
                    if got:
                        continue
                if is_write:
                    head, early = inbox.take(RESPONSE_SIZE), 0
                else:  # header into the inbox, payload straight into the destination
                    head, early = inbox.take_scatter(RESPONSE_SIZE, view)
                status, flags, msg_len, length = check_response(head, rid, size, not is_write)
                if status == ST_OK:
                    if is_write:
                        if length:  # this frame completed the allocation: its receipt
                            receipts[op_i] = bytes(inbox.take(length))
                    else:
                        if len(views) == 1:
                            receive_payload(inbox, view, early, op_i, offset, plan)
                        else:  # straight into every part, one recvmsg_into iovec each
                            inbox.read_into_views(views, early)
                            if hashed[op_i]:
                                sums[op_i] = hash_views(views)
                    pending.popleft()
                    continue
                if early:  # they were not payload: the message and what follows it
                    inbox.unread(view[:early])
                    view[:early] = bytes(early)  # no refusal text left in the caller's buffer
                msg = bytes(inbox.take(msg_len)).decode("utf-8", "replace")
                pending.popleft()
                if fail[op_i] is None:
                    fail[op_i] = TransferResult(status, f"{address}: {msg}")
                if flags & RESP_FLAG_CLOSE:
                    raise PeerClosed(f"node closed the connection after: {msg}")
            return True
        except TIMEOUT_ERRORS as e:
            status, why = ST_TIMEOUT, f"{address}: timed out ({e or type(e).__name__})"
        except (OSError, FrameError, Desync) as e:
            status, why = ST_CONNECTION_LOST, f"{address}: {e}"
        for _, op_i, _, _, _ in pending:
            if fail[op_i] is None:
                fail[op_i] = TransferResult(status, why)
        fail_chunks(fail, chunks[i:], status, why)
        return False

