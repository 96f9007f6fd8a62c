"""MasterService: the master's behaviour, one plain method per RPC, no gRPC in sight.

Owns the wiring of the metadata rooms (tenants, membership, object table, placement, pins,
eviction, quarantine) and the rules every RPC follows: validate the whole request first
(batch size, tenant: a failure raises `RequestRejected`, which the servicer turns into a gRPC
status, and nothing changes), then handle each key on its own with a per-key `Status`.

Everything runs on one asyncio event loop, so a method runs to completion without interleaving:
no locks. Time comes from an injected clock (`monotonic()` for liveness, TTLs and LRU;
`wall_ms()` for grant expiry and reply headers), so unit tests drive time by hand. `tick` is
the background work (membership, pin TTLs, writer timeouts, quarantine, watermark eviction)
that the server's ticker calls every `tick_interval_s`.

Rebuild (master/rebuild.py): nodes holding objects from before (a restarted node, or every
node after this master started) mount with `report_follows` and report their indexes with
ReportObjects; the master adopts them before it places anything new in those segments.
Recovering window: a miss (GetReplicas, Exists, PrefixLen, Remove) answers gRPC UNAVAILABLE,
which clients retry within their deadline, instead of NOT_FOUND while (a) a segment's report
is still incomplete, or (b) less than `rebuild_grace_s` passed since this master started and
either no node has mounted yet or a node said it was mounted before (an earlier epoch, or a
report follows). A first mount of a fresh node, with no such sign, ends (b) at once, so a
brand-new cluster answers misses right away.

Per-key inputs are duck-typed: the protobuf messages of cellar.proto work as they are, and
`PutItem`/`PutEndItem`/`PutRef` below are plain stand-ins for tests. The master never sees,
sends or stores payload bytes.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from xxhash import xxh64_intdigest

from cellar.errors import Status
from cellar.master.allocator import SegmentAllocator
from cellar.master.config import MasterConfig, TenantQuota
from cellar.master.eviction import Evictor
from cellar.master.grants import GrantSigner
from cellar.master.membership import ACTIVE, MAX_NODE_ID_CHARS, Membership, Node, Segment
from cellar.master.objects import COMPLETE, HARD_PIN, NO_PIN, SOFT_PIN, Obj, ObjectTable, Replica
from cellar.master.pins import PinTable
from cellar.master.placement import NO_NODES, Placement
from cellar.master.quarantine import Quarantine
from cellar.master.rebuild import MAX_REPORT_ENTRIES, adopt, drop_lost, new_counter
from cellar.master.tenants import Tenant, Tenants
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE, Grant, key_tag, key_tag_prefix

# ids (put, alloc, pin, freed seq) are (epoch_ms << ID_EPOCH_SHIFT) + counter: unique across
# master restarts because the epoch grows, and far from overflowing 64 bits.
ID_EPOCH_SHIFT = 22
MAX_AVOID_NODES = 256
MAX_PREFERRED_HOST_CHARS = 256

OK = Status.OK
INVALID = Status.INVALID


class RequestRejected(Exception):
    """The whole request is refused; `code` names a grpc.StatusCode member."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def wall_ms(self) -> int: ...


class SystemClock:
    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    @staticmethod
    def wall_ms() -> int:
        return time.time_ns() // 1_000_000


# ---------------------------------------------------------------- plain inputs (tests)


@dataclass
class PutItem:
    key: str
    size_bytes: int
    replicas: int = 0
    soft_pin: bool = False
    hard_pin: bool = False
    upsert: bool = False
    preferred_host_id: str = ""
    avoid_node_ids: Sequence[str] = field(default_factory=list)


@dataclass
class PutEndItem:
    key: str
    put_id: int
    checksum: int = 0


@dataclass
class PutRef:
    key: str
    put_id: int


class PutItemLike(Protocol):
    key: str
    size_bytes: int
    replicas: int
    soft_pin: bool
    hard_pin: bool
    upsert: bool
    preferred_host_id: str
    avoid_node_ids: Sequence[str]


class PutEndLike(Protocol):
    key: str
    put_id: int
    checksum: int


class PutRefLike(Protocol):
    key: str
    put_id: int


# ---------------------------------------------------------------- plain outputs


