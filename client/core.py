"""The SDK's protocol logic, shared by every face (sync `Client` today, `AsyncClient` later).

What it owns
    Everything about talking to Cellar that does not block: validating arguments, building
    master requests, turning per-key statuses into exceptions, choosing replicas and transports,
    planning `TransferOp`s, verifying checksums, and the two small pieces of shared state a
    client keeps between calls (which nodes failed recently, which pins wait to be released).

    A put or a get of one batch is a small state machine (`PutBatch`, `GetBatch`) that a face
    drives: "give me the next request", "here is the reply", "give me the transfers", "here are
    their results". The face does the I/O (gRPC to the master, `Transport` to the nodes) and
    the waiting, with threads or with asyncio; the machines never do. This is httpx's split:
    one core, several faces.

The invariants
    - A batch never sends more than `max_batch_keys` keys in one RPC; results come back in input
      order, one per key.
    - A put is visible only after PutEnd: a key whose replicas were not all written is revoked,
      never ended. Retries of one key are bounded (`MAX_PUT_ATTEMPTS`).
    - A get hands back only bytes whose xxh3_64 matches the checksum recorded at PutEnd; it tries
      each replica at most once; every pin it was given is queued for release.
    - Every size and offset from the master is checked against the segment table before a buffer
      is sized or sliced from it.

What it must never do
    Block, sleep, or touch a socket; import `cellar.master` or `cellar.storage_node`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import xxhash

from cellar.client.buffers import as_bytes, fresh_bytes, readable_view, reserve_result_memory
from cellar.errors import (
    AlreadyExists,
    BufferTooSmall,
    CellarError,
    IntegrityError,
    InvalidArgument,
    NoSpace,
    NotFound,
    NotReady,
    PermissionDenied,
    QuotaExceeded,
    Status,
    Timeout,
    Unauthenticated,
    Unavailable,
    error_for_status,
)
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE, Grant
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    SegmentRoute,
    TransferOp,
    TransferResult,
    Transport,
)
from cellar.transfer.frame import WriteMeta

# ---- limits -------------------------------------------------------------------------------

DEFAULT_MAX_KEY_BYTES = 1024       # used until the master's ClusterStatus says otherwise
DEFAULT_MAX_BATCH_KEYS = 1024
MAX_TENANT_BYTES = 255
MAX_REPLICAS = 16
MAX_PUT_ATTEMPTS = 3               # first try + two retries on other nodes
MAX_UNPINS_PER_CALL = 4096         # pin ids piggybacked on one GetReplicas / sent in one Unpin
MAX_QUEUED_UNPINS = 8192           # beyond this the caller flushes synchronously
UNPIN_DELAY_S = 0.1                # a queued pin is released within about this long
NODE_UNHEALTHY_S = 3.0             # after a transfer failure, try other replicas first this long
MIN_RETRY_BUDGET_S = 0.05          # no put retry when less time than this is left
ATTEMPT_SHARE = 0.5                # a transfer that can still fall back gets this share ...
MIN_ATTEMPT_S = 1.0                # ... of the time left, but at least this long

# Transfer statuses that say "the node could not be reached", as opposed to "it refused".
NODE_TROUBLE = frozenset({ST_CONNECT_FAILED, ST_CONNECTION_LOST, ST_TIMEOUT})

# Transport names `connect(transport=...)` accepts, and what "auto" tries, best first.
KNOWN_TRANSPORTS = ("tcp", "shm", "rdma")
# "auto": per replica the first that can reach it: shm (same host, file opens), rdma (a device
# here and on the node), tcp. A forced name uses only that transport: a replica it cannot
# reach fails (ST_CONNECT_FAILED "no transport reaches node ..."), so a benchmark of "shm"
# never silently measures tcp.
AUTO_TRANSPORTS = ("shm", "rdma", "tcp")

# Per-key statuses a batched get reports as a miss (None / -1) rather than raising.
MISS_STATUSES = frozenset({Status.NOT_FOUND, Status.NOT_READY, Status.UNAVAILABLE,
                           Status.EXPIRED})


@dataclass(frozen=True, slots=True)
class Limits:
    """What the master enforces, learned from ClusterStatus at connect."""

    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_batch_keys: int = DEFAULT_MAX_BATCH_KEYS
    max_object_bytes: int = 0  # the largest object placeable when we asked (0 = unknown)

    @classmethod
    def from_status(cls, reply: Any) -> Limits:
        return cls(
            max_key_bytes=int(reply.max_key_bytes) or DEFAULT_MAX_KEY_BYTES,
            max_batch_keys=int(reply.max_batch_keys) or DEFAULT_MAX_BATCH_KEYS,
            max_object_bytes=int(reply.max_object_bytes),
        )


# ---- argument validation ------------------------------------------------------------------

def validate_key(key: Any, max_key_bytes: int, what: str = "key") -> str:
    if not isinstance(key, str):
        raise InvalidArgument(f"{what} must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidArgument(f"{what} must not be empty")
    try:
        nbytes = len(key.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid Unicode (lone surrogate?)") from None
    if nbytes > max_key_bytes:
        raise InvalidArgument(f"{what} is {nbytes} bytes in UTF-8, over the limit of {max_key_bytes}")
    return key


def validate_keys(keys: Any, max_key_bytes: int) -> list[str]:
    """A list of valid keys from any iterable of str (a lone str is refused, not iterated)."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)) or not isinstance(keys, Iterable):
        raise InvalidArgument(f"keys must be a sequence of str, not {type(keys).__name__}")
    return [validate_key(k, max_key_bytes, f"keys[{i}]") for i, k in enumerate(keys)]


