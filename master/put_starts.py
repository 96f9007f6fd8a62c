"""PutStart and the put-ahead asks: where a put's replicas go and the grants to write them.

Split out of `service.MasterService` (which binds `put_start` and `put_ahead` as its own, so
`service.put_start(...)` stays one call), like put_ends.py and removals.py. What it owns: the
checks of every key of a PutStart (key, size, replicas, pins, avoid list, preferred host,
engine hash, live nodes, quotas; `_put_one`) and the fast path that inlines them for the common
key (one replica, nothing to avoid or prefer, no quota; it must answer exactly as `_put_one`
would: tests/unit/test_master_put_fast_path.py); placement, with a disk tier's spill for a
replica no DRAM has room for (`SpaceMaker.spill`), then bounded eviction (master/quota.py);
the answer when there is no room (NO_SPACE, or UNAVAILABLE while a new master's disks are still
reporting); and a repeated PutStart's answer (the put it began, its grants signed again).

It reads and writes the service's tables on the one event loop, like every method of the
service; it never touches payload bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from xxhash import xxh64_intdigest

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.grace import RebuildGrace
from cellar.master.put_ahead import PutAheads
from cellar.master.quota import SpaceMaker
from cellar.master.replies import GrantIssuer, PutStartOutcome, PutStartResult
from cellar.master.requests import (
    MAX_AVOID_NODES,
    MAX_PREFERRED_HOST_CHARS,
    MAX_SOFT_PIN_TTL_MS,
    Clock,
    PutAheadAskLike,
    PutItemLike,
)
from cellar.master.state.allocator import SegmentAllocator
from cellar.master.state.ids import AllocIds
from cellar.master.state.membership import Membership
from cellar.master.state.objects import ObjectTable
from cellar.master.state.placement import NO_NODES, Placement
from cellar.master.state.records import HARD_PIN, NO_PIN, SOFT_PIN, Obj, Segment, Tenant
from cellar.master.state.tenants import Tenants
from cellar.proto.engine_hash import error as engine_hash_error
from cellar.proto.grant import (
    GRANT_OP_WRITE,
    GRANT_OP_WRITE_COMMIT,
    key_tag,
    key_tag_prefix,
)

OK = Status.OK
INVALID = Status.INVALID


class MasterService(Protocol):
    """What a put's start reads of `cellar.master.service.MasterService` (no import: no cycle)."""

    config: MasterConfig
    clock: Clock
    membership: Membership
    objects: ObjectTable
    placement: Placement
    space: SpaceMaker
    grants: GrantIssuer
    tenants: Tenants
    aheads: PutAheads
    alloc_ids: AllocIds
    next_put_id: Callable[[], int]
    no_space_count: int
    grace: RebuildGrace

    def tenant(self, name: str, batch: int = ..., what: str = ...) -> Tenant: ...
    def recovering(self) -> bool: ...
    def key_error(self, key: str) -> str: ...


