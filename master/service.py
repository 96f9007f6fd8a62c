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
- put_starts.py: `PutStarts`, PutStart (every key's checks, its fast path, placement with the
  disk tier's spill, eviction for room) and put-ahead asks (bound here as `self.put_start`,
  `self.put_ahead`);
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

from cellar.errors import Status
from cellar.master.config import DEFAULT_TENANT, MasterConfig, TenantQuota
from cellar.master.grace import RebuildGrace
from cellar.master.listing import list_page
from cellar.master.node_rpcs import NodeRpcs
from cellar.master.put_ahead import PutAheads
from cellar.master.put_ends import PutEnds
from cellar.master.put_starts import PutStarts
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
    KeyResults,
    MountOutcome,
    PutStartOutcome,
    PutStartResult,
    ReportOutcome,
)
from cellar.master.requests import (
    Clock,
    PutEndItem,
    PutEndLike,
    PutItem,
    PutRef,
    RequestRejected,
    SystemClock,
    check_batch,
    key_error,
)
from cellar.master.state.audit import check_tables
from cellar.master.state.eviction import Evictor
from cellar.master.state.ids import AllocIds, SecretIds, epoch_base
from cellar.master.state.membership import Membership
from cellar.master.state.objects import ObjectTable
from cellar.master.state.pins import PinTable
from cellar.master.state.placement import Placement
from cellar.master.state.quarantine import Quarantine
from cellar.master.state.read_trust import ReadTrust, read_by
from cellar.master.state.records import (
    ACTIVE,
    COMPLETE,
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
from cellar.proto.grant import (
    GRANT_OP_READ,
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
            seq_base=epoch_base(self.epoch),
        )
        self.quarantine = Quarantine()
        self.objects = ObjectTable(
            membership=self.membership,
            quarantine=self.quarantine,
            evictor_factory=lambda drop: Evictor(config.eviction_samples, drop, rng),
            grant_skew_s=config.grant_skew_s,
            clock=self.clock.monotonic,
            wall_ms=self.clock.wall_ms,
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
        self.no_space_count = 0
        self.grace = RebuildGrace(self.clock.monotonic(), config.rebuild_grace_s)
        self.tombstones = Tombstones(config.max_remove_tombstones)
        self.objects.dead_write = self._dead_write
        self.tiers = Tiers(self.membership, self.objects, self.quarantine,
                           lambda: self.alloc_ids.next(), config.tier_settings(), rng)
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
            grant_skew_s=config.grant_skew_s, disk_range=self.tiers.disk_range),
            self.recovering, self.receipts)  # re-replication
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
        self.objects.vanished = self.aheads.vanished
        self.put_starts = PutStarts(self)  # PutStart and ahead asks (master/put_starts.py)
        self.put_start = self.put_starts.put_start
        self.put_ahead = self.put_starts.put_ahead
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

    def tenant(self, name: str, batch: int = 0, what: str = "keys") -> Tenant:
        """The request's tenant (created on first use under allow_unknown_tenants), once its
        `batch` of `what` passed `check_batch`: a request refused for its size creates none."""
        if batch:
            self.check_batch(batch, what)
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

    def _dead_write(self, obj: Obj) -> None:
        """A version dropped while WRITING (the object table's hook): never to be adopted, and
        no longer an outstanding put-ahead allocation if it was one."""
        self.tombstones.kill_write(obj.tenant.name, obj.key, [rep.alloc_id for rep in obj.replicas])
        self.aheads.dropped_unbound(obj)

    def ranges_of(self, obj: Obj) -> list[int]:
        """The alloc ids of every range holding or receiving `obj`'s bytes: its replicas, a
        tier move's target and a repair copy's target (those in flight)."""
        ids = [rep.alloc_id for rep in obj.replicas]
        for target in (self.tiers.move_target(obj), self.repair.queue.copy_target(obj)):
            if target:
                ids.append(target)
        return ids

    # ---------------------------------------------------------------- get

    def get_replicas(
        self, tenant_name: str, client_id: str, keys: Sequence[str], unpin_ids: Sequence[int] = ()
    ) -> GetOutcome:
        self.check_batch(len(unpin_ids), "pin ids")
        tenant = self.tenant(tenant_name, len(keys))
        if self.recovering():
            # A miss may be an object not reported yet, and a hit may be an older value that a
            # report still to come replaces (newest wins): answer nothing until the table is
            # whole. Refused before the unpins too: a refused request changes nothing (the
            # client retries it whole, unpin ids included).
            raise self.grace.error()
        for pin_id in unpin_ids:
            self.pins.unpin(pin_id, tenant)
        now = self.clock.monotonic()
        expiry_ms = self.read_grant_expiry_ms()
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
            read_by(obj, client_id, now, trust_s)
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

    def read_back(self, tenant_name: str, client_id: str, items: Sequence[PutEndLike],
                  results: KeyResults) -> GetOutcome:
        """The read grants a PutEnd's `read_back` asks for: per item, the replicas a GetReplicas
        right after it would name, when that PutEnd (or the one it repeats) stored the item's
        value; NOT_FOUND otherwise (a revoked put, a remove that won, a newer version). No pin,
        no hit or access counted: the version counts as read by `client_id` now, so another
        client's change of it within the trust waits for it (state/read_trust.py), and its
        ranges, once freed, are remembered for claims as a read's are (read_frees.py)."""
        tenant = self.tenant(tenant_name)
        now = self.clock.monotonic()
        expiry_ms = self.read_grant_expiry_ms()
        trust_s = self.config.read_trust_s
        segments: dict[int, Segment] = {}
        out: list[GetResult] = []
        for item, (status, _message) in zip(items, results, strict=True):
            obj = tenant.objects.get(item.key) if status == OK else None
            if obj is None or obj.put_id != item.put_id or not obj.replicas:
                out.append(GetResult(Status.NOT_FOUND))
                continue
            read_by(obj, client_id, now, trust_s)
            out.append(GetResult(OK, "", obj.size, obj.checksum, 0,
                                 self.grants.all(obj, GRANT_OP_READ, expiry_ms, segments)))
        return GetOutcome(out, list(segments.values()))

    def read_grant_expiry_ms(self) -> int:
        """When a read grant issued now expires (master wall ms): it lives as long as a pin."""
        return self.clock.wall_ms() + int(self.config.pin_ttl_s * 1000)

    def miss(self, tenant: Tenant, key: str) -> tuple[Status, str]:
        error = self.key_error(key)
        if error:
            return INVALID, error
        if key in tenant.writing:
            return Status.NOT_READY, "key is being written"
        return Status.NOT_FOUND, "no such key"

    def unpin(self, tenant_name: str, client_id: str, pin_ids: Sequence[int]) -> int:
        tenant = self.tenant(tenant_name, len(pin_ids), "pin ids")
        unpin = self.pins.unpin
        return sum(1 for pin_id in pin_ids if unpin(pin_id, tenant))

    # ---------------------------------------------------------------- probes and removal

    def exists(self, tenant_name: str, keys: Sequence[str]) -> list[int]:
        tenant = self.tenant(tenant_name, len(keys))
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
        tenant = self.tenant(tenant_name, len(keys))
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
        checked = check_tables(self.membership, self.tenants, self.objects)
        self.aheads.drops.check_invariants(self.objects.puts)
        return checked

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