class GrantedReplica:
    """One replica as returned to a client: where it is and the signed grant for it."""

    __slots__ = ("node_id", "segment_id", "offset", "length", "op", "alloc_id", "epoch", "expiry_ms",
                 "key_tag", "mac")

    def __init__(
        self, node_id: str, segment_id: int, offset: int, length: int, op: int, alloc_id: int,
        epoch: int, expiry_ms: int, key_tag: int, mac: bytes,
    ) -> None:
        self.node_id = node_id
        self.segment_id = segment_id
        self.offset = offset
        self.length = length
        self.op = op
        self.alloc_id = alloc_id
        self.epoch = epoch
        self.expiry_ms = expiry_ms
        self.key_tag = key_tag
        self.mac = mac

    def grant(self) -> Grant:
        """As a `cellar.proto.grant.Grant` (what a storage node verifies)."""
        return Grant(self.op, self.segment_id, self.offset, self.length, self.alloc_id, self.epoch,
                     self.expiry_ms, self.key_tag, self.mac)


class PutStartResult:
    __slots__ = ("status", "message", "put_id", "replicas")

    def __init__(
        self, status: Status, message: str = "", put_id: int = 0,
        replicas: list[GrantedReplica] | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.put_id = put_id
        self.replicas = replicas or []


class GetResult:
    __slots__ = ("status", "message", "size_bytes", "checksum", "pin_id", "replicas")

    def __init__(
        self, status: Status, message: str = "", size_bytes: int = 0, checksum: int = 0,
        pin_id: int = 0, replicas: list[GrantedReplica] | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.size_bytes = size_bytes
        self.checksum = checksum
        self.pin_id = pin_id
        self.replicas = replicas or []


@dataclass
class PutStartOutcome:
    results: list[PutStartResult]
    segments: list[Segment]  # every segment the results refer to, once


@dataclass
class GetOutcome:
    results: list[GetResult]
    segments: list[Segment]


@dataclass
class HeartbeatOutcome:
    remount: bool
    freed: list[tuple[int, int, int, int, int]]  # (seq, segment_id, alloc_id, offset, length)
    freed_seq: int


@dataclass
class MountOutcome:
    results: list[tuple[int, str]]
    heartbeat_interval_ms: int
    write_grant_ttl_ms: int = 0


@dataclass
class ReportOutcome:
    status: Status
    message: str = ""
    refused: list[int] = field(default_factory=list)
    accepted: int = 0


KeyResults = list[tuple[int, str]]


class MasterService:
    """The master's metadata behaviour; one method per RPC (see the module docstring)."""

    def __init__(
        self,
        config: MasterConfig,
        secret: bytes,
        *,
        clock: Clock | None = None,
        epoch: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._signer = GrantSigner(secret)
        self.clock: Clock = clock or SystemClock()
        self.epoch = epoch if epoch is not None else self.clock.wall_ms()
        self.role = "single"
        rng = rng or random.Random()
        base = self.epoch << ID_EPOCH_SHIFT
        self._next_put_id = itertools.count(base + 1).__next__
        self._next_alloc_id = itertools.count(base + 1).__next__
        self.tenants = Tenants(config.tenant_quotas(), allow_unknown=config.allow_unknown_tenants)
        self.membership = Membership(
            suspect_after_s=config.node_suspect_after_s,
            expire_after_s=config.node_expire_after_s,
            max_segments_per_node=config.max_segments_per_node,
            max_freed_backlog=config.max_freed_backlog,
            seq_base=base,
        )
        self.quarantine = Quarantine()
        self.objects = ObjectTable(
            membership=self.membership,
            quarantine=self.quarantine,
            evictor_factory=lambda drop: Evictor(config.eviction_samples, drop, rng),
            grant_skew_s=config.grant_skew_s,
            clock=self.clock.monotonic,
        )
        self.evictor = self.objects.evictor
        self.pins = PinTable(
            ttl_s=config.pin_ttl_s,
            max_per_client=config.max_pins_per_client,
            id_base=base,
            on_first_pin=self.evictor.on_first_pin,
            on_last_unpin=self.objects.on_last_unpin,
        )
        self.placement = Placement(
            self.membership, choices=config.placement_choices, ramp_s=config.new_node_ramp_s, rng=rng,
        )
        self._rounded = SegmentAllocator.rounded_size
        self._watermark_evicting = False
        self.nodes_expired = 0
        self.puts_timed_out = 0
        self.no_space_count = 0
        # rebuild (module docstring)
        self._started_at = self.clock.monotonic()
        self._restart_evidence = False
        self._fresh_mount_seen = False
        self._grace_over = False
        # Nodes the previous leader had mounted (HA takeover, cellar.master.leadership): once
        # all of them have mounted here and reported, nothing is missing and the grace ends.
        self._expected_nodes: frozenset[str] | None = None
        # (tenant, key) -> an alloc id drawn when a client removed the key: every replica of any
        # value written before the remove has a smaller id. A node that was away (or whose freed
        # notice had not arrived) may still report such a replica; rebuild refuses it.
        self.removed: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._refuse_on_report: dict[str, set[int]] = {}  # node id -> alloc ids freed while down
        self.objects_adopted = 0
        self.objects_refused = 0
        self.replicas_lost = 0

    # ---------------------------------------------------------------- request checks

    def tenant(self, name: str) -> Tenant:
        tenant = self.tenants.resolve(name)
        if tenant is None:
            raise RequestRejected(f"unknown tenant {name!r}")
        return tenant

    def check_batch(self, count: int, what: str = "keys") -> None:
        if count > self.config.max_batch_keys:
            raise RequestRejected(
                f"batch of {count} {what} is over max_batch_keys ({self.config.max_batch_keys})"
            )

    def key_error(self, key: str) -> str:
        """Why `key` is not acceptable, or '' (strings off the wire are already valid UTF-8)."""
        if not key:
            return "empty key"
        limit = self.config.max_key_bytes
        if key.isascii():
            nbytes = len(key)
        else:
            try:
                nbytes = len(key.encode("utf-8"))
            except UnicodeEncodeError:
                return "key is not valid UTF-8 (lone surrogate)"
        if nbytes > limit:
            return f"key is {nbytes} bytes, over max_key_bytes ({limit} bytes UTF-8)"
        if "\x00" in key:
            return "key contains a NUL character"
        return ""

    def header(self) -> tuple[int, int]:
        return self.epoch, self.clock.wall_ms()

    # ---------------------------------------------------------------- put

    def put_start(self, tenant_name: str, client_id: str, items: Sequence[PutItemLike]) -> PutStartOutcome:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(items))
        now = self.clock.monotonic()
        wall_ms = self.clock.wall_ms()
        segments: dict[int, Segment] = {}
        # The per-key loop below is the master's hottest code (metadata bench: ~1/3 of the
        # master's CPU). Everything that is the same for the whole batch is looked up once
        # here, and the common case (a valid ASCII key, one replica, nothing to avoid, no
        # preferred host, no quota) runs inline: a Python call costs as much as a check.
        config = self.config
        max_key_bytes = config.max_key_bytes
        max_segment_bytes = self.membership.max_segment_bytes
        limited = tenant.limited
        tag_prefix = key_tag_prefix(tenant.name)
        write_ttl_s = config.write_grant_ttl_s
        deadline = now + write_ttl_s
        expiry_ms = wall_ms + int(write_ttl_s * 1000)
        place_one = self.placement.place_one
        default_replicas = config.default_replicas
        fast_ok = config.max_replicas >= 1
        next_put_id = self._next_put_id
        begin_one = self.objects.begin_one
        next_alloc_id = self._next_alloc_id
        grant_one = self._grant_one
        objects = tenant.objects
        writing = tenant.writing
        results: list[PutStartResult] = []
        append = results.append
        for item in items:
            key = item.key
            size = item.size_bytes
            if type(size) is int and size > 0:  # SegmentAllocator.rounded_size, inlined
                reserved = (size + 4095) & -4096 if size >= 262144 else (size + 63) & -64
            else:
                reserved = 0
            if (not fast_ok or not key or len(key) > max_key_bytes or not key.isascii()
                    or "\x00" in key or not 0 < reserved <= max_segment_bytes
                    or (item.replicas or default_replicas) != 1
                    or item.soft_pin or item.hard_pin or key in writing
                    or (key in objects and not item.upsert) or item.avoid_node_ids
                    or item.preferred_host_id or limited):
                append(self._put_one(tenant, item, now, wall_ms, segments))
                continue
            # The checks of _put_one, all passed: a valid key, a size that fits a segment, one
            # replica, no pin, nothing to avoid or prefer, no quota.
            if not self.membership.active_node_ids:
                append(self._put_one(tenant, item, now, wall_ms, segments))  # says UNAVAILABLE
                continue
            spot = place_one(size, NO_NODES, now)
            if spot is None:  # as in _put_one: evict for room, else NO_SPACE
                placements = self._evict_for_space(size, 1, NO_NODES, "", now)
                if placements is None:
                    self.no_space_count += 1
                    append(PutStartResult(Status.NO_SPACE, "no space: nothing evictable is left"))
                    continue
                spot = placements[0]
            put_id = next_put_id()
            obj = Obj(tenant, key, size, reserved, put_id, NO_PIN, deadline,
                      xxh64_intdigest(tag_prefix + key.encode()))
            replica = begin_one(obj, spot[0], spot[1], next_alloc_id())
            append(PutStartResult(OK, "", put_id,
                                  [grant_one(obj, replica, GRANT_OP_WRITE, expiry_ms, segments)]))
        return PutStartOutcome(results, list(segments.values()))

    def _put_one(
        self, tenant: Tenant, item: PutItemLike, now: float, wall_ms: int, segments: dict[int, Segment]
    ) -> PutStartResult:
        config = self.config
        key = item.key
        error = self.key_error(key)
        if error:
            return PutStartResult(INVALID, error)
        size = item.size_bytes
        if size <= 0:
            return PutStartResult(INVALID, "size_bytes must be > 0")
        membership = self.membership
        reserved = self._rounded(size) if size <= membership.max_segment_bytes else size
        if reserved > membership.max_segment_bytes:
            if not membership.segments:
                return PutStartResult(Status.UNAVAILABLE, "no storage segments are mounted")
            return PutStartResult(
                INVALID,
                f"size_bytes {size} is over the largest segment ({membership.max_segment_bytes} bytes)",
            )
        replicas = item.replicas or config.default_replicas
        if replicas > config.max_replicas:
            return PutStartResult(INVALID, f"replicas {replicas} is over max_replicas ({config.max_replicas})")
        if item.soft_pin and item.hard_pin:
            return PutStartResult(INVALID, "soft_pin and hard_pin are exclusive")
        if key in tenant.objects and not item.upsert:
            return PutStartResult(Status.ALREADY_EXISTS, "key exists (use upsert to replace it)")
        if key in tenant.writing:
            return PutStartResult(Status.ALREADY_EXISTS, "key is being written by another put")
        avoid = item.avoid_node_ids
        if len(avoid) > MAX_AVOID_NODES:
            return PutStartResult(INVALID, f"more than {MAX_AVOID_NODES} avoid_node_ids")
        preferred_host = item.preferred_host_id
        if len(preferred_host) > MAX_PREFERRED_HOST_CHARS:
            return PutStartResult(INVALID, "preferred_host_id is too long")
        live = membership.active_node_ids
        eligible = len(live.difference(avoid)) if avoid else len(live)
        if replicas > eligible:
            return PutStartResult(
                Status.UNAVAILABLE,
                f"{replicas} replica(s) asked for but only {eligible} live node(s) can take one",
            )
        if tenant.limited:
            error = self._make_quota_room(tenant, reserved * replicas)
            if error:
                return PutStartResult(Status.QUOTA_EXCEEDED, error)
        placements = self.placement.place(size, replicas, avoid, preferred_host, now)
        if placements is None:
            placements = self._evict_for_space(size, replicas, avoid, preferred_host, now)
            if placements is None:
                self.no_space_count += 1
                return PutStartResult(Status.NO_SPACE, "no space: nothing evictable is left")

        put_id = self._next_put_id()
        ttl_s = config.write_grant_ttl_s
        pin_kind = HARD_PIN if item.hard_pin else SOFT_PIN if item.soft_pin else NO_PIN
        tag = key_tag(tenant.name, key)
        obj = Obj(tenant, key, size, reserved, put_id, pin_kind, now + ttl_s, tag)
        self.objects.begin(obj, placements, self._next_alloc_id)
        expiry_ms = wall_ms + int(ttl_s * 1000)
        granted = self._grant_all(obj, GRANT_OP_WRITE, expiry_ms, segments)
        return PutStartResult(OK, "", put_id, granted)

    def _grant_one(
        self, obj: Obj, rep: Replica, op: int, expiry_ms: int, segments: dict[int, Segment]
    ) -> GrantedReplica:
        """`_grant_all` for one replica (the put fast path's)."""
        segment = rep.segment
        segment_id = segment.segment_id
        segments[segment_id] = segment
        size = obj.size
        offset = rep.offset
        alloc_id = rep.alloc_id
        epoch = self.epoch
        tag = obj.tag
        return GrantedReplica(
            segment.node.node_id, segment_id, offset, size, op, alloc_id, epoch, expiry_ms, tag,
            self._signer.mac(op, segment_id, offset, size, alloc_id, epoch, expiry_ms, tag),
        )

    def _grant_all(
        self, obj: Obj, op: int, expiry_ms: int, segments: dict[int, Segment]
    ) -> list[GrantedReplica]:
        mac = self._signer.mac
        epoch = self.epoch
        size = obj.size
        tag = obj.tag
        out = []
        for rep in obj.replicas:
            segment = rep.segment
            segment_id = segment.segment_id
            segments[segment_id] = segment
            out.append(GrantedReplica(
                segment.node.node_id, segment_id, rep.offset, size, op, rep.alloc_id, epoch,
                expiry_ms, tag, mac(op, segment_id, rep.offset, size, rep.alloc_id, epoch, expiry_ms, tag),
            ))
        return out

    def _make_quota_room(self, tenant: Tenant, need: int) -> str:
        quota_bytes = tenant.quota_bytes
        quota_objects = tenant.quota_objects
        if quota_bytes and need > quota_bytes:
            return f"object needs {need} bytes; tenant {tenant.name!r} quota is {quota_bytes} bytes"
        budget = self.config.max_evictions_per_put
        evicted = 0
        while (quota_bytes and tenant.used_bytes + need > quota_bytes) or (
            quota_objects and tenant.object_count + 1 > quota_objects
        ):
            if not evicted:
                self.evictor.attempts += 1
            if evicted >= budget or self.evictor.evict_one(tenant) < 0:
                return (
                    f"tenant {tenant.name!r} is over its quota ({tenant.used_bytes}/{quota_bytes or '-'} "
                    f"bytes, {tenant.object_count}/{quota_objects or '-'} objects) and has nothing evictable"
                )
            evicted += 1
            if evicted == 1:
                self.evictor.successes += 1
        return ""

    def _evict_for_space(
        self, size: int, replicas: int, avoid: Sequence[str], preferred_host: str, now: float
    ) -> list[tuple[Segment, int]] | None:
        budget = self.config.max_evictions_per_put
        if budget <= 0:
            return None
        self.evictor.attempts += 1
        for attempt in range(budget):
            if self.evictor.evict_one() < 0:
                return None
            if attempt == 0:
                self.evictor.successes += 1
            placements = self.placement.place(size, replicas, avoid, preferred_host, now)
            if placements is not None:
                return placements
        return None

    def put_end(self, tenant_name: str, client_id: str, items: Sequence[PutEndLike]) -> KeyResults:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(items))
        now = self.clock.monotonic()
        puts = self.objects.puts
        results: KeyResults = []
        for item in items:
            obj = puts.get(item.put_id)
            if obj is None or obj.tenant is not tenant or obj.key != item.key:
                results.append(self._put_end_miss(tenant, item))
                continue
            self.objects.complete(obj, item.checksum, now)
            results.append((OK, ""))
        return results

    def _put_end_miss(self, tenant: Tenant, item: PutEndLike) -> tuple[int, str]:
        key = item.key
        error = self.key_error(key)
        if error:
            return INVALID, error
        current = tenant.objects.get(key)
        if current is not None and current.put_id == item.put_id:
            return OK, ""  # a retried PutEnd whose first reply was lost
        if key in tenant.writing:
            return INVALID, "not the writer: put_id does not match the put in progress"
        if item.put_id in self.objects.expired_puts:
            return Status.EXPIRED, "the put was revoked after its writer timeout"
        return Status.NOT_FOUND, "key is not being written"

    def put_revoke(self, tenant_name: str, client_id: str, items: Sequence[PutRefLike]) -> KeyResults:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(items))
        now = self.clock.monotonic()
        results: KeyResults = []
        for item in items:
            obj = self.objects.puts.get(item.put_id)
            if obj is None or obj.tenant is not tenant or obj.key != item.key:
                error = self.key_error(item.key)
                if error:
                    results.append((INVALID, error))
                elif item.key in tenant.writing:
                    results.append((INVALID, "not the writer: put_id does not match the put in progress"))
                elif item.put_id in self.objects.expired_puts:
                    results.append((Status.EXPIRED, "the put was already revoked after its writer timeout"))
                else:
                    results.append((Status.NOT_FOUND, "key is not being written"))
                continue
            self.objects.drop(obj, now)
            results.append((OK, ""))
        return results

    # ---------------------------------------------------------------- get

    def get_replicas(
        self, tenant_name: str, client_id: str, keys: Sequence[str], unpin_ids: Sequence[int] = ()
    ) -> GetOutcome:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(keys))
        self.check_batch(len(unpin_ids), "pin ids")
        for pin_id in unpin_ids:
            self.pins.unpin(pin_id, tenant)
        if self.recovering():
            # A miss may be an object not reported yet, and a hit may be an older value that a
            # report still to come replaces (newest wins): answer nothing until the table is whole.
            raise self._recovering_error()
        now = self.clock.monotonic()
        expiry_ms = self.clock.wall_ms() + int(self.config.pin_ttl_s * 1000)
        objects = tenant.objects
        pin = self.pins.pin
        segments: dict[int, Segment] = {}
        results: list[GetResult] = []
        for key in keys:
            obj = objects.get(key)
            if obj is None:
                status, message = self._miss(tenant, key)
                results.append(GetResult(status, message))
                continue
            pin_id = pin(obj, tenant, client_id, now)
            if not pin_id:
                results.append(GetResult(
                    Status.QUOTA_EXCEEDED,
                    f"client holds max_pins_per_client ({self.config.max_pins_per_client}) pins; unpin first",
                ))
                continue
            obj.last_access = now
            if len(obj.replicas) > 1:
                obj.replicas = tuple(sorted(obj.replicas, key=_replica_health))
            granted = self._grant_all(obj, GRANT_OP_READ, expiry_ms, segments)
            results.append(GetResult(OK, "", obj.size, obj.checksum, pin_id, granted))
        return GetOutcome(results, list(segments.values()))

    def _miss(self, tenant: Tenant, key: str) -> tuple[Status, str]:
        error = self.key_error(key)
        if error:
            return INVALID, error
        if key in tenant.writing:
            return Status.NOT_READY, "key is being written"
        return Status.NOT_FOUND, "no such key"

    def unpin(self, tenant_name: str, client_id: str, pin_ids: Sequence[int]) -> int:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(pin_ids), "pin ids")
        unpin = self.pins.unpin
        return sum(1 for pin_id in pin_ids if unpin(pin_id, tenant))

    # ---------------------------------------------------------------- probes and removal

    def exists(self, tenant_name: str, keys: Sequence[str]) -> list[int]:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(keys))
        objects = tenant.objects
        statuses: list[int] = [OK if key in objects else self._miss(tenant, key)[0] for key in keys]
        if Status.NOT_FOUND in statuses and self.recovering():
            raise self._recovering_error()
        return statuses

    def prefix_len(self, tenant_name: str, keys: Sequence[str]) -> int:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(keys))
        objects = tenant.objects
        count = 0
        for key in keys:
            if key not in objects:
                break
            count += 1
        for index in range(count, len(keys)):
            error = self.key_error(keys[index])
            if error:
                raise RequestRejected(f"key {index}: {error}")
        if count < len(keys) and keys[count] not in tenant.writing and self.recovering():
            raise self._recovering_error()
        return count

    def remove(self, tenant_name: str, keys: Sequence[str]) -> KeyResults:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(keys))
        now = self.clock.monotonic()
        if self.recovering() and any(key not in tenant.objects for key in keys):
            raise self._recovering_error()
        results: KeyResults = []
        for key in keys:
            obj = tenant.objects.get(key)
            if obj is None:
                status, message = self._miss(tenant, key)
                if status == Status.NOT_READY:
                    message = "key is being written; its writer must revoke it"
                results.append((status, message))
                continue
            self._remove(obj, now)
            results.append((OK, ""))
        return results

    def _remove(self, obj: Obj, now: float) -> None:
        """Drop a value a client removed, remembering it so a late report cannot revive it."""
        limit = self.config.max_remove_tombstones
        if limit:
            name = (obj.tenant.name, obj.key)
            self.removed[name] = self._next_alloc_id()  # ids are unique, not dense
            self.removed.move_to_end(name)
            while len(self.removed) > limit:
                self.removed.popitem(last=False)
        self.objects.drop(obj, now)

    def removed_alloc_id(self, tenant_name: str, key: str) -> int:
        """The alloc id drawn when the key was last removed (0: none remembered)."""
        return self.removed.get((tenant_name, key), 0)

    def remove_prefix(self, tenant_name: str, prefix: str) -> int:
        tenant = self.tenant(tenant_name)
        if self.recovering():
            raise self._recovering_error()
        if not prefix:
            raise RequestRejected("empty prefix (use RemoveAll to remove every key)")
        if len(prefix.encode("utf-8", "surrogatepass")) > self.config.max_key_bytes:
            raise RequestRejected(f"prefix is longer than max_key_bytes ({self.config.max_key_bytes})")
        victims = [obj for key, obj in tenant.objects.items() if key.startswith(prefix)]
        return self._drop_all(victims)

    def remove_all(self, tenant_name: str) -> int:
        tenant = self.tenant(tenant_name)
        if self.recovering():
            raise self._recovering_error()
        return self._drop_all(list(tenant.objects.values()))

    def _drop_all(self, victims: list[Obj]) -> int:
        now = self.clock.monotonic()
        for obj in victims:
            self._remove(obj, now)
        return len(victims)

    # ---------------------------------------------------------------- membership

    def mount_segment(
        self, node_id: str, incarnation: int, segments: Sequence[Any], *,
        report_follows: bool = False, previous_epoch: int = 0,
    ) -> MountOutcome:
        if not node_id or len(node_id) > MAX_NODE_ID_CHARS:
            raise RequestRejected(f"node_id must be 1..{MAX_NODE_ID_CHARS} characters")
        if not segments:
            raise RequestRejected("no segments to mount")
        if len(segments) > self.config.max_segments_per_node:
            raise RequestRejected(f"more than max_segments_per_node ({self.config.max_segments_per_node}) segments")
        now = self.clock.monotonic()
        known = self.membership.nodes.get(node_id)
        if known is not None and known.incarnation != incarnation:
            # The old process is gone. Its memory may not be (a restart re-attaches it), but
            # what the old incarnation was told to free must stay freed: remember it.
            self._refuse_on_report[node_id] = {entry[2] for entry in known.outbox}
            self.expire_node(known)
        if report_follows or (previous_epoch and previous_epoch != self.epoch):
            self._restart_evidence = True
        elif not self._restart_evidence:
            self._fresh_mount_seen = True
        results = self.membership.mount(node_id, incarnation, list(segments), now,
                                        rebuilding=report_follows)
        return MountOutcome(results, int(self.config.heartbeat_interval_s * 1000),
                            int(self.config.write_grant_ttl_s * 1000))

    def report_objects(
        self, node_id: str, incarnation: int, segment_id: int, entries: Sequence[Any], last: bool
    ) -> ReportOutcome:
        """Adopt one batch of a node's index for one segment (master/rebuild.py)."""
        if len(entries) > MAX_REPORT_ENTRIES:
            raise RequestRejected(f"more than {MAX_REPORT_ENTRIES} entries in one report")
        node = self.membership.nodes.get(node_id)
        if node is None or node.incarnation != incarnation:
            return ReportOutcome(Status.NOT_FOUND, f"node {node_id!r} is not mounted: mount again")
        segment = node.segments.get(segment_id)
        if segment is None:
            return ReportOutcome(Status.NOT_FOUND, f"segment {segment_id} is not mounted by {node_id!r}")
        now = self.clock.monotonic()
        node.last_seen = now
        refuse = self._refuse_on_report.get(node_id, set())
        result = adopt(self, segment, entries, now, refuse)
        self.objects_adopted += result.accepted
        self.objects_refused += len(result.refused)
        if last:
            self.membership.finish_rebuild(segment)
            if not any(s.rebuilding for s in node.segments.values()):
                self._refuse_on_report.pop(node_id, None)
        return ReportOutcome(Status.OK, "", result.refused, result.accepted)

    def recovering(self) -> bool:
        """Whether a miss may be an object not reported yet (module docstring)."""
        if self.membership.rebuilding_count:
            return True
        if self._grace_over:
            return False
        if self.clock.monotonic() - self._started_at >= self.config.rebuild_grace_s:
            self._grace_over = True
            return False
        expected = self._expected_nodes
        if expected is not None and expected.issubset(self.membership.nodes):
            self._grace_over = True  # every node of the previous leader is back and reported
            return False
        return self._restart_evidence or not self._fresh_mount_seen

    def expect_nodes(self, node_ids: frozenset[str]) -> None:
        """The nodes whose reports complete the table (what the previous leader had mounted)."""
        self._expected_nodes = node_ids

    @staticmethod
    def _recovering_error() -> RequestRejected:
        return RequestRejected(
            "the master is rebuilding its table from the storage nodes' reports; retry shortly",
            code="UNAVAILABLE",
        )

    def next_put_id(self) -> int:
        return self._next_put_id()

    def ensure_alloc_ids_above(self, alloc_id: int) -> None:
        """Make every future alloc id greater than `alloc_id` (an adopted one)."""
        if self._next_alloc_id() <= alloc_id:
            self._next_alloc_id = new_counter(alloc_id + 1)

    def unmount_segment(self, node_id: str, segment_ids: Sequence[int]) -> KeyResults:
        self.check_batch(len(segment_ids), "segment ids")
        now = self.clock.monotonic()
        results: KeyResults = []
        for segment_id in segment_ids:
            segment = self.membership.segments.get(segment_id)
            if segment is None or segment.node.node_id != node_id:
                results.append((Status.NOT_FOUND, f"segment {segment_id} is not mounted by {node_id!r}"))
                continue
            self.objects.lose_segment(segment, now)
            self.quarantine.forget_segment(segment)
            self.membership.detach_segment(segment)
            results.append((OK, ""))
        return results

    def heartbeat(
        self, node_id: str, incarnation: int, freed_ack_seq: int, lost: Sequence[Any] = ()
    ) -> HeartbeatOutcome:
        now = self.clock.monotonic()
        node = self.membership.heartbeat(node_id, incarnation, now)
        if node is None:
            return HeartbeatOutcome(True, [], freed_ack_seq)
        if lost:
            self.check_batch(len(lost), "lost ranges")
            by_segment: dict[int, set[int]] = {}
            for item in lost:
                by_segment.setdefault(int(item.segment_id), set()).add(int(item.alloc_id))
            for segment_id, alloc_ids in by_segment.items():
                segment = node.segments.get(segment_id)
                if segment is not None:
                    self.replicas_lost += drop_lost(self, segment, alloc_ids, now)
        freed = self.membership.take_freed(node, freed_ack_seq, self.config.max_freed_per_heartbeat)
        return HeartbeatOutcome(False, freed, freed[-1][0] if freed else freed_ack_seq)

    def expire_node(self, node: Node) -> None:
        now = self.clock.monotonic()
        for segment in list(node.segments.values()):
            self.objects.lose_segment(segment, now)
            self.quarantine.forget_segment(segment)
        self.membership.forget(node)
        self.nodes_expired += 1

    # ---------------------------------------------------------------- background

    def tick(self, lag_s: float = 0.0) -> None:
        """One round of background work; `lag_s` is how late the ticker woke (stall guard)."""
        membership = self.membership
        membership.credit_lag(lag_s)
        now = self.clock.monotonic()
        for node in membership.tick(now):
            self.expire_node(node)
        self.pins.sweep(now)
        self.puts_timed_out += self.objects.sweep_writers(now)
        self.quarantine.release_due(now)
        self.evict_to_watermark()

    def capacity(self) -> tuple[int, int]:
        """(capacity, used) bytes over mounted segments; used includes quarantined ranges."""
        capacity = used = 0
        for segment in self.membership.segments.values():
            capacity += segment.allocator.capacity_bytes
            used += segment.allocator.used_bytes
        return capacity, used

    def evict_to_watermark(self) -> int:
        capacity, used = self.capacity()
        if not capacity:
            return 0
        config = self.config
        if not self._watermark_evicting and used <= capacity * config.eviction_high_watermark:
            return 0
        low = int(capacity * config.eviction_low_watermark)
        evicted, done = self.evictor.evict_to_watermark(used, low, config.max_evictions_per_tick)
        self._watermark_evicting = not done
        return evicted

    # ---------------------------------------------------------------- status

    def set_tenant_quota(self, name: str, quota: TenantQuota) -> Tenant:
        return self.tenants.configure(name, quota)

    def largest_placeable_bytes(self) -> int:
        return max((s.size_bytes for s in self.membership.active_segments), default=0)


def _replica_health(rep: Any) -> int:
    return 0 if rep.segment.node.state == ACTIVE else 1


__all__ = [
    "COMPLETE", "GetOutcome", "GetResult", "GrantedReplica", "HeartbeatOutcome", "MasterService",
    "MountOutcome", "PutEndItem", "PutItem", "PutRef", "PutStartOutcome", "PutStartResult",
    "RequestRejected", "SystemClock",
]