def validate_replicas(replicas: Any) -> int:
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise InvalidArgument(f"replicas must be an int, not {type(replicas).__name__}")
    if not 1 <= replicas <= MAX_REPLICAS:
        raise InvalidArgument(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas}")
    return replicas


def validate_value(value: Any, what: str = "value") -> memoryview:
    """A put source as a flat byte view; zero-length values are refused.

    Cellar stores no empty objects: an object is one contiguous range per replica, and an empty
    range could not be placed, recorded in a node's index or rebuilt after a master restart.
    """
    view = readable_view(value, what)
    if view.nbytes == 0:
        raise InvalidArgument(f"{what} is empty; Cellar stores values of at least 1 byte")
    return view


def normalize_items(items: Any, max_key_bytes: int) -> list[tuple[str, memoryview]]:
    """`put_many` items (a mapping or a sequence of (key, value) pairs) as checked pairs."""
    if isinstance(items, Mapping):
        pairs: Iterable[Any] = items.items()
    elif isinstance(items, (str, bytes, bytearray, memoryview)) or not isinstance(items, Iterable):
        raise InvalidArgument(
            f"items must be a mapping or a sequence of (key, value) pairs, not {type(items).__name__}")
    else:
        pairs = items
    out: list[tuple[str, memoryview]] = []
    seen: set[str] = set()
    for i, pair in enumerate(pairs):
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidArgument(f"items[{i}] must be a (key, value) pair")
        key = validate_key(pair[0], max_key_bytes, f"items[{i}] key")
        if key in seen:
            raise InvalidArgument(f"items[{i}]: key {key!r} appears twice in one batch")
        seen.add(key)
        out.append((key, validate_value(pair[1], f"value of {key!r}")))
    return out


def validate_tenant(tenant: Any) -> str:
    if not isinstance(tenant, str) or not tenant:
        raise InvalidArgument("tenant must be a non-empty str")
    if len(tenant.encode(errors="replace")) > MAX_TENANT_BYTES:
        raise InvalidArgument(f"tenant is over {MAX_TENANT_BYTES} bytes")
    return tenant


def validate_timeout(timeout_s: Any) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise InvalidArgument(f"timeout_s must be a number, not {type(timeout_s).__name__}")
    if not 0 < timeout_s < 1e6:
        raise InvalidArgument(f"timeout_s must be positive, got {timeout_s}")
    return float(timeout_s)


def transport_names(choice: Any) -> tuple[str, ...]:
    """The transports to open for `connect(transport=choice)`, in preference order."""
    if not isinstance(choice, str):
        raise InvalidArgument(f"transport must be a str, not {type(choice).__name__}")
    if choice == "auto":
        return AUTO_TRANSPORTS
    if choice in KNOWN_TRANSPORTS:
        return (choice,)
    raise InvalidArgument(
        f"unknown transport {choice!r}; use 'auto' or one of {', '.join(KNOWN_TRANSPORTS)}")


