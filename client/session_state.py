"""The SDK's shared, I/O-free pieces: reply decoding and the state a client keeps between calls.

The room (both faces, `Client` and `AsyncClient`, drive the same sans-I/O code, as httpx's
two clients share one core):
    - `checks`   argument validation and the client's limits
    - `statuses` per-key statuses, MISS/LATE, status and gRPC code -> exception
    - `core`     (this module) reply decoding (segment routes, grants, the status summary) and
                 the shared state: `NodeHealth`, `DiskReadRates`, `UnpinQueue`,
                 `TransportSet` (`EpochFence`
                 lives with the master link's decisions, `cellar.coord.link`)
                 (which transport moves which op, and how one transfer round is budgeted)
    - `puts`     the put state machine (`PutBatch`)
    - `gets`     the get state machine (`GetBatch`) and its deadline-bounded form
    - `flows`    every public operation as a generator of I/O requests (`Rpc`, `Move`,
                 `Sleep`, `Release`) that a face performs: failover rounds, probes, removal

The invariants
    - Every size and offset from the master is checked against the segment table before a buffer
      is sized or sliced from it.
    - The shared state is safe to use from many threads at once (its own small locks; the faces
      add none around it) and from one event loop.

What it must never do
    Block, sleep, or touch a socket; import `cellar.master` or `cellar.storage_node`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cellar.client.checks import (
    DISK_RATE_WEIGHT,
    DISK_READ_LATENCY_S,
    DISK_READ_PRIOR_BYTES_PER_S,
    MAX_DISK_RATE_NODES,
    MAX_QUEUED_UNPINS,
    MAX_UNPINS_PER_CALL,
    MIN_DISK_ROUND_S,
    NODE_TROUBLE,
    NODE_UNHEALTHY_S,
    UNPIN_DELAY_S,
    attempt_budget_s,
)
from cellar.client.statuses import check_result_count
from cellar.coord.link import EpochFence as EpochFence  # its home is the master link
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import Grant
from cellar.proto.tiers import (
    MOVE_COUNTERS,
    TIER_DISK,
    TIER_NAMES,
    merge_tier_stats,
    tier_totals,
)
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    SegmentRoute,
    TransferOp,
    TransferResult,
    hash_views,
)


def routes_from_segments(segments: Iterable[Any]) -> dict[int, tuple[SegmentRoute, int]]:
    """segment_id -> (route, segment size in bytes) from a reply's `segments` table."""
    routes: dict[int, tuple[SegmentRoute, int]] = {}
    for seg in segments:
        endpoints = {ep.transport: ep.address for ep in seg.endpoints}
        route = SegmentRoute(int(seg.segment_id), seg.node_id, seg.host_id, endpoints)
        routes[int(seg.segment_id)] = (route, int(seg.size_bytes))
    return routes


def disk_segment_ids(segments: Iterable[Any]) -> frozenset[int]:
    """The ids of the disk-tier segments in a reply's `segments` table."""
    return frozenset(int(seg.segment_id) for seg in segments if seg.tier == TIER_DISK)


def grant_from_replica(replica: Any, op: int) -> Grant:
    """The proto grant of a replica as the data plane's `Grant` (range = the replica's range).
    Proto fields are already int and bytes: no conversions on this per-replica path."""
    g = replica.grant
    return Grant(g.op or op, replica.segment_id, replica.offset, replica.length, g.alloc_id,
                 g.epoch, g.expiry_ms, g.key_tag, g.mac)


