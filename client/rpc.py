"""The sync face's line to the master: one gRPC channel, deadlines, bounded retries.

What it owns
    One `grpc.Channel` per `Client` (thread-safe; gRPC multiplexes concurrent calls over it),
    with the master's small message limit (4 MiB: the master never carries payload, so replies
    are placements and grants only). Every call runs against the caller's deadline. A call
    that fails with UNAVAILABLE (master not up yet, restarting, connection refused) is retried
    with capped exponential backoff while the deadline allows; everything else is mapped at once
    to a typed exception by `statuses.grpc_error` (INVALID_ARGUMENT keeps the server's message).

Retrying UNAVAILABLE is safe for every master RPC: a mutating call carries one request id
(`cellar.client.request_ids`, stamped when `call` starts) on every attempt, so when a reply was
lost after the master acted, the repeat gets the first call's reply (the master remembers it,
cellar.proto.request_id) instead of ALREADY_EXISTS or NOT_FOUND for its own earlier attempt.

Every reply's epoch goes through an `EpochFence`: a reply from a master older than one this
client already heard from (a deposed leader) raises `cellar.Unavailable`.

The fast line: PutStart, PutEnd, PutRevoke, GetReplicas, Unpin, Exists and PrefixLen go over the
master's metadata fast line (`cellar.proto.fastline`, served by `cellar.master.fastrpc`: the same
protobuf messages, length-prefixed, over a
small pool of persistent TCP connections; about 0.12 ms per round trip instead of 0.8 ms) once
ClusterStatus's trailing metadata has named its port. A connection that fails (refused, reset,
a master restart) sends that call through gRPC instead, with gRPC's retry rules, and the port
is asked again at most once per `FAST_RELEARN_S`. Replies get the same epoch fence and status
mapping as gRPC replies.

Leader changes (master high availability, cellar.coord): a call that fails retryably is
retried against the leader `cellar.coord.follow.next_master` picks (through
`cellar.coord.link`), the same policy the storage node uses: etcd (`resolve`, rate-limited) is the authority when configured; else the redirect a
standby or a deposed leader answers with (trailing metadata `cellar-leader`, or
`leader=HOST:PORT` at the end of the details, also over the fast line); else, when a master
stops answering altogether, the other masters it knew. A ClusterStatus answered by a standby counts
as a redirect. Switching replaces the gRPC channel, drops the fast line (the new leader's
ClusterStatus names its own) and keeps the epoch fence: the new leader's epoch is higher, and
a reply from an older one still raises, or with etcd is retried at the leader etcd names.

Who decides what: every decision above (retry and backoff, redirect, etcd, switch, fence)
is a plan of `cellar.coord.link`, the one the asyncio face (`cellar.client.aio_rpc`) and the
storage node use too; this module performs the plans' effects with blocking I/O (threads, the
gRPC channel, the fast line's sockets) and shares `LinkFace` and `fast_answer` with the asyncio
face. It must never decide a retry or a switch itself: a fix to failover goes to coord/link.py.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import grpc

from cellar.client.connect_args import master_channel, tls_context
from cellar.client.request_ids import stamp
from cellar.client.statuses import grpc_error, retryable_grpc
from cellar.coord import link as plans
from cellar.coord.follow import MIN_LOOKUP_INTERVAL_S
from cellar.coord.link import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    FAST_RELEARN_S,
    LEADER_CHECK_AFTER_S,
    MAX_KNOWN_MASTERS,
    MAX_RPC_ATTEMPTS,
    RESOLVE_TIMEOUT_S,
    AskEtcd,
    DropFast,
    Effect,
    EpochFence,
    LinkState,
    Moved,
    Plan,
    Refused,
    Replied,
    Sleep,
    Switch,
)
from cellar.coord.redirect import leader_from, valid_address
from cellar.errors import Timeout
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc, fastline
from cellar.transfer.spin_wait import SpinWait
from cellar.units import parse_host_port

MAX_MESSAGE_BYTES = 4 << 20

# The fast line's contract (frame, method numbers, port metadata) lives in cellar.proto.fastline.
FAST_PORT_METADATA = fastline.PORT_METADATA
FAST_FRAME = fastline.FRAME
REPLY_READ_BYTES = 64 << 10  # a fast-line reply's first recv (most replies fit whole)
FAST_METHODS = {name: (fastline.METHOD_IDS[name], reply)
                for name, reply in fastline.REPLY_TYPES.items()}
FAST_MAX_IDLE_CONNECTIONS = 8
# The fast-line calls that spin for their reply (transfer/spin_wait.py): those the master
# answers within microseconds, the probes (read from its dicts, no grant) and requests of about
# one key. A batch keeps the master busy longer than a window is worth, and the spinning
# vCPU is then missed by the master and node (batches of 16 x 64 KiB: 0.86x with spinning).
SPIN_METHODS = frozenset({"Exists", "PrefixLen", "Lookup"})
# the other fast-line methods spin when this field holds at most one entry
SPIN_ONE_KEY_FIELD = {"PutStart": "items", "PutEnd": "items", "PutRevoke": "items",
                      "GetReplicas": "keys", "Unpin": "pin_ids"}
_CODES = {code.value[0]: code for code in grpc.StatusCode}

log = logging.getLogger("cellar.client")


class Meanwhile:
    """Work to run while a call's request is with the master, exactly once (the sync face's
    early reads beside GetReplicas, client/early_reads.py): the fast line runs it between its
    request and the reply; gRPC, before the call. Its error is kept for `outcome`, so the
    call's own reply is still read off the line."""

    __slots__ = ("_done", "_error", "_run", "_value")

    def __init__(self, run: Callable[[], Any]) -> None:
        self._run = run
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._value = self._run()
        except BaseException as exc:  # noqa: BLE001 - raised by outcome(), after the reply
            self._error = exc

    def outcome(self) -> Any:
        """What the work returned (run now if the call never got to it); raises its error."""
        self()
        if self._error is not None:
            raise self._error
        return self._value