def batch_ranges(count: int, max_batch: int) -> Iterator[range]:
    """Index ranges covering [0, count) in order, each at most max_batch long."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    for start in range(0, count, max_batch):
        yield range(start, min(start + max_batch, count))


def attempt_budget_s(remaining_s: float, can_fall_back: bool) -> float:
    """Time one transfer round may take: all that is left, or a share of it when another
    replica or node could still be tried, so one stalled node cannot eat the whole deadline."""
    if not can_fall_back:
        return remaining_s
    return min(remaining_s, max(MIN_ATTEMPT_S, remaining_s * ATTEMPT_SHARE))


def checksum(view: memoryview) -> int:
    """The object checksum recorded at PutEnd and verified on every read."""
    return xxhash.xxh3_64_intdigest(view)


# ---- errors -------------------------------------------------------------------------------

_STATUS_BY_VALUE: dict[Any, Status] = dict(Status._value2member_map_)  # type: ignore[arg-type]


def to_status(value: int) -> Status:
    # One dict lookup: Status(value) costs ~0.8 us through the enum machinery, per key.
    try:
        return _STATUS_BY_VALUE[value]
    except (KeyError, TypeError):
        pass
    try:
        return Status(value)
    except ValueError:
        return Status.INTERNAL


def status_error(status: int, message: str = "", key: str | None = None) -> CellarError:
    """The exception a non-OK per-key status stands for, naming the key."""
    st = to_status(status)
    text = message or st.name.lower().replace("_", " ")
    if key is not None:
        text = f"{key!r}: {text}"
    return error_for_status(st, text)


_GRPC_ERRORS: dict[grpc.StatusCode, type[CellarError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Timeout,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.FAILED_PRECONDITION: NotReady,
}


def grpc_error(method: str, address: str, code: grpc.StatusCode | None, details: str) -> CellarError:
    """The exception for a failed master RPC; keeps the server's message."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        cls: type[CellarError] = NoSpace if "space" in details.lower() else QuotaExceeded
        if "message" in details.lower() and "larger than" in details.lower():
            cls = InvalidArgument  # gRPC's own message size limit
    else:
        cls = _GRPC_ERRORS.get(code, CellarError) if code is not None else CellarError
    if code == grpc.StatusCode.INVALID_ARGUMENT and details:
        return cls(details)
    name = code.name if code is not None else "UNKNOWN"
    return cls(f"{method} to master {address}: {name}" + (f": {details}" if details else ""))


def retryable_grpc(code: grpc.StatusCode | None) -> bool:
    """Codes that mean 'the master was not reached (yet)': connection refused, restarting."""
    return code == grpc.StatusCode.UNAVAILABLE


# ---- requests and replies -----------------------------------------------------------------

def routes_from_segments(segments: Iterable[Any]) -> dict[int, tuple[SegmentRoute, int]]:
    """segment_id -> (route, segment size in bytes) from a reply's `segments` table."""
    routes: dict[int, tuple[SegmentRoute, int]] = {}
    for seg in segments:
        endpoints = {ep.transport: ep.address for ep in seg.endpoints}
        route = SegmentRoute(int(seg.segment_id), seg.node_id, seg.host_id, endpoints)
        routes[int(seg.segment_id)] = (route, int(seg.size_bytes))
    return routes


def grant_from_replica(replica: Any, op: int) -> Grant:
    """The proto grant of a replica as the data plane's `Grant` (range = the replica's range)."""
    g = replica.grant
    return Grant(int(g.op) or op, int(replica.segment_id), int(replica.offset),
                 int(replica.length), int(g.alloc_id), int(g.epoch), int(g.expiry_ms),
                 int(g.key_tag), bytes(g.mac))


def _check_range(replica: Any, routes: Mapping[int, tuple[SegmentRoute, int]],
                 size: int) -> tuple[SegmentRoute | None, str]:
    """The route of a replica whose range is sane, or None and why not."""
    entry = routes.get(int(replica.segment_id))
    if entry is None:
        return None, f"segment {replica.segment_id} missing from the reply's segment table"
    route, segment_bytes = entry
    if int(replica.length) != size:
        return None, f"replica length {replica.length} != object size {size}"
    if int(replica.offset) + size > segment_bytes:
        return None, (f"replica [{replica.offset}, +{size}) outside segment {replica.segment_id} "
                      f"of {segment_bytes} bytes")
    return route, ""