def check_range(replica: Any, routes: Mapping[int, tuple[SegmentRoute, int]],
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


def replica_grant(replica: Any, routes: Mapping[int, tuple[SegmentRoute, int]], size: int,
                  op: int) -> tuple[SegmentRoute, Grant] | str:
    """The route and grant of a replica whose range is sane (`check_range`), else why not; the
    one check puts and gets make per replica. Measured (timeit, Python 3.11, the 2-core dev
    box, min of 21 interleaved runs of 50,000): this call costs 0.13 us per replica more than
    the inlined copy puts.py and gets.py had (1.36 vs 1.23 us), against about 65 us per key of
    a batched 64 KiB get (15,978 ops/s, bench/results/2026-11-29-vm.md): 0.2%, not worth a
    second copy of the rule."""
    entry = routes.get(replica.segment_id)
    if entry is None or replica.length != size or replica.offset + size > entry[1]:
        return check_range(replica, routes, size)[1]
    return entry[0], grant_from_replica(replica, op)


def status_to_dict(reply: Any) -> dict[str, Any]:
    """ClusterStatusReply as plain data: totals, segments, nodes (aggregated), tenants, tiers
    (use from the segment rows, traffic and moves from tier_stats and tier_moves)."""
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
            "tier": TIER_NAMES.get(int(info.tier), "unknown"),
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
        "quarantined_bytes": int(t.quarantined_bytes),
    } for t in reply.tenants]
    return {
        "role": reply.role, "leader_address": reply.leader_address,
        "epoch": int(reply.header.epoch),
        "capacity_bytes": int(reply.capacity_bytes), "used_bytes": int(reply.used_bytes),
        "object_count": int(reply.object_count),
        "max_key_bytes": int(reply.max_key_bytes),
        "max_object_bytes": int(reply.max_object_bytes),
        "max_batch_keys": int(reply.max_batch_keys),
        "max_list_keys": int(reply.max_list_keys),
        "segments": segments, "nodes": list(nodes.values()), "tenants": tenants,
        "tiers": merge_tier_stats(
            tier_totals((int(s.info.tier), int(s.info.size_bytes), int(s.used_bytes),
                         int(s.object_count)) for s in reply.segments),
            ((int(t.tier), int(t.hits), int(t.read_bytes), int(t.write_bytes))
             for t in reply.tier_stats),
            {name: int(getattr(reply.tier_moves, name)) for name in MOVE_COUNTERS}),
    }


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
        if not self._until:  # the common case, asked a few times per call: no lock, no clock
            return set()
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


class DiskReadRates:
    """How fast this client has seen each node's disk tier deliver reads: a deadline-bounded
    get counts a disk replica LATE at once when `seconds(node, bytes)` does not fit what is
    left of its budget (docs/disk-tier.md). Until a node's disk is measured the prior is
    optimistic (DISK_READ_PRIOR_BYTES_PER_S: a disk read is tried, and so measured); each read
    round then moves the estimate by DISK_RATE_WEIGHT toward what it saw (bytes read from that
    node's disk over the round's wall time, a lower bound: the round may have waited on other
    reads). At most MAX_DISK_RATE_NODES nodes are remembered (the oldest forgotten first)."""

    def __init__(self) -> None:
        self._rates: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()

    def seconds(self, node_id: str, nbytes: int) -> float:
        """The expected time for `nbytes` from `node_id`'s disk, in seconds."""
        with self._lock:
            rate = self._rates.get(node_id, DISK_READ_PRIOR_BYTES_PER_S)
        return DISK_READ_LATENCY_S + nbytes / rate

    def observe(self, node_id: str, nbytes: int, seconds: float) -> None:
        """`nbytes` came from `node_id`'s disk in `seconds` of wall time."""
        if nbytes <= 0:
            return
        seen = nbytes / max(seconds - DISK_READ_LATENCY_S, MIN_DISK_ROUND_S)
        with self._lock:
            old = self._rates.pop(node_id, None)
            self._rates[node_id] = seen if old is None else old + DISK_RATE_WEIGHT * (seen - old)
            if len(self._rates) > MAX_DISK_RATE_NODES:
                self._rates.popitem(last=False)