class _FastLineDown(Exception):
    """The fast line could not carry this call; gRPC will."""


class _LeaderMoved(Exception):
    """An unanswered call was abandoned: etcd names another master as the leader."""


class _FastLine:
    """A pool of persistent connections to the master's fast line; one call per connection at
    a time, so any number of threads may call."""

    def __init__(self, host: str, port: int, tls_ca: str | None = None,
                 spin: SpinWait | None = None) -> None:
        self.address = (host, port)
        self._tls = tls_context(tls_ca)  # over TLS when the master's gRPC port is
        self._spin = spin  # polls for a reply due within microseconds (transfer/spin_wait.py)
        # idle connections with the kernel timeout last set on each (seconds)
        self._idle: list[tuple[socket.socket, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    def call(self, method_id: int, body: bytes, timeout_s: float,
             abandon: Callable[[], bool] | None = None, spin: bool = False,
             meanwhile: Meanwhile | None = None) -> tuple[int, bytes]:
        """(numeric gRPC code, reply bytes). _FastLineDown if nothing could be exchanged, or
        if `abandon()` said to give up on a master that has not answered for
        LEADER_CHECK_AFTER_S (another one leads); TimeoutError if it did not answer in time.
        `meanwhile` runs once the request is sent, before the wait for the reply."""
        with self._lock:
            sock, set_s = self._idle.pop() if self._idle else (None, 0.0)
        try:
            if sock is None:
                sock = socket.create_connection(self.address, timeout=min(timeout_s, 1.0))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._tls is not None:
                    sock = self._tls.wrap_socket(sock, server_hostname=self.address[0])
            # The timeout already set is kept while it is at most 10% shorter or 1% longer
            # (a syscall per call saved when consecutive calls have about the same deadline,
            # as the data plane's bound_io does).
            if not 0.9 * timeout_s <= set_s <= 1.01 * timeout_s:
                sock.settimeout(timeout_s)
                set_s = timeout_s
            sock.sendall(FAST_FRAME.pack(len(body), method_id) + body)
            if meanwhile is not None:
                meanwhile()
            if spin and self._spin is not None and not isinstance(sock, ssl.SSLSocket):
                self._spin.wait(sock)  # TLS may buffer a record: readable says nothing there
            if abandon is not None:
                _await_reply(sock, time.monotonic() + timeout_s, abandon)
            code, data = _recv_reply(sock)
        except TimeoutError:
            if sock is not None:
                sock.close()
            raise
        except (OSError, ValueError) as exc:
            if sock is not None:
                sock.close()
            raise _FastLineDown(str(exc)) from None
        with self._lock:
            if len(self._idle) < FAST_MAX_IDLE_CONNECTIONS and not self._closed:
                self._idle.append((sock, set_s))
                sock = None
        if sock is not None:
            sock.close()
        return code, data

    def close(self) -> None:
        with self._lock:
            self._closed = True  # connections in use are closed when their call returns
            idle, self._idle = self._idle, []
        for sock, _ in idle:
            sock.close()


def _await_reply(sock: socket.socket, deadline: float, abandon: Callable[[], bool]) -> None:
    """Wait for the reply's first byte; every LEADER_CHECK_AFTER_S without one, ask `abandon`
    (a frozen or partitioned master answers nothing, and its successor is known by then)."""
    while True:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise TimeoutError("fast line: no reply in time")
        readable, _, _ = select.select([sock], [], [], min(remaining_s, LEADER_CHECK_AFTER_S))
        if readable:
            return
        if abandon():
            raise OSError("fast line: another master leads now; call abandoned")


def _recv_reply(sock: socket.socket) -> tuple[int, bytes]:
    """(code, body) of one fast-line reply. One recv takes the header and whatever of the body
    has arrived (all of it, for a reply under REPLY_READ_BYTES that is there: one syscall, and
    its poll in timeout mode, instead of two each); the rest is read exactly. More than one
    reply's bytes is a line out of sync (one request at a time per connection)."""
    first = sock.recv(REPLY_READ_BYTES)
    while len(first) < FAST_FRAME.size:
        if not first:
            raise ConnectionError("fast line closed mid-reply")
        first += _recv_exact(sock, FAST_FRAME.size - len(first))
    length, code = FAST_FRAME.unpack_from(first)
    if length > MAX_MESSAGE_BYTES:
        raise ConnectionError(f"fast line reply of {length} bytes")
    body = first[FAST_FRAME.size:]
    if len(body) > length:
        raise ConnectionError("fast line out of sync: bytes past the reply")
    if len(body) < length:
        body += _recv_exact(sock, length - len(body))
    return code, body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    # TLS sockets take no recv flags; they get the loop below
    data = sock.recv(n) if isinstance(sock, ssl.SSLSocket) else sock.recv(n, socket.MSG_WAITALL)
    if len(data) == n:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = sock.recv(n - got)
        if not more:
            raise ConnectionError("fast line closed mid-reply")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),          # retries are ours, bounded by the caller's deadline
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


# Following the leader (module docstring, "Leader changes"): the decisions are cellar.coord.link.
Resolver = Callable[[float], str]
RESOLVE_MIN_INTERVAL_S = MIN_LOOKUP_INTERVAL_S  # at most one etcd lookup per this long
MAX_RETIRED_CHANNELS = 4       # old channels kept open for calls still in flight on them


class _Line:
    """One master address and its gRPC channel; replaced whole when the leader changes, so a
    caller that read `MasterChannel._line` once has a consistent (address, stub) pair."""

    __slots__ = ("address", "channel", "generation", "stub", "tls_ca")

    def __init__(self, address: str, generation: int) -> None:
        self.address = address
        self.channel, self.tls_ca = master_channel(address, CHANNEL_OPTIONS)
        self.stub = cellar_pb2_grpc.MasterStub(self.channel)
        self.generation = generation


def fast_line_address(metadata: Any, master_address: str) -> tuple[str, int] | None:
    """(host, port) of the fast line a ClusterStatus reply's trailing metadata names (on the
    master's own host), or None when it names none or garbage."""
    port = 0
    try:
        for key, value in metadata or ():
            if key == FAST_PORT_METADATA:
                port = int(value)
    except (ValueError, TypeError):
        return None
    if not 0 < port < 65536:
        return None
    return parse_host_port(master_address)[0].strip("[]"), port


def fast_line_refusal(method: str, address: str, code: int, data: bytes) -> str:
    """A fast-line reply whose code is not OK: when gRPC should carry the call instead (a
    retryable status), the leader its text names ("" if none or not a usable address); any
    other status raises the call's error. Both faces read the fast line's refusals so."""
    status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
    details = data.decode("utf-8", "replace")
    if not retryable_grpc(status):
        raise grpc_error(method, address, status, details)
    # A redirect (a standby, a deposed leader): the line goes to the wrong master.
    return leader_from(None, details)


def fast_answer(method: str, address: str, generation: int, code: int, data: bytes,
                reply_cls: Any) -> Replied | Refused:
    """A fast-line exchange as the link's answer (a refusal raises its error unless gRPC
    should carry the call: `fast_line_refusal`)."""
    if code != fastline.OK_CODE:
        return Refused(address, generation, "", fast_line_refusal(method, address, code, data))
    return Replied(address, generation, reply_cls.FromString(data))


class LinkFace(ABC):
    """What both faces keep beside their `LinkState`: the fast line in use and when a lost one
    may be asked for again; the figures `cellar.client.flows` reads (generation, switched_at).
    Each face says how it opens a fast line (`_open_fast`)."""

    _link: LinkState
    _fast: Any
    _fast_relearn_at: float

    @property
    def address(self) -> str:
        return self._link.address

    @property
    def generation(self) -> int:
        """Grows by one with every leader change this channel followed."""
        return self._link.generation

    @property
    def switches(self) -> int:
        """Leader changes followed."""
        return self._link.switches

    @property
    def switched_at(self) -> float:
        """Monotonic time of the last leader change followed."""
        return self._link.switched_at

    @property
    def _fence(self) -> EpochFence:
        return self._link.fence

    def _drop_fast(self, line: Any, relearn_s: float = FAST_RELEARN_S) -> None:
        if self._fast is line:
            self._fast = None
            self._fast_relearn_at = time.monotonic() + relearn_s
        line.close()

    def _learn_fast(self, metadata: Any, address: str, generation: int) -> None:
        """Open the fast line a ClusterStatus reply of the current master names (if new)."""
        where = fast_line_address(metadata, address)
        if where is None or self._link.closed or generation != self._link.generation:
            return
        fast = self._fast
        if fast is None or fast.address != where:
            self._fast = self._open_fast(where[0], where[1])
            if fast is not None:
                fast.close()

    @abstractmethod
    def _open_fast(self, host: str, port: int) -> Any:
        """This face's fast line to `host`:`port` (sync: `_FastLine`; asyncio: its own)."""


def trailing_metadata(exc: grpc.RpcError) -> Any:
    """A gRPC error's trailing metadata, or None (an error raised before any reply has none)."""
    try:
        return exc.trailing_metadata()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an error without metadata is not a redirect
        return None


class MasterChannel(LinkFace):
    """Calls master RPCs by name against an absolute deadline (`time.monotonic()` seconds).

    `resolve` (timeout_s -> the leader's address, "" during an election; raises
    `cellar.Unavailable` when etcd is unreachable) makes etcd the authority on where the
    leader is; without it the channel follows the masters' redirects. `follow=False` talks to
    `address` only and hands back a standby's own ClusterStatus (`cellar status` uses it).
    What to do after each answer is decided by `cellar.coord.link`; this face performs it.
    """

    def __init__(self, address: str, *, fast: bool = True, resolve: Resolver | None = None,
                 follow: bool = True, spin: SpinWait | None = None) -> None:
        self.seed = address
        self._spin = spin  # the fast line's reply wait (transfer/spin_wait.py)
        self._link = LinkState(address, follow=follow, etcd=resolve is not None)
        self._line = _Line(address, 0)
        self._use_fast = fast
        self._fast: _FastLine | None = None
        self._fast_relearn_at = 0.0  # when a lost fast line may be asked for again
        self._resolve = resolve
        self._switch_lock = threading.Lock()
        self._retired: list[grpc.Channel] = []

    def call(self, method: str, request: Any, deadline: float,
             meanwhile: Meanwhile | None = None) -> Any:
        """The reply; `meanwhile` runs once while the master works on the request."""
        stamp(method, request)  # one id for every attempt of this call (client/request_ids.py)
        fast = FAST_METHODS.get(method)
        if fast is not None and self._use_fast:
            line = self._fast
            if line is None and time.monotonic() >= self._fast_relearn_at:
                line = self._relearn(request, deadline)
            if line is not None:
                reply = self._call_fast(line, method, fast, request, deadline, meanwhile)
                if reply is not None:
                    return reply
        if meanwhile is not None:
            meanwhile()
        return self._call_grpc(method, request, deadline, learn=method == "ClusterStatus")

    def _call_fast(self, line: _FastLine, method: str, fast: tuple[int, Any], request: Any,
                   deadline: float, meanwhile: Meanwhile | None = None) -> Any | None:
        """The reply over the fast line, or None when gRPC should carry the call."""
        origin = self._line
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise Timeout(f"{method} to master {origin.address}: timed out")
        method_id, reply_cls = fast
        abandon = None
        if self._resolve is not None and self._link.follow:
            def abandon() -> bool:
                return self._drive(plans.moved_on(self._link, origin.generation, deadline),
                                   deadline)
        field = SPIN_ONE_KEY_FIELD.get(method)
        spin = method in SPIN_METHODS or (field is not None and len(getattr(request, field)) <= 1)
        try:
            code, data = line.call(method_id, request.SerializeToString(), remaining_s, abandon,
                                   spin, meanwhile)
        except TimeoutError:
            raise Timeout(f"{method} to master {origin.address}: timed out") from None
        except _FastLineDown:
            self._drop_fast(line)
            return None
        answer = fast_answer(method, origin.address, origin.generation, code, data, reply_cls)
        return self._drive(plans.fast_reply(self._link, answer, deadline), deadline, fast=line)

    def _relearn(self, request: Any, deadline: float) -> _FastLine | None:
        """Ask ClusterStatus for the fast line's port (once per FAST_RELEARN_S at most)."""
        self._fast_relearn_at = time.monotonic() + FAST_RELEARN_S
        try:
            self._call_grpc("ClusterStatus", pb.ClusterStatusRequest(header=request.header),
                            min(deadline, time.monotonic() + 1.0), learn=True)
        except Exception:  # noqa: BLE001 - the call itself will report through gRPC
            return None
        return self._fast

    def _open_fast(self, host: str, port: int) -> _FastLine:
        return _FastLine(host, port, self._line.tls_ca, self._spin)

    def _call_grpc(self, method: str, request: Any, deadline: float, learn: bool = False) -> Any:
        want_call = learn and self._use_fast
        answer = self._drive(plans.call(self._link, method, deadline), deadline, request,
                             want_call)
        if want_call and hasattr(answer.call, "trailing_metadata"):
            self._learn_fast(answer.call.trailing_metadata(), answer.address, answer.generation)
        return answer.reply

    # ---- performing what the link decides -----------------------------------------------------

    def _drive(self, plan: Plan[Any], deadline: float, request: Any = None,
               want_call: bool = False, fast: _FastLine | None = None) -> Any:
        def perform(effect: Effect) -> Any:
            if isinstance(effect, plans.Attempt):
                return self._attempt(effect, request, deadline, want_call)
            if isinstance(effect, AskEtcd):
                assert self._resolve is not None
                return self._resolve(effect.timeout_s)
            if isinstance(effect, Sleep):
                time.sleep(effect.seconds)
            elif isinstance(effect, Switch):
                self._switch(effect)
            elif isinstance(effect, DropFast):
                assert fast is not None
                self._drop_fast(fast, effect.relearn_s)
            return None
        return plans.run_sync(plan, perform)

    def _attempt(self, attempt: plans.Attempt, request: Any, deadline: float,
                 want_call: bool) -> Replied | Refused | Moved:
        line = self._line
        rpc = getattr(line.stub, attempt.method)
        call = None
        try:
            if self._resolve is not None and self._link.follow:
                reply, call = self._watched(line, rpc, request, attempt.timeout_s, deadline)
            elif want_call:
                reply, call = rpc.with_call(request, timeout=attempt.timeout_s)
            else:
                reply = rpc(request, timeout=attempt.timeout_s)
        except _LeaderMoved as moved:
            return Moved(line.address, line.generation, str(moved))
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = (exc.details() if hasattr(exc, "details") else "") or ""
            if not retryable_grpc(code):
                raise grpc_error(attempt.method, line.address, code, details) from None
            return Refused(line.address, line.generation, details,
                           leader_from(trailing_metadata(exc), details))
        return Replied(line.address, line.generation, reply, call)

    def _watched(self, line: _Line, rpc: Any, request: Any, timeout_s: float,
                 deadline: float) -> tuple[Any, Any]:
        """One gRPC attempt that does not sit out the caller's whole deadline on a master that
        froze or was cut off: while it has no answer, etcd is asked every LEADER_CHECK_AFTER_S;
        once etcd names another leader the attempt is cancelled (that master is deposed, so it
        cannot complete the call later) and `_LeaderMoved` sends the call there."""
        future = rpc.future(request, timeout=timeout_s)
        while True:
            try:
                return future.result(timeout=LEADER_CHECK_AFTER_S), future
            except grpc.FutureTimeoutError:
                if time.monotonic() > deadline + LEADER_CHECK_AFTER_S:  # gRPC's own deadline failed
                    future.cancel()
                    raise Timeout(f"master {line.address}: no answer by the deadline") from None
                if self._drive(plans.moved_on(self._link, line.generation, deadline), deadline):
                    future.cancel()
                    raise _LeaderMoved(f"no answer in {LEADER_CHECK_AFTER_S:g} s and etcd names "
                                       f"{self.address} as the leader") from None

    def _switch(self, switch: Switch) -> None:
        """Send every next call to `switch.target`; the fast line is learned again from it. The
        epoch fence stays: the new leader's epoch is higher, an older master's is refused."""
        with self._switch_lock:
            link = self._link
            if link.generation != switch.from_generation or link.closed:
                return  # another caller switched first, or the channel closed
            old = self._line
            link.switched(switch.target)
            self._line = _Line(switch.target, link.generation)
            self._retired.append(old.channel)
            while len(self._retired) > MAX_RETIRED_CHANNELS:
                self._retired.pop(0).close()
            fast, self._fast = self._fast, None
            self._fast_relearn_at = 0.0
        if fast is not None:
            fast.close()
        log.info("following the master leader: %s -> %s", old.address, switch.target)

    def close(self) -> None:
        self._link.closed = True
        fast, self._fast = self._fast, None
        if fast is not None:
            fast.close()
        with self._switch_lock:
            retired, self._retired = self._retired, []
            line = self._line
        for channel in retired:
            channel.close()
        line.channel.close()


__all__ = [
    "BACKOFF_FIRST_S", "BACKOFF_MAX_S", "CHANNEL_OPTIONS", "FAST_METHODS", "FAST_RELEARN_S",
    "LEADER_CHECK_AFTER_S", "MAX_KNOWN_MASTERS", "MAX_MESSAGE_BYTES", "MAX_RPC_ATTEMPTS",
    "RESOLVE_MIN_INTERVAL_S", "RESOLVE_TIMEOUT_S", "MasterChannel", "Meanwhile", "fast_line_address",
    "fast_line_refusal", "trailing_metadata", "valid_address",
]