def status_to_dict(reply: Any) -> dict[str, Any]:
    """ClusterStatusReply as plain data: totals, segments, nodes (aggregated), tenants."""
    segments = []
    nodes: dict[str, dict[str, Any]] = {}
    for s in reply.segments:
        info = s.info
        state = pb.NodeState.Name(s.state).removeprefix("NODE_STATE_")
        endpoints = {ep.transport: ep.address for ep in info.endpoints}
        segments.append({
            "segment_id": int(info.segment_id), "node_id": info.node_id, "host_id": info.host_id,
            "state": state, "size_bytes": int(info.size_bytes), "used_bytes": int(s.used_bytes),
            "object_count": int(s.object_count), "endpoints": endpoints,
        })
        node = nodes.setdefault(info.node_id, {
            "node_id": info.node_id, "host_id": info.host_id, "state": state, "segments": 0,
            "capacity_bytes": 0, "used_bytes": 0, "object_count": 0, "endpoints": endpoints,
        })
        node["segments"] += 1
        node["capacity_bytes"] += int(info.size_bytes)
        node["used_bytes"] += int(s.used_bytes)
        node["object_count"] += int(s.object_count)
    tenants = [{
        "name": t.name, "used_bytes": int(t.used_bytes), "quota_bytes": int(t.quota_bytes),
        "object_count": int(t.object_count), "quota_objects": int(t.quota_objects),
    } for t in reply.tenants]
    return {
        "role": reply.role, "leader_address": reply.leader_address,
        "epoch": int(reply.header.epoch),
        "capacity_bytes": int(reply.capacity_bytes), "used_bytes": int(reply.used_bytes),
        "object_count": int(reply.object_count),
        "max_key_bytes": int(reply.max_key_bytes),
        "max_object_bytes": int(reply.max_object_bytes),
        "max_batch_keys": int(reply.max_batch_keys),
        "segments": segments, "nodes": list(nodes.values()), "tenants": tenants,
    }


def check_result_count(method: str, got: int, sent: int) -> None:
    if got != sent:
        raise CellarError(f"{method}: master returned {got} results for {sent} keys")


# ---- shared client state ------------------------------------------------------------------

class NodeHealth:
    """Nodes that failed a transfer recently; their replicas are tried last for a while."""

    def __init__(self, unhealthy_s: float = NODE_UNHEALTHY_S) -> None:
        self._unhealthy_s = unhealthy_s
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def mark_failed(self, node_id: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._until[node_id] = now + self._unhealthy_s

    def unhealthy(self, now: float | None = None) -> set[str]:
        now = time.monotonic() if now is None else now
        with self._lock:
            expired = [n for n, t in self._until.items() if t <= now]
            for n in expired:
                del self._until[n]
            return set(self._until)

    def order(self, replicas: Sequence[Any], now: float | None = None) -> list[Any]:
        """Replicas with healthy nodes first, each group in the master's order."""
        bad = self.unhealthy(now)
        if not bad:
            return list(replicas)
        return ([r for r in replicas if r.node_id not in bad]
                + [r for r in replicas if r.node_id in bad])


class UnpinQueue:
    """Pin ids waiting to be released: they ride on the next GetReplicas, or a flusher sends
    them after `UNPIN_DELAY_S`. Bounded: past `capacity` the oldest are dropped (the master's
    pin TTL releases those), and `add` tells the caller to flush at once."""

    def __init__(self, capacity: int = MAX_QUEUED_UNPINS) -> None:
        self._capacity = capacity
        self._ids: collections.deque[int] = collections.deque()
        self._oldest_t: float | None = None
        self._cond = threading.Condition()
        self._closed = False
        self.dropped = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._ids)

    def add(self, pin_ids: Iterable[int], now: float | None = None) -> bool:
        """Queue pins; True when the queue is full enough that the caller should flush now."""
        ids = [p for p in pin_ids if p]
        if not ids:
            return False
        now = time.monotonic() if now is None else now
        with self._cond:
            if not self._ids:
                self._oldest_t = now
            self._ids.extend(ids)
            while len(self._ids) > 2 * self._capacity:
                self._ids.popleft()
                self.dropped += 1
            self._cond.notify_all()
            return len(self._ids) >= self._capacity

    def drain(self, max_ids: int = MAX_UNPINS_PER_CALL) -> list[int]:
        with self._cond:
            n = min(max_ids, len(self._ids))
            out = [self._ids.popleft() for _ in range(n)]
            self._oldest_t = time.monotonic() if self._ids else None
            return out

    def requeue(self, pin_ids: Sequence[int]) -> None:
        """Put back ids whose carrier call failed (ahead of newer ones)."""
        if not pin_ids:
            return
        with self._cond:
            self._ids.extendleft(reversed(pin_ids))
            while len(self._ids) > 2 * self._capacity:
                self._ids.pop()
                self.dropped += 1
            if self._oldest_t is None:
                self._oldest_t = time.monotonic()
            self._cond.notify_all()

    def wait_due(self, delay_s: float = UNPIN_DELAY_S) -> bool:
        """Block until the oldest queued pin is `delay_s` old; False once closed."""
        with self._cond:
            while not self._closed:
                if self._oldest_t is None:
                    self._cond.wait()
                    continue
                remaining = self._oldest_t + delay_s - time.monotonic()
                if remaining <= 0:
                    return True
                self._cond.wait(remaining)
            return False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class EpochFence:
    """Refuses replies from a master older than one already heard from (a deposed leader)."""

    def __init__(self) -> None:
        self.highest = 0
        self._lock = threading.Lock()

    def check(self, epoch: int, address: str) -> None:
        with self._lock:
            if epoch >= self.highest:
                self.highest = epoch
                return
            highest = self.highest
        raise Unavailable(f"master {address} answered with epoch {epoch}, older than {highest}: "
                          "it is no longer the leader")