class UnpinQueue:
    """Pin ids waiting to be released: they ride on the next GetReplicas, or a flusher sends
    them after `UNPIN_DELAY_S`. Bounded: past `capacity` the oldest are dropped (the master's
    pin TTL releases those), and `add` tells the caller to flush at once.

    `add` wakes the flusher only when it sleeps with nothing due for a while: a flusher that
    finds the queue empty first waits one `delay_s` on its own (the queue of a stream of single
    gets is empty for most of each get: the get rode the last pin and has not queued its own
    yet), and only then sleeps until an `add` wakes it. A pin queued meanwhile is still due
    `delay_s` after it was queued (the flusher looks again before then), and the stream costs
    a wake-up per `delay_s` instead of a GIL hand-off to the flusher and back per get."""

    def __init__(self, capacity: int = MAX_QUEUED_UNPINS) -> None:
        self._capacity = capacity
        self._ids: collections.deque[int] = collections.deque()
        self._oldest_t: float | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._idle_waiters = 0   # wait_due callers asleep with nothing queued (no due time)
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
            if self._idle_waiters:
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
            if self._idle_waiters:
                self._cond.notify_all()

    def wait_due(self, delay_s: float = UNPIN_DELAY_S) -> bool:
        """Block until the oldest queued pin is `delay_s` old; False once closed."""
        with self._cond:
            quiet = False  # a delay_s wait on the empty queue ended with it still empty
            while not self._closed:
                if self._oldest_t is None:
                    if not quiet:
                        self._cond.wait(delay_s)  # adds do not wake this one: see the class
                        quiet = self._oldest_t is None
                        continue
                    self._idle_waiters += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._idle_waiters -= 1
                    quiet = False  # woken by an add: the next empty spell is waited out again
                    continue
                quiet = False
                remaining = self._oldest_t + delay_s - time.monotonic()
                if remaining <= 0:
                    return True
                self._cond.wait(remaining)
            return False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class TransportSet:
    """The transports a client opened, in preference order; picks one per segment route."""

    def __init__(self, transports: Sequence[Any]) -> None:
        self.transports = list(transports)  # `Transport`s (sync face) or `AsyncTransport`s

    def pick(self, route: SegmentRoute) -> Any | None:
        for transport in self.transports:
            if transport.can_reach(route):
                return transport
        return None

    def assign(self, ops: Sequence[TransferOp]) -> tuple[list[tuple[Any, list[int]]], list[int]]:
        """Group op indexes by the transport that will move them; also the unreachable ones."""
        groups: dict[int, tuple[Any, list[int]]] = {}
        unreachable: list[int] = []
        picked: dict[int, Any] = {}  # by route: the ops of one reply share a few route objects
        for i, op in enumerate(ops):
            route = op.route
            key = id(route)  # alive for the whole call (ops hold it): the id stays its own
            if key in picked:
                transport = picked[key]
            else:
                transport = picked[key] = self.pick(route)
            if transport is None:
                unreachable.append(i)
            else:
                groups.setdefault(id(transport), (transport, []))[1].append(i)
        return list(groups.values()), unreachable

    def forget(self, route: SegmentRoute) -> None:
        for transport in self.transports:
            transport.forget(route)

    def close(self) -> None:
        """Close sync transports (the asyncio face awaits each one's `aclose` itself)."""
        for transport in self.transports:
            transport.close()




@dataclass(slots=True)
class TransferRound:
    """One round of transfers as a face performs it: per transport the op indexes it moves,
    by `deadline` (monotonic s); `results` has the unreachable ops filled in already."""

    kind: str                                    # "read" | "write"
    ops: list[TransferOp]
    deadline: float
    groups: list[tuple[Any, list[int]]]
    results: list[TransferResult | None]

    def budget_s(self, now: float | None = None) -> float:
        return self.deadline - (time.monotonic() if now is None else now)

    def settle(self, transport: Any, indexes: list[int],
               results: Sequence[TransferResult]) -> None:
        """Record one transport's results; drop its cached route to nodes that failed."""
        check_result_count(f"{transport.name} {self.kind}", len(results), len(indexes))
        for i, res in zip(indexes, results, strict=True):
            self.results[i] = res
            if res.status in NODE_TROUBLE:
                transport.forget(self.ops[i].route)

    def timed_out(self, indexes: list[int]) -> list[TransferResult]:
        return [TransferResult(ST_TIMEOUT, "no time left")] * len(indexes)

    def outcome(self) -> list[TransferResult]:
        return [r if r is not None else TransferResult(ST_CONNECTION_LOST, "no result")
                for r in self.results]


def plan_round(transports: TransportSet, kind: str, ops: list[TransferOp], deadline: float,
               can_fall_back: bool, now: float | None = None) -> TransferRound:
    """Split `ops` by transport and fix the round's deadline: all the time left, or a share of
    it when another replica or node could still be tried (`attempt_budget_s`)."""
    now = time.monotonic() if now is None else now
    round_deadline = now + attempt_budget_s(deadline - now, can_fall_back)
    results: list[TransferResult | None] = [None] * len(ops)
    groups, unreachable = transports.assign(ops)
    if kind == "write":
        for transport, indexes in groups:
            if not getattr(transport, "hashes_writes", False):
                hash_for(ops, indexes)
    for i in unreachable:
        results[i] = TransferResult(ST_CONNECT_FAILED,
                                    f"no transport reaches node {ops[i].route.node_id}")
    return TransferRound(kind, ops, round_deadline, groups, results)


def hash_for(ops: Sequence[TransferOp], indexes: Sequence[int]) -> None:
    """Writes that left their checksum to a transport that hashes writes, but go to one that
    does not (the one picked when they were planned could not reach the node any more): hash
    them here, so the node is always told the value's true checksum."""
    for i in indexes:
        op = ops[i]
        if op.want_checksum and op.meta is not None:
            views = op.parts if op.parts else (op.buffer,)
            op.meta = replace(op.meta, checksum=hash_views(views))
            op.want_checksum = False  # the checksum is in the meta now: PutBatch reads it there
