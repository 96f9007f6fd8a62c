"""MasterService: the master's behaviour, one plain method per RPC, no gRPC in sight.

Owns the wiring of the metadata rooms and the client RPCs (put, get, probes, removal); the
rules every RPC follows: validate the whole request first (batch size, tenant, every value's
range: a failure raises `RequestRejected`, which the servicer turns into a gRPC status, and
nothing changes), then handle each key on its own with a per-key `Status`.

The rooms it wires, one subsystem each: tenants, membership, object table, placement, pins,
eviction, quarantine; and beside them, split out of this file:
- requests.py: input types, `RequestRejected`, the validators of values off the wire;
- replies.py: output types and `GrantIssuer`, which signs every grant in a reply;
- quota.py: `SpaceMaker`, the bounded eviction a PutStart runs for quota or for space;
- tombstones.py: removed keys and freed-while-down ids a late report must not revive (the
  serving room's removal log makes them outlive this process);
- grace.py: `RebuildGrace`, when a miss answers UNAVAILABLE while rebuild may be incomplete;
- put_ends.py: `PutEnds`, PutEnd (the receipts that make a put COMPLETE) and PutRevoke (bound
  here as `self.put_end`, `self.put_revoke`);
- put_ahead.py: `PutAheads`, write allocations granted before their key is known (a
  PutStart's or PutEnd's `ahead` ask, `self.put_ahead`), bound to a key at PutEnd;
- removals.py: `Removals`, Remove/RemovePrefix/RemoveAll and the removal log's bounds (bound
  here as `self.remove`, ... like the node calls);
- listing.py: the ListKeys page (which keys, their order, the bound, the scan's cost);
- node_rpcs.py: `NodeRpcs`, an object of its own over the tables it is given: the node-facing
  RPCs, the rebuild from the nodes' reports and the background `tick`. The service builds it
  (`self.nodes`) and forwards the node calls to it, so `service.heartbeat(...)` stays one call.

Everything runs on one asyncio event loop, so a method runs to completion without interleaving:
no locks. Time comes from an injected clock (`monotonic()` for liveness, TTLs and LRU;
`wall_ms()` for grant expiry and reply headers), so unit tests drive time by hand.

Per-key inputs are duck-typed: the protobuf messages of cellar.proto work as they are, and
`PutItem`/`PutEndItem`/`PutRef` (requests.py) are plain stand-ins for tests. The master never
sees, sends or stores payload bytes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from xxhash import xxh64_intdigest

from cellar.errors import Status
from cellar.master.config import DEFAULT_TENANT, MasterConfig, TenantQuota
from cellar.master.grace import RebuildGrace
from cellar.master.listing import list_page
from cellar.master.node_rpcs import NodeRpcs
from cellar.master.put_ahead import PutAheads
from cellar.master.put_ends import PutEnds
from cellar.master.quota import SpaceMaker
from cellar.master.receipts import ReceiptChecker
from cellar.master.removals import Removals
from cellar.master.repair import Repairer
from cellar.master.replies import (
    GetOutcome,
    GetResult,
    GrantedReplica,
    GrantIssuer,
    HeartbeatOutcome,
    MountOutcome,
    PutStartOutcome,
    PutStartResult,
    ReportOutcome,
)
from cellar.master.requests import (
    MAX_AVOID_NODES,
    MAX_PREFERRED_HOST_CHARS,
    MAX_SOFT_PIN_TTL_MS,
    Clock,
    PutAheadAskLike,
    PutEndItem,
    PutItem,
    PutItemLike,
    PutRef,
    RequestRejected,
    SystemClock,
    check_batch,
    key_error,
)
from cellar.master.state.allocator import SegmentAllocator
from cellar.master.state.audit import check_tables
from cellar.master.state.eviction import Evictor
from cellar.master.state.ids import ID_EPOCH_SHIFT, AllocIds, SecretIds
from cellar.master.state.membership import Membership
from cellar.master.state.objects import ObjectTable
from cellar.master.state.pins import PinTable
from cellar.master.state.placement import NO_NODES, Placement
from cellar.master.state.quarantine import Quarantine
from cellar.master.state.read_trust import SHARED_READERS, ReadTrust
from cellar.master.state.records import (
    ACTIVE,
    COMPLETE,
    HARD_PIN,
    NO_PIN,
    SOFT_PIN,
    TIER_DRAM,
    Obj,
    Replica,
    Segment,
    Tenant,
)
from cellar.master.state.repair import RepairQueue
from cellar.master.state.tenants import Tenants
from cellar.master.state.tiers import Tiers
from cellar.master.state.tombstones import Tombstones
from cellar.proto.engine_hash import error as engine_hash_error
from cellar.proto.grant import (
    GRANT_OP_READ,
    GRANT_OP_WRITE,
    GRANT_OP_WRITE_COMMIT,
    key_tag,
    key_tag_prefix,
)
from cellar.proto.keys import all_plain_keys

OK = Status.OK
INVALID = Status.INVALID


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
        self.clock = clock or SystemClock()
        self.epoch = epoch if epoch is not None else self.clock.wall_ms()
        self.grants = GrantIssuer(secret, self.epoch, self.clock.monotonic)
        self.receipts = ReceiptChecker(secret, self.epoch)  # PutEnd believes nodes, not clients
        self.role = "single"
        rng = rng or random.Random()
        self.next_put_id = SecretIds().next  # unguessable (cellar.master.state.ids)
        self.alloc_ids = AllocIds(self.epoch)
        self.tenants = Tenants(config.tenant_quotas(), allow_unknown=config.allow_unknown_tenants,
                              max_tenants=config.max_tenants,
                              default_quota_fraction=config.default_tenant_quota_fraction)
        self.membership = Membership(
            suspect_after_s=config.node_suspect_after_s,
            expire_after_s=config.node_expire_after_s,
            max_segments_per_node=config.max_segments_per_node,
            max_freed_backlog=config.max_freed_backlog,
            seq_base=self.epoch << ID_EPOCH_SHIFT,
        )
        self.quarantine = Quarantine()
        self.objects = ObjectTable(
            membership=self.membership,
            quarantine=self.quarantine,
            evictor_factory=lambda drop: Evictor(config.eviction_samples, drop, rng),
            grant_skew_s=config.grant_skew_s,
            clock=self.clock.monotonic,
            read_grant_ttl_s=config.pin_ttl_s,
            read_trust=ReadTrust(config.read_trust_s, started=self.clock.monotonic()),
        )
        self.evictor = self.objects.evictor
        self.pins = PinTable(
            ttl_s=config.pin_ttl_s,
            max_per_client=config.max_pins_per_client,
            on_first_pin=self.evictor.on_first_pin,
            on_last_unpin=self.objects.on_last_unpin,
        )
        self.placement = Placement(
            self.membership, choices=config.placement_choices, ramp_s=config.new_node_ramp_s, rng=rng,
        )
        self.space = SpaceMaker(config, self.evictor, self.placement, self.membership)
        self._rounded = SegmentAllocator.rounded_size
        self.no_space_count = 0
        self.grace = RebuildGrace(self.clock.monotonic(), config.rebuild_grace_s)
        self.tombstones = Tombstones(config.max_remove_tombstones)
        self.objects.dead_write = lambda obj: self.tombstones.kill_write(
            obj.tenant.name, obj.key, [rep.alloc_id for rep in obj.replicas])
        self.tiers = Tiers(self.membership, self.objects, self.quarantine,
                           lambda: self.alloc_ids.next(), config.tier_settings())
        self.space.spill = self.tiers.spill
        self.nodes = NodeRpcs(
            config, self.clock, self.epoch, tenants=self.tenants, membership=self.membership,
            objects=self.objects, pins=self.pins, quarantine=self.quarantine,
            tombstones=self.tombstones, grace=self.grace, alloc_ids=self.alloc_ids,
            next_put_id=self.next_put_id, tiers=self.tiers,
        )
        self.repair = Repairer(config, self.clock, self.grants, self.membership, RepairQueue(
            objects=self.objects, membership=self.membership, placement=self.placement,
            quarantine=self.quarantine, next_alloc_id=self.alloc_ids.next,
            bytes_per_s=config.repair_bytes_per_s, grant_ttl_s=config.write_grant_ttl_s,
            grant_skew_s=config.grant_skew_s), self.recovering, self.receipts)  # re-replication
        self.nodes.on_tick = self.repair.tick
        # The node calls, answered by `self.nodes` (the servicer and the tests call them here).
        self.mount_segment = self.nodes.mount_segment
        self.report_objects = self.nodes.report_objects
        self.unmount_segment = self.nodes.unmount_segment
        self.heartbeat = self.nodes.heartbeat
        self.expire_node = self.nodes.expire_node
        self.tick = self.nodes.tick
        self.evict_to_watermark = self.nodes.evict_to_watermark
        self.aheads = PutAheads(self)  # put-ahead allocations (master/put_ahead.py)
        self.put_ends = PutEnds(self)  # PutEnd and PutRevoke (master/put_ends.py)
        self.put_end = self.put_ends.put_end
        self.put_revoke = self.put_ends.put_revoke
        self.removals = Removals(self)  # Remove, RemovePrefix, RemoveAll (master/removals.py)
        self.remove = self.removals.remove
        self.remove_prefix = self.removals.remove_prefix
        self.remove_all = self.removals.remove_all
        self.load_removals = self.removals.load_removals
        self.removed_alloc_id = self.removals.removed_alloc_id
        self.capacity = self.membership.usage
        self.largest_placeable_bytes = self.membership.largest_placeable_bytes

    # ---------------------------------------------------------------- request checks

    def tenant(self, name: str) -> Tenant:
        tenant = self.tenants.resolve(name)
        if tenant is None:
            raise RequestRejected(f"unknown tenant {name!r}")
        return tenant

    def check_batch(self, count: int, what: str = "keys") -> None:
        check_batch(count, self.config.max_batch_keys, what)

    def key_error(self, key: str) -> str:
        """Why `key` is not acceptable, or '' (strings off the wire are already valid UTF-8)."""
        return key_error(key, self.config.max_key_bytes)

    def header(self) -> tuple[int, int]:
        return self.epoch, self.clock.wall_ms()

    def ranges_of(self, obj: Obj) -> list[int]:
        """The alloc ids of every range holding or receiving `obj`'s bytes: its replicas, a
        tier move's target and a repair copy's target (those in flight)."""
        ids = [rep.alloc_id for rep in obj.replicas]
        for target in (self.tiers.move_target(obj), self.repair.queue.copy_target(obj)):
            if target:
                ids.append(target)
        return ids

    # ---------------------------------------------------------------- put

    def put_ahead(self, tenant_name: str, ask: PutAheadAskLike, *, may_commit: bool = False,
                  segments: dict[int, Segment] | None = None) -> PutStartOutcome:
        """Put-ahead allocations for a PutStart's or PutEnd's `ahead` ask (master/put_ahead.py);
        `segments`: the table of the reply they ride in, extended."""
        tenant = self.tenant(tenant_name)
        table: dict[int, Segment] = {} if segments is None else segments
        granted = self.aheads.reserve(
            tenant, ask, GRANT_OP_WRITE_COMMIT if may_commit else GRANT_OP_WRITE,
            self.clock.monotonic(), self.clock.wall_ms(), table)
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
        tenant = self.tenant(tenant_name)
        write_op = GRANT_OP_WRITE_COMMIT if may_commit else GRANT_OP_WRITE
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
        capacity_bytes = self.space.capacity_bytes()
        self.tenants.follow_capacity(tenant, capacity_bytes)  # a default quota follows it
        limited = tenant.limited
        writing_cap = self.space.writing_cap(tenant, capacity_bytes)
        tag_prefix = key_tag_prefix(tenant.name)
        write_ttl_s = config.write_grant_ttl_s
        deadline = now + write_ttl_s
        expiry_ms = wall_ms + int(write_ttl_s * 1000)
        place_one = self.placement.place_one
        default_replicas = config.default_replicas
        fast_ok = config.max_replicas >= 1
        next_put_id = self.next_put_id
        page_from = SegmentAllocator.PAGE_ALIGN_THRESHOLD_BYTES
        page_pad = SegmentAllocator.PAGE_BYTES - 1
        granule_pad = SegmentAllocator.SMALL_GRANULARITY_BYTES - 1
        begin_one = self.objects.begin_one
        next_alloc_id = self.alloc_ids.next
        grant_one = self.grants.one
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
            if not self.membership.active_node_ids:
                append(self._put_one(tenant, item, now, wall_ms, segments, -1, write_op))  # UNAVAILABLE
                continue
            spot = place_one(size, NO_NODES, now)
            if spot is None:  # as in _put_one: evict for room, else NO_SPACE
                placements = self.space.evict_for_space(size, 1, NO_NODES, "", now, reserved)
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
        granted = [] if ahead is None else self.aheads.reserve(tenant, ahead, write_op, now,
                                                                 wall_ms, segments)
        return PutStartOutcome(results, list(segments.values()), granted)

    def _put_one(
        self, tenant: Tenant, item: PutItemLike, now: float, wall_ms: int,
        segments: dict[int, Segment], writing_cap: int = -1, write_op: int = GRANT_OP_WRITE,
        request: tuple[str, str, int] | None = None,
    ) -> PutStartResult:
        """One key of a PutStart, every check spelled out (`writing_cap` < 0: compute it)."""
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
            writing_cap = self.space.writing_cap(tenant, self.space.capacity_bytes())
        refusal = self.space.admit(tenant, need, item.hard_pin, writing_cap)
        if refusal is not None:
            return PutStartResult(*refusal)
        if tenant.limited:
            error = self.space.make_quota_room(tenant, need)
            if error:
                return PutStartResult(Status.QUOTA_EXCEEDED, error)
        placements = self.placement.place(size, replicas, avoid, preferred_host, now)
        if placements is None:
            placements = self.space.evict_for_space(size, replicas, avoid, preferred_host, now,
                                                     reserved)
            if placements is None:
                return self._no_room()

        put_id = self.next_put_id()
        ttl_s = config.write_grant_ttl_s
        pin_kind = HARD_PIN if item.hard_pin else SOFT_PIN if item.soft_pin else NO_PIN
        tag = key_tag(tenant.name, key)
        obj = Obj(tenant, key, size, reserved, put_id, pin_kind, now + ttl_s, tag)
        obj.engine_hash = bytes(item.engine_hash)
        obj.request = request
        self.objects.begin(obj, placements, self.alloc_ids.next)
        if pin_kind == SOFT_PIN and item.soft_pin_ttl_ms:
            self.objects.lapse_soft_pin(obj, now + item.soft_pin_ttl_ms / 1000)
        expiry_ms = wall_ms + int(ttl_s * 1000)
        granted = self.grants.all(obj, write_op, expiry_ms, segments)
        return PutStartResult(OK, "", put_id, granted)

    def _no_room(self) -> PutStartResult:
        """A put that neither placement nor eviction found room for."""
        if self.membership.disks_rebuilding:  # their room comes with them (quota.py)
            return PutStartResult(Status.UNAVAILABLE, "no DRAM room while the nodes' disk tiers "
                                  "are still reporting to this master: retry")
        self.no_space_count += 1
        return PutStartResult(Status.NO_SPACE, "no space: nothing evictable is left")

    def _same_put(self, obj: Obj, write_op: int, now: float, wall_ms: int,
                  segments: dict[int, Segment]) -> PutStartResult:
        """A repeated PutStart's answer: the put it began, its grants signed again for the time
        its writer has left (the grants' expiry never moves past the put's deadline)."""
        assert obj.request is not None and obj.deadline > 0
        expiry_ms = wall_ms + max(0, int((obj.deadline - now) * 1000))
        return PutStartResult(OK, "", obj.put_id, self.grants.all(obj, write_op, expiry_ms, segments))

    # ---------------------------------------------------------------- get

    def get_replicas(
        self, tenant_name: str, client_id: str, keys: Sequence[str], unpin_ids: Sequence[int] = ()
    ) -> GetOutcome:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(keys))
        self.check_batch(len(unpin_ids), "pin ids")
        if self.recovering():
            # A miss may be an object not reported yet, and a hit may be an older value that a
            # report still to come replaces (newest wins): answer nothing until the table is
            # whole. Refused before the unpins too: a refused request changes nothing (the
            # client retries it whole, unpin ids included).
            raise self.grace.error()
        for pin_id in unpin_ids:
            self.pins.unpin(pin_id, tenant)
        now = self.clock.monotonic()
        expiry_ms = self.clock.wall_ms() + int(self.config.pin_ttl_s * 1000)
        objects = tenant.objects
        pin = self.pins.pin
        trust_s = self.config.read_trust_s
        segments: dict[int, Segment] = {}
        results: list[GetResult] = []
        tiers = self.tiers
        tiered = tiers.enabled
        dram_hits = dram_bytes = 0  # without a disk tier, counted here and added once
        for key in keys:
            obj = objects.get(key)
            if obj is None:
                status, message = self.miss(tenant, key)
                results.append(GetResult(status, message))
                continue
            pin_id = pin(obj, tenant, client_id, now)
            if not pin_id:
                results.append(GetResult(
                    Status.QUOTA_EXCEEDED,
                    f"client holds max_pins_per_client ({self.config.max_pins_per_client}) pins; unpin first",
                ))
                continue
            obj.prev_access, obj.last_access = obj.last_access, now
            if obj.reader != client_id:  # who may reuse this reply (state/read_trust.py)
                obj.reader = client_id if now - obj.read_at > trust_s else SHARED_READERS
            obj.read_at = now  # this grant names its ranges for pin_ttl_s (read_frees.py)
            if tiered:
                tiers.on_read(obj, now)
            else:
                dram_hits += 1
                dram_bytes += obj.size
            if len(obj.replicas) > 1:
                obj.replicas = tuple(sorted(obj.replicas, key=_replica_health))
            granted = self.grants.all(obj, GRANT_OP_READ, expiry_ms, segments)
            results.append(GetResult(OK, "", obj.size, obj.checksum, pin_id, granted))
        if dram_hits:
            tiers.hits[TIER_DRAM] += dram_hits
            tiers.read_bytes[TIER_DRAM] += dram_bytes
        return GetOutcome(results, list(segments.values()))

    def miss(self, tenant: Tenant, key: str) -> tuple[Status, str]:
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
        found = list(map(tenant.objects.__contains__, keys))  # C loops for the common batch
        if all(found):
            return [OK] * len(found)
        keys = list(keys)  # a protobuf repeated field converts each key anew per pass
        if all_plain_keys(keys, self.config.max_key_bytes):
            writing = tenant.writing
            statuses: list[int] = [
                OK if hit else Status.NOT_READY if key in writing else Status.NOT_FOUND
                for key, hit in zip(keys, found, strict=True)]
        else:
            statuses = [OK if hit else self.miss(tenant, key)[0]
                        for key, hit in zip(keys, found, strict=True)]
        if Status.NOT_FOUND in statuses and self.recovering():
            raise self.grace.error()
        return statuses

    def prefix_len(self, tenant_name: str, keys: Sequence[str]) -> int:
        tenant = self.tenant(tenant_name)
        self.check_batch(len(keys))
        found = list(map(tenant.objects.__contains__, keys))  # C loops: 256 keys in ~5 us
        count = found.index(False) if False in found else len(found)
        self.check_run_end(tenant, keys, count)
        return count

    def check_run_end(self, tenant: Tenant, keys: Sequence[str], count: int) -> None:
        """The checks of a leading-run probe (PrefixLen, Lookup) past its run of `count`
        stored keys: every later key is valid, and the miss that ended it is not one the
        rebuild may still bring back (the grace: UNAVAILABLE, retried)."""
        if count < len(keys) and not all_plain_keys(keys[count:], self.config.max_key_bytes):
            for index in range(count, len(keys)):
                error = self.key_error(keys[index])
                if error:
                    raise RequestRejected(f"key {index}: {error}")
        if count < len(keys) and keys[count] not in tenant.writing and self.recovering():
            raise self.grace.error()

    # Remove, RemovePrefix, RemoveAll and the removal log's bounds: master/removals.py
    # (`self.removals`; the methods are bound in __init__).

    def list_keys(self, tenant_name: str, prefix: str, start_after: str,
                  limit: int) -> tuple[list[str], bool]:
        """One page of the tenant's visible keys and whether more match (master/listing.py)."""
        return list_page(self, tenant_name, prefix, start_after, limit)

    # ---------------------------------------------------------------- rebuild

    def recovering(self) -> bool:
        """Whether a miss may be an object not reported yet (master/grace.py)."""
        return self.grace.recovering(self.membership.rebuilding_count, self.membership.nodes,
                                     self.clock.monotonic())

    def expect_nodes(self, node_ids: frozenset[str]) -> None:
        """The nodes whose reports complete the table (what the previous leader had mounted)."""
        self.grace.expected_nodes = node_ids

    def check_invariants(self) -> int:
        """The full O(n) check of every table (master/state/audit.py); returns the versions
        checked. Tests, the soak (GET /api/v1/invariants) and the fault tests call it; never a
        request path."""
        return check_tables(self.membership, self.tenants, self.objects)

    @property
    def replicas_lost(self) -> int:
        """`self.nodes.replicas_lost` (the node counters live in NodeRpcs; this one is read here
        by tests/security)."""
        return self.nodes.replicas_lost

    # ---------------------------------------------------------------- status

    def set_tenant_quota(self, name: str, quota: TenantQuota) -> Tenant:
        """Create a tenant or change its quotas; QuotaExceeded past max_tenants."""
        tenant = self.tenants.configure(name, quota)
        self.tenants.follow_capacity(tenant, self.space.capacity_bytes())
        return tenant

    def status_tenants(self, caller: str) -> list[Tenant]:
        """The tenants a ClusterStatus reply lists: the caller's first, at most
        `max_status_tenants` in all, so the reply stays bounded whatever their number."""
        return self.tenants.listing(caller or DEFAULT_TENANT, self.config.max_status_tenants)


def _replica_health(rep: Replica) -> int:
    return 0 if rep.segment.node.state == ACTIVE else 1


__all__ = [
    "COMPLETE", "GetOutcome", "GetResult", "GrantedReplica", "HeartbeatOutcome", "MasterService",
    "MountOutcome", "PutEndItem", "PutItem", "PutRef", "PutStartOutcome", "PutStartResult",
    "ReportOutcome", "RequestRejected", "SystemClock",
]