class TransportSet:
    """The transports a client opened, in preference order; picks one per segment route."""

    def __init__(self, transports: Sequence[Transport]) -> None:
        self.transports = list(transports)

    def pick(self, route: SegmentRoute) -> Transport | None:
        for transport in self.transports:
            if transport.can_reach(route):
                return transport
        return None

    def assign(self, ops: Sequence[TransferOp]) -> tuple[list[tuple[Transport, list[int]]], list[int]]:
        """Group op indexes by the transport that will move them; also the unreachable ones."""
        groups: dict[int, tuple[Transport, list[int]]] = {}
        unreachable: list[int] = []
        for i, op in enumerate(ops):
            transport = self.pick(op.route)
            if transport is None:
                unreachable.append(i)
            else:
                groups.setdefault(id(transport), (transport, []))[1].append(i)
        return list(groups.values()), unreachable

    def forget(self, route: SegmentRoute) -> None:
        for transport in self.transports:
            transport.forget(route)

    def close(self) -> None:
        for transport in self.transports:
            transport.close()


# ---- put ----------------------------------------------------------------------------------

@dataclass(slots=True)
class PutEntry:
    key: str
    value: memoryview
    checksum: int | None             # xxh3_64 of value; None until hashed (hash_values)
    status: Status | None = None     # final outcome; None while in flight
    message: str = ""
    attempts: int = 0
    put_id: int = 0
    avoid_node_ids: set[str] = field(default_factory=set)  # nodes this put failed to reach
    health_avoid: bool = True        # also avoid nodes other calls saw fail (dropped if it hurts)
    health_avoided: bool = False     # the last PutStart avoided such nodes

    def error(self) -> CellarError:
        assert self.status is not None and self.status != Status.OK
        return status_error(self.status, self.message, self.key)