class PutStarts:
    """PutStart and put-ahead asks over one `MasterService`'s tables."""

    def __init__(self, service: MasterService) -> None:
        self.service = service

    def put_ahead(self, tenant_name: str, ask: PutAheadAskLike, *, may_commit: bool = False,
                  segments: dict[int, Segment] | None = None) -> PutStartOutcome:
        """Put-ahead allocations for a PutStart's or PutEnd's `ahead` ask (master/put_ahead.py);
        `segments`: the table of the reply they ride in, extended."""
        s = self.service
        tenant = s.tenant(tenant_name)
        table: dict[int, Segment] = {} if segments is None else segments
        granted = s.aheads.reserve(
            tenant, ask, GRANT_OP_WRITE_COMMIT if may_commit else GRANT_OP_WRITE,
            s.clock.monotonic(), s.clock.wall_ms(), table)
        return PutStartOutcome([], list(table.values()), granted)

    def put_start(self, tenant_name: str, client_id: str, items: Sequence[PutItemLike], *,
                  may_commit: bool = False,
                  request: tuple[str, str, int] | None = None,
                  ahead: PutAheadAskLike | None = None) -> PutStartOutcome:
        """`may_commit`: the caller has the shm right, so its write grants carry the COMMIT
        right (GRANT_FLAG_COMMIT); without it a node refuses its COMMITs. `request`: (token
        id, client id, request id) of a call with a request id: kept on each WRITING object it
        begins, so a repeat of the call finds its own put, not ALREADY_EXISTS, even once the
        serving room's reply memory forgot it (proto/request_id.py)."""
        s = self.service
        tenant = s.tenant(tenant_name, len(items))  # checks the batch before it may create one
        write_op = GRANT_OP_WRITE_COMMIT if may_commit else GRANT_OP_WRITE
        if s.membership.segments and s.recovering() and any(
                not item.upsert and item.key not in tenant.objects for item in items):
            # A key missing from a table still being rebuilt may be a value not reported
            # yet: a put of it now would make a newer version, and the report would then be
            # refused as older (an acknowledged value replaced by a put that should have
            # been ALREADY_EXISTS). Retried once the table is whole, as GetReplicas is.
            # (With no segment at all, each key says UNAVAILABLE "no storage segments".)
            raise s.grace.error()
        now = s.clock.monotonic()
        wall_ms = s.clock.wall_ms()
        segments: dict[int, Segment] = {}
        # The per-key loop below is the master's hottest code (metadata bench: ~1/3 of the
        # master's CPU). Everything that is the same for the whole batch is looked up once
        # here, and the common case (a valid ASCII key, one replica, nothing to avoid, no
        # preferred host, no quota) runs inline: a Python call costs as much as a check.
        config = s.config
        max_key_bytes = config.max_key_bytes
        max_segment_bytes = s.membership.max_segment_bytes
        capacity_bytes = s.space.capacity_bytes()
        s.tenants.follow_capacity(tenant, capacity_bytes)  # a default quota follows it
        limited = tenant.limited
        writing_cap = s.space.writing_cap(tenant, capacity_bytes)
        tag_prefix = key_tag_prefix(tenant.name)
        write_ttl_s = config.write_grant_ttl_s
        deadline = now + write_ttl_s
        expiry_ms = wall_ms + int(write_ttl_s * 1000)
        place_one = s.placement.place_one
        spill = s.space.spill  # a disk tier's range for a replica no DRAM has room for
        default_replicas = config.default_replicas
        fast_ok = config.max_replicas >= 1
        next_put_id = s.next_put_id
        page_from = SegmentAllocator.PAGE_ALIGN_THRESHOLD_BYTES
        page_pad = SegmentAllocator.PAGE_BYTES - 1
        granule_pad = SegmentAllocator.SMALL_GRANULARITY_BYTES - 1
        begin_one = s.objects.begin_one
        next_alloc_id = s.alloc_ids.next
        grant_one = s.grants.one
        objects = tenant.objects
        writing = tenant.writing
        results: list[PutStartResult] = []
        append = results.append
        for item in items:
            key = item.key
            size = item.size_bytes
            # SegmentAllocator.rounded_size, inlined with its own constants: the call costs
            # ~45 ns of ~650 ns per key here, 7% (interleaved PutStart batches of 64 keys).
            if type(size) is int and size > 0:
                reserved = ((size + page_pad) & ~page_pad if size >= page_from
                            else (size + granule_pad) & ~granule_pad)
            else:
                reserved = 0
            if (not fast_ok or not key or len(key) > max_key_bytes or not key.isascii()
                    or "\x00" in key or not 0 < reserved <= max_segment_bytes
                    or (item.replicas or default_replicas) != 1
                    or item.soft_pin or item.hard_pin or key in writing
                    or (key in objects and not item.upsert) or item.avoid_node_ids
                    or item.preferred_host_id or limited or item.engine_hash
                    or tenant.writing_bytes + tenant.quarantined_bytes + reserved > writing_cap):
                append(self._put_one(tenant, item, now, wall_ms, segments, writing_cap, write_op,
                                     request))
                continue
            # The checks of _put_one, all passed: a valid key, a size that fits a segment, one
            # replica, no pin, nothing to avoid or prefer, no quota.
            if not s.membership.active_node_ids:
                append(self._put_one(tenant, item, now, wall_ms, segments, -1, write_op))  # UNAVAILABLE
                continue
            spot = place_one(size, NO_NODES, now)
            if spot is None and spill is not None:  # as Placement.place with the spill
                spot = spill(size, NO_NODES)
            if spot is None:  # as in _put_one: evict for room, else NO_SPACE
                placements = s.space.evict_for_space(size, 1, NO_NODES, "", now, reserved)
                if placements is None:
                    append(self._no_room())
                    continue
                spot = placements[0]
            put_id = next_put_id()
            obj = Obj(tenant, key, size, reserved, put_id, NO_PIN, deadline,
                      xxh64_intdigest(tag_prefix + key.encode()))
            obj.request = request
            replica = begin_one(obj, spot[0], spot[1], next_alloc_id())
            append(PutStartResult(OK, "", put_id,
                                  [grant_one(obj, replica, write_op, expiry_ms, segments)]))
        granted = [] if ahead is None else s.aheads.reserve(tenant, ahead, write_op, now,
                                                             wall_ms, segments)
        return PutStartOutcome(results, list(segments.values()), granted)

    def _put_one(
        self, tenant: Tenant, item: PutItemLike, now: float, wall_ms: int,
        segments: dict[int, Segment], writing_cap: int = -1, write_op: int = GRANT_OP_WRITE,
        request: tuple[str, str, int] | None = None,
    ) -> PutStartResult:
        """One key of a PutStart, every check spelled out (`writing_cap` < 0: compute it)."""
        s = self.service
        config = s.config
        key = item.key
        error = s.key_error(key)
        if error:
            return PutStartResult(INVALID, error)
        size = item.size_bytes
        if size <= 0:
            return PutStartResult(INVALID, "size_bytes must be > 0")
        membership = s.membership
        reserved = SegmentAllocator.rounded_size(size) if size <= membership.max_segment_bytes else size
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
        if item.soft_pin and item.soft_pin_ttl_ms > MAX_SOFT_PIN_TTL_MS:
            return PutStartResult(INVALID, f"soft_pin_ttl_ms above {MAX_SOFT_PIN_TTL_MS}")
        if key in tenant.objects and not item.upsert:
            return PutStartResult(Status.ALREADY_EXISTS, "key exists (use upsert to replace it)")
        writing = tenant.writing.get(key)
        if writing is not None:
            if request is not None and writing.request == request:
                return self._same_put(writing, write_op, now, wall_ms, segments)
            return PutStartResult(Status.ALREADY_EXISTS, "key is being written by another put")
        avoid = item.avoid_node_ids
        if len(avoid) > MAX_AVOID_NODES:
            return PutStartResult(INVALID, f"more than {MAX_AVOID_NODES} avoid_node_ids")
        preferred_host = item.preferred_host_id
        if len(preferred_host) > MAX_PREFERRED_HOST_CHARS:
            return PutStartResult(INVALID, "preferred_host_id is too long")
        if error := engine_hash_error(item.engine_hash):
            return PutStartResult(INVALID, error)
        eligible = membership.placeable_nodes(avoid)
        if replicas > eligible:
            return PutStartResult(
                Status.UNAVAILABLE,
                f"{replicas} replica(s) asked for but only {eligible} live node(s) can take one",
            )
        need = reserved * replicas
        if writing_cap < 0:
            writing_cap = s.space.writing_cap(tenant, s.space.capacity_bytes())
        refusal = s.space.admit(tenant, need, item.hard_pin, writing_cap)
        if refusal is not None:
            return PutStartResult(*refusal)
        if tenant.limited:
            error = s.space.make_quota_room(tenant, need)
            if error:
                return PutStartResult(Status.QUOTA_EXCEEDED, error)
        placements = s.placement.place(size, replicas, avoid, preferred_host, now, s.space.spill)
        if placements is None:
            placements = s.space.evict_for_space(size, replicas, avoid, preferred_host, now,
                                                  reserved)
            if placements is None:
                return self._no_room()

        put_id = s.next_put_id()
        ttl_s = config.write_grant_ttl_s
        pin_kind = HARD_PIN if item.hard_pin else SOFT_PIN if item.soft_pin else NO_PIN
        tag = key_tag(tenant.name, key)
        obj = Obj(tenant, key, size, reserved, put_id, pin_kind, now + ttl_s, tag)
        obj.engine_hash = bytes(item.engine_hash)
        obj.request = request
        s.objects.begin(obj, placements, s.alloc_ids.next)
        if pin_kind == SOFT_PIN and item.soft_pin_ttl_ms:
            s.objects.lapse_soft_pin(obj, now + item.soft_pin_ttl_ms / 1000)
        expiry_ms = wall_ms + int(ttl_s * 1000)
        granted = s.grants.all(obj, write_op, expiry_ms, segments)
        return PutStartResult(OK, "", put_id, granted)

    def _no_room(self) -> PutStartResult:
        """A put that neither placement nor eviction found room for."""
        s = self.service
        if s.membership.disks_rebuilding:  # their room comes with them (quota.py)
            return PutStartResult(Status.UNAVAILABLE, "no DRAM room while the nodes' disk tiers "
                                  "are still reporting to this master: retry")
        s.no_space_count += 1
        return PutStartResult(Status.NO_SPACE, "no space: nothing evictable is left")

    def _same_put(self, obj: Obj, write_op: int, now: float, wall_ms: int,
                  segments: dict[int, Segment]) -> PutStartResult:
        """A repeated PutStart's answer: the put it began, its grants signed again for the time
        its writer has left (the grants' expiry never moves past the put's deadline)."""
        s = self.service
        assert obj.request is not None and obj.deadline > 0
        expiry_ms = wall_ms + max(0, int((obj.deadline - now) * 1000))
        return PutStartResult(OK, "", obj.put_id, s.grants.all(obj, write_op, expiry_ms, segments))