class PutBatch:
    """One batch of keys through PutStart -> replica writes -> PutEnd / PutRevoke, retrying a
    key whose write failed on other nodes (PutStart with `avoid_node_ids`), at most
    `max_attempts` times per key."""

    def __init__(self, entries: list[PutEntry], *, tenant: str, replicas: int, soft_pin: bool,
                 upsert: bool, health: NodeHealth, max_attempts: int = MAX_PUT_ATTEMPTS) -> None:
        self.entries = entries
        self._tenant = tenant
        self._replicas = replicas
        self._soft_pin = soft_pin
        self._upsert = upsert
        self._health = health
        self._max_attempts = max_attempts
        self._inflight: list[int] = []       # entry indexes of the last PutStart, in order
        self._started: list[int] = []        # ... of those that got placements
        self._bad_placement: dict[int, str] = {}
        self._op_owner: list[int] = []       # entry index per planned op
        self._ending: list[int] = []         # entry indexes of the last PutEnd, in order
        self._planned: list[TransferOp] = []
        self._start_epoch = 0                # master epoch that answered the last PutStart

    @property
    def done(self) -> bool:
        return all(e.status is not None for e in self.entries)

    def start_request(self, header: Any) -> Any | None:
        """The next PutStart for every key still in flight, or None when all are settled."""
        pending = [i for i, e in enumerate(self.entries) if e.status is None]
        if not pending:
            return None
        unhealthy = self._health.unhealthy()
        items = []
        PutItem = pb.PutItem
        # Flags that are set, once: a field at its default is not serialized anyway, and
        # every keyword costs the protobuf constructor time (this runs once per key).
        flags = {name: True for name, on in (("soft_pin", self._soft_pin),
                                             ("upsert", self._upsert)) if on}
        replicas = self._replicas
        for i in pending:
            e = self.entries[i]
            e.attempts += 1
            if not e.avoid_node_ids and not unhealthy:  # the common case, kept lean
                e.health_avoided = False
                items.append(PutItem(key=e.key, size_bytes=e.value.nbytes, replicas=replicas,
                                     **flags))
                continue
            avoid = set(e.avoid_node_ids)
            e.health_avoided = e.health_avoid and bool(unhealthy - avoid)
            if e.health_avoid:
                avoid |= unhealthy
            items.append(PutItem(key=e.key, size_bytes=e.value.nbytes, replicas=replicas,
                                 avoid_node_ids=sorted(avoid), **flags))
        self._inflight = pending
        return pb.PutStartRequest(header=header, items=items)

    def on_start_reply(self, reply: Any) -> list[TransferOp]:
        """Settle refused keys; plan one write per replica of every placed key."""
        check_result_count("PutStart", len(reply.results), len(self._inflight))
        self._start_epoch = int(reply.header.epoch)
        routes = routes_from_segments(reply.segments)
        ops: list[TransferOp] = []
        self._op_owner = []
        self._started = []
        self._bad_placement = {}
        tenant = self._tenant
        entries = self.entries
        started, owners = self._started, self._op_owner
        # Once per key: each proto field is read once, the common OK case tested on the raw int.
        for i, res in zip(self._inflight, reply.results, strict=True):
            e = entries[i]
            if res.status:  # not OK
                status = to_status(res.status)
                if (status in (Status.UNAVAILABLE, Status.NO_SPACE) and e.health_avoided
                        and e.attempts < self._max_attempts):
                    e.health_avoid = False  # the nodes we shunned may be fine: ask again
                    continue
                earlier = f" (earlier attempt: {e.message})" if e.message else ""
                e.status, e.message = status, (res.message or status.name.lower()) + earlier
                continue
            e.put_id = int(res.put_id)
            started.append(i)
            replicas = res.replicas
            if not replicas:
                self._bad_placement[i] = "master placed no replica"
                continue
            value = e.value
            size = value.nbytes
            if e.checksum is None:  # not hashed while PutStart was in flight
                e.checksum = checksum(value)
            meta = WriteMeta(e.checksum, size, tenant, e.key)
            planned: list[TransferOp] = []
            for rep in replicas:
                # _check_range and grant_from_replica, inlined: this runs once per key
                segment_id = rep.segment_id
                entry = routes.get(segment_id)
                offset, length = rep.offset, rep.length
                if entry is None or length != size or offset + size > entry[1]:
                    _route, why = _check_range(rep, routes, size)
                    self._bad_placement[i] = why
                    break
                g = rep.grant
                planned.append(TransferOp(entry[0], Grant(g.op or GRANT_OP_WRITE, segment_id,
                                                          offset, length, g.alloc_id, g.epoch,
                                                          g.expiry_ms, g.key_tag, g.mac),
                                          offset, value, meta))
            else:
                ops.extend(planned)
                owners.extend([i] * len(planned))
        self._planned = ops
        return ops

    def can_retry(self) -> bool:
        """Whether a key of the current round could still be retried after a failed write."""
        return any(self.entries[i].attempts < self._max_attempts for i in self._started)

    def on_write_results(self, results: Sequence[TransferResult], *,
                         may_retry: bool) -> tuple[Any | None, Any | None]:
        """(PutEnd items, PutRevoke items) after the writes; failed keys stay in flight when
        they may be retried on other nodes."""
        check_result_count("write", len(results), len(self._op_owner))
        failures: dict[int, list[str]] = {}
        for op, i, res in zip(self._planned, self._op_owner, results, strict=True):
            if res.ok:
                continue
            node = op.route.node_id
            failures.setdefault(i, []).append(f"node {node}: {res}")
            if res.status in NODE_TROUBLE:
                self.entries[i].avoid_node_ids.add(node)
                self._health.mark_failed(node)
        end_items, revoke_items = [], []
        self._ending = []
        for i in self._started:
            e = self.entries[i]
            if i in self._bad_placement:
                revoke_items.append(pb.PutRef(key=e.key, put_id=e.put_id))
                e.status, e.message = Status.INTERNAL, f"bad placement: {self._bad_placement[i]}"
            elif i in failures:
                revoke_items.append(pb.PutRef(key=e.key, put_id=e.put_id))
                e.message = "write failed: " + "; ".join(failures[i])
                if not (may_retry and e.attempts < self._max_attempts):
                    e.status = Status.UNAVAILABLE
            else:
                end_items.append(pb.PutEndItem(key=e.key, put_id=e.put_id, checksum=e.checksum))
                self._ending.append(i)
        return end_items or None, revoke_items or None

    def on_end_reply(self, reply: Any) -> None:
        check_result_count("PutEnd", len(reply.results), len(self._ending))
        # A master that restarted between PutStart and PutEnd never heard of the put: the key
        # is written again from the start (new placement) rather than reported as NOT_FOUND.
        master_changed = int(reply.header.epoch) != self._start_epoch
        for i, res in zip(self._ending, reply.results, strict=True):
            e = self.entries[i]
            status = to_status(res.status)
            if master_changed and status != Status.OK:
                if e.attempts < self._max_attempts:
                    continue  # still unsettled: the next start_request places it again
                status = Status.UNAVAILABLE
                e.message = "the master restarted during the put; retry"
                e.status = status
                continue
            e.status, e.message = status, res.message
        self._ending = []

    def abandon(self, message: str) -> list[Any]:
        """Settle every key in flight as UNAVAILABLE; the PutRefs to revoke."""
        refs = []
        for i in self._started:
            e = self.entries[i]
            if e.status is None or i in self._ending:
                refs.append(pb.PutRef(key=e.key, put_id=e.put_id))
        for e in self.entries:
            if e.status is None:
                e.status, e.message = Status.UNAVAILABLE, message
        return refs


def put_entries(pairs: Sequence[tuple[str, memoryview]]) -> list[PutEntry]:
    """Entries for (key, value) pairs, checksums left for `hash_values` (or, at the latest,
    `PutBatch.on_start_reply`) to compute."""
    return [PutEntry(key, view, None) for key, view in pairs]


def hash_values(entries: Sequence[PutEntry]) -> None:
    """Compute the checksums still missing (xxh3 releases the GIL: a helper thread can hash
    while the caller waits for PutStart, which needs only the sizes)."""
    for e in entries:
        if e.checksum is None:
            e.checksum = checksum(e.value)


def unhashed_bytes(entries: Sequence[PutEntry]) -> int:
    return sum(e.value.nbytes for e in entries if e.checksum is None)


# ---- get ----------------------------------------------------------------------------------

@dataclass(slots=True)
class GetEntry:
    key: str
    dest: memoryview | None           # the caller's buffer, or None to allocate one
    status: Status | None = None      # final outcome; None while in flight
    message: str = ""
    size: int = -1
    checksum: int = 0
    view: memoryview | None = None    # where this object's bytes land (size bytes)
    result: Any = None                # the object `view` fills when the batch allocates
    candidates: list[tuple[SegmentRoute, Grant, int]] = field(default_factory=list)
    tried: int = 0
    corrupt: int = 0                  # replicas that failed their checksum
    failures: list[str] = field(default_factory=list)

    def error(self) -> CellarError:
        assert self.status is not None and self.status != Status.OK
        if self.corrupt:
            return IntegrityError(f"{self.key!r}: no replica passed its checksum "
                                  f"({'; '.join(self.failures)})")
        return status_error(self.status, self.message, self.key)

    @property
    def is_miss(self) -> bool:
        return self.status in MISS_STATUSES and not self.corrupt


class GetBatch:
    """One batch of keys through GetReplicas -> one replica read per key (falling back to the
    next replica on a transfer error or checksum mismatch) -> pins queued for release."""

    def __init__(self, keys: Sequence[str], dests: Sequence[memoryview] | None, *,
                 health: NodeHealth, allocate: Any = fresh_bytes) -> None:
        if dests is not None and len(dests) != len(keys):
            raise InvalidArgument(f"{len(keys)} keys but {len(dests)} buffers")
        self.entries = [GetEntry(k, None if dests is None else dests[i]) for i, k in enumerate(keys)]
        self.pin_ids: list[int] = []
        self._health = health
        self._allocate = allocate
        self._op_owner: list[int] = []
        self._planned: list[TransferOp] = []

    def request(self, header: Any, unpin_ids: Sequence[int] = ()) -> Any:
        return pb.GetReplicasRequest(header=header, keys=[e.key for e in self.entries],
                                     unpin_ids=list(unpin_ids))

    def on_reply(self, reply: Any) -> None:
        """Record pins and sizes, order replicas; BufferTooSmall before any transfer starts."""
        results = reply.results
        check_result_count("GetReplicas", len(results), len(self.entries))
        self.pin_ids = [r.pin_id for r in results if r.pin_id]
        routes = routes_from_segments(reply.segments)
        bad = self._health.unhealthy()  # once per batch, not per key
        too_small: GetEntry | None = None
        for e, res in zip(self.entries, results, strict=True):
            if res.status:
                e.status, e.message = to_status(res.status), res.message
                continue
            size = e.size = res.size_bytes
            e.checksum = res.checksum
            replicas = res.replicas
            if bad and len(replicas) > 1:
                replicas = ([r for r in replicas if r.node_id not in bad]
                            + [r for r in replicas if r.node_id in bad])
            candidates = e.candidates
            for rep in replicas:
                # _check_range and grant_from_replica, inlined: this runs once per key
                entry = routes.get(rep.segment_id)
                offset, length = rep.offset, rep.length
                if entry is None or length != size or offset + size > entry[1]:
                    route, why = _check_range(rep, routes, size)
                    e.failures.append(f"node {rep.node_id}: {why}")
                    continue
                g = rep.grant
                candidates.append((entry[0], Grant(g.op or GRANT_OP_READ, rep.segment_id, offset,
                                                   length, g.alloc_id, g.epoch, g.expiry_ms,
                                                   g.key_tag, g.mac), offset))
            if not candidates:
                e.status = Status.UNAVAILABLE
                e.message = "no usable replica" + (f" ({'; '.join(e.failures)})" if e.failures else "")
                continue
            if e.dest is not None and e.dest.nbytes < e.size and too_small is None:
                too_small = e
        if too_small is not None:
            assert too_small.dest is not None
            raise BufferTooSmall(
                f"buffer for {too_small.key!r} holds {too_small.dest.nbytes} bytes; the object "
                f"is {too_small.size} bytes", needed_bytes=too_small.size)
        if self._allocate is fresh_bytes:  # results this batch allocates stay reusable
            reserve_result_memory(sum(e.size for e in self.entries
                                      if e.status is None and e.dest is None))
        for e in self.entries:
            if e.status is None:
                if e.dest is not None:
                    e.view = e.dest[:e.size]
                else:
                    e.result, e.view = self._allocate(e.size)
                if e.size == 0:
                    e.status = Status.OK

    def next_ops(self) -> list[TransferOp]:
        """One read per unsettled key from its next untried replica; [] when all are settled."""
        ops: list[TransferOp] = []
        owners: list[int] = []
        for i, e in enumerate(self.entries):
            if e.status is not None:
                continue
            if e.tried >= len(e.candidates):
                e.status = Status.INTERNAL if e.corrupt else Status.UNAVAILABLE
                e.message = "no replica could be read: " + "; ".join(e.failures)
                continue
            route, grant, offset = e.candidates[e.tried]
            assert e.view is not None
            ops.append(TransferOp(route, grant, offset, e.view, None, True))
            owners.append(i)
        self._planned, self._op_owner = ops, owners
        return ops

    def can_fall_back(self) -> bool:
        """Whether a key of the current round has another replica to try after this one."""
        return any(self.entries[i].tried + 1 < len(self.entries[i].candidates)
                   for i in self._op_owner)

    def on_read_results(self, results: Sequence[TransferResult]) -> None:
        check_result_count("read", len(results), len(self._op_owner))
        for op, i, res in zip(self._planned, self._op_owner, results, strict=True):
            e = self.entries[i]
            e.tried += 1
            node = op.route.node_id
            if not res.ok:
                e.failures.append(f"node {node}: {res}")
                if res.status in NODE_TROUBLE:
                    self._health.mark_failed(node)
                continue
            assert e.view is not None
            got = res.checksum if res.checksum is not None else checksum(e.view)
            if got == e.checksum:
                e.status = Status.OK
            else:
                e.corrupt += 1
                e.failures.append(f"node {node}: checksum mismatch")
        self._planned, self._op_owner = [], []


def take_value(entry: GetEntry) -> bytes:
    """The bytes an allocating get read for `entry`; its view is released first, so nothing
    can write into the returned object afterwards."""
    assert entry.status == Status.OK and entry.view is not None
    view, value = entry.view, entry.result
    entry.view = entry.result = None
    try:
        view.release()
    except BufferError:  # something still holds the storage: hand out a copy instead
        return bytes(view)
    return as_bytes(value)


def release_views(entries: Iterable[GetEntry]) -> None:
    """Drop every view an allocating get still holds (on errors and misses)."""
    for e in entries:
        if e.view is not None and e.dest is None:
            e.view.release()
        e.view = None
        e.result = None


def miss_or_raise(entry: GetEntry) -> None:
    """For batched gets: return quietly for a miss, raise for anything worse."""
    if entry.status != Status.OK and not entry.is_miss:
        raise entry.error()
