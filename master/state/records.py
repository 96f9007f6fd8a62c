"""Records: the data model the master's tables share, the types that name each other.

An object version (`Obj`) names its tenant and its replicas' segments; a tenant (`Tenant`)
holds its visible and being-written versions and, under a quota, its own eviction pools
(`Pool`); a segment (`Segment`) holds the versions with a replica in it and belongs to a
`Node`. These references run both ways, so the record types live in this one module: every
table module imports them from here and nothing here imports a table, and the state room's
import graph has no cycle, not even a type-only one (tests/unit/test_import_rules.py).

What it owns: the fields, their units and their starting values, and the few operations that
touch only one record (a pool's slots, a tenant's own pools, a segment's shm-free info). The
invariant each table keeps over them is told in that table's module (objects, tenants,
membership, eviction). It never changes a record of another kind, never reads a clock and
never touches payload bytes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from cellar.master.state.allocator import SegmentAllocator
from cellar.master.state.read_frees import RecentReadFrees

# Object version states (objects.py tells the state machine).
WRITING = 1
COMPLETE = 2
DROPPED = 3

NO_PIN = 0  # pin kinds requested at put time (same numbers as eviction pool kinds)
SOFT_PIN = 2
HARD_PIN = 3
# A soft pin's lapse, wall clock ms, as a node keeps it (proto SoftPinNote.until_ms) for a pin
# with no TTL: never
SOFT_PIN_NO_LAPSE_MS = (1 << 64) - 1

# Segment tiers: the numbers of cellar.proto.tiers (this room imports no proto; the unit test
# tests/unit/test_master_tiers.py checks they agree).
TIER_DRAM = 0
TIER_DISK = 1

ACTIVE = 1  # node states, the same numbers as the proto NodeState enum (membership.py)
SUSPECT = 2
EXPIRED = 3


# Transports whose endpoint lets a client reach a whole segment without the node's per-op
# grant checks (a mapping of its file; one-sided RDMA under its remote key): shown only to
# identities trusted on the node's host (`--shm` tokens, admins).
TRUSTED_TRANSPORTS = frozenset({"shm", "rdma"})


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's limits and rights; a quota of 0 means unlimited.

    `quota_writing_bytes` bounds the bytes its puts hold WRITING (reserved, not yet PutEnd);
    `hard_pin` is the right to hard-pin (never evicted), an admin grant, and
    `quota_hard_pin_bytes` bounds the bytes it keeps hard-pinned. `default_bytes`: no byte
    quota was set, so `quota_bytes` follows the master's `default_tenant_quota_fraction` of the
    cluster's capacity (`Tenants.follow_capacity`); an explicit 0 is unlimited.
    """

    quota_bytes: int = 0
    quota_objects: int = 0
    quota_writing_bytes: int = 0
    hard_pin: bool = False
    quota_hard_pin_bytes: int = 0
    default_bytes: bool = False

class Tenant:
    __slots__ = (
        "name", "quota_bytes", "quota_objects", "quota_writing_bytes", "may_hard_pin",
        "quota_hard_pin_bytes", "used_bytes", "object_count", "writing_bytes",
        "hard_pinned_bytes", "objects", "writing", "pools", "engine_hashes", "default_quota",
        "quarantined_bytes",
    )

    def __init__(self, name: str, quota: TenantQuota) -> None:
        self.name = name
        self.used_bytes = 0
        self.object_count = 0
        self.writing_bytes = 0
        self.hard_pinned_bytes = 0
        self.quarantined_bytes = 0  # its revoked puts' ranges held in quarantine (quarantine.py)
        self.objects: dict[str, Obj] = {}  # COMPLETE, visible
        self.writing: dict[str, Obj] = {}  # WRITING (first puts and pending upserts)
        # the visible versions carrying each engine hash (PutItem.engine_hash, encoded): the
        # prefix query's index (master/serving/prefix_query.py), which also asks their tier;
        # an entry exists while its list is not empty (an MHA page: K and V of each rank)
        self.engine_hashes: dict[bytes, list[Obj]] = {}
        # eviction pools by kind: [unused, normal, soft-pinned]; hard-pinned objects are in none.
        # None while the tenant has no quota (module docstring).
        self.pools: tuple[Pool, Pool, Pool] | None = None
        self.set_quota(quota)

    def index_engine_hash(self, obj: Obj) -> None:
        """`obj`, a visible version with an engine hash, joins the index."""
        assert obj.engine_hash
        held = self.engine_hashes.get(obj.engine_hash)
        if held is None:
            self.engine_hashes[obj.engine_hash] = [obj]
        else:
            held.append(obj)

    def unindex_engine_hash(self, obj: Obj) -> None:
        """`obj`, a visible version with an engine hash, left."""
        held = self.engine_hashes[obj.engine_hash]
        for i, other in enumerate(held):
            if other is obj:
                del held[i]
                break
        else:
            raise AssertionError(f"{obj.key!r} not indexed under its engine hash")
        if not held:
            del self.engine_hashes[obj.engine_hash]

    @property
    def limited(self) -> bool:
        return bool(self.quota_bytes or self.quota_objects or self.default_quota)

    def set_quota(self, quota: TenantQuota) -> None:
        """Change the quotas; keep own eviction pools exactly while there is a quota."""
        self.default_quota = quota.default_bytes  # quota_bytes follows the capacity
        self.quota_bytes = quota.quota_bytes
        self.quota_objects = quota.quota_objects
        self.quota_writing_bytes = quota.quota_writing_bytes
        self.may_hard_pin = quota.hard_pin
        self.quota_hard_pin_bytes = quota.quota_hard_pin_bytes
        if not self.limited:
            self.pools = None
        elif self.pools is None:
            self.pools = self._build_pools()

    def _build_pools(self) -> tuple[Pool, Pool, Pool]:
        """Own pools holding what the global pools hold of this tenant (every evictable object
        is visible, so in `objects`), pinned counts included."""
        pools = (Pool(False), Pool(False), Pool(False))
        for obj in self.objects.values():
            kind = obj.pool_kind
            if kind:
                pools[kind].add(obj)
                if obj.pins:
                    pools[kind].pinned += 1
                    pools[kind].pinned_bytes += obj.reserved * len(obj.replicas)
        return pools

class Replica:
    __slots__ = ("segment", "offset", "alloc_id")

    def __init__(self, segment: Segment, offset: int, alloc_id: int) -> None:
        self.segment = segment
        self.offset = offset
        self.alloc_id = alloc_id


def being_replaced(obj: Obj) -> bool:
    """Whether a put of `obj`'s key is being written (an upsert in flight). No copy of `obj`
    (a tier move, a repair copy) starts then: the copy's range would get an alloc id above the
    upsert's, and a master that dies before the upsert's PutEnd leaves nobody to kill that
    range, so the next master's rebuild could serve this old value over the upsert it then
    acknowledges (master/put_ends.py) whenever the copy's node reports it without its value's
    version (`Obj.version`; a node journal from before the value id). A move or copy started
    before the upsert's PutStart has a lower id than the upsert, so it needs no such rule."""
    return obj.key in obj.tenant.writing


def on_disk_only(obj: Obj) -> bool:
    """Whether every replica of `obj` sits on a node's disk tier (a read is then served from
    disk); an object with no replica left counts as DRAM, as it did before the disk tier."""
    replicas = obj.replicas
    if not replicas:
        return False
    # a loop, not all() over a generator: 0.06 against 0.34 us for one replica (every KV
    # event and every lookup asks)
    for rep in replicas:  # noqa: SIM110
        if rep.segment.tier != TIER_DISK:
            return False
    return True


class Obj:
    """One version of one object."""

    __slots__ = (
        "tenant", "key", "size", "reserved", "replicas", "state", "checksum", "put_id",
        "last_access", "prev_access", "pins", "pin_kind", "deadline", "tag", "gslot", "tslot",
        "pool_kind", "engine_hash", "wanted", "request", "read_at", "reader", "version",
    )

    def __init__(
        self, tenant: Tenant, key: str, size: int, reserved: int, put_id: int, pin_kind: int,
        deadline: float, tag: int,
    ) -> None:
        self.tenant = tenant
        self.key = key
        self.size = size
        self.reserved = reserved  # allocator bytes per replica (rounded size)
        # A tuple, not a list: 32 bytes less per object, and replicas rarely change.
        self.replicas: tuple[Replica, ...] = ()
        self.state = WRITING
        self.checksum = 0
        self.put_id = put_id
        self.last_access = 0.0
        self.prev_access = 0.0  # the read before the last (0: read at most once): tiers.py LRU-2
        self.pins = 0
        self.pin_kind = pin_kind
        # Monotonic time the write grants expire; 0.0 once COMPLETE (no late write possible).
        self.deadline = deadline
        self.tag = tag  # key_tag(tenant, key), bound into every grant
        self.gslot = 0
        self.tslot = 0
        self.pool_kind = 0
        # The engine's own page/chunk hash, encoded (proto/engine_hash.py), for KV events;
        # b"" when the writer gave none (and after a rebuild: nodes do not keep it).
        self.engine_hash = b""
        # The value's version: the first alloc id of the put that wrote it (set by
        # ObjectTable.begin, or the version its nodes reported). A tier move or a repair copy
        # gives a replica a newer alloc id but keeps the version, so a rebuilt master orders a
        # key's values by put, not by copy (master/node_rpcs.py; 8 bytes an object).
        self.version = 0
        # The replica count the object was written with (a put's `replicas`; for an adopted
        # object, what the nodes reported during the master's start): re-replication keeps
        # it (state/repair.py).
        self.wanted = 1
        # WRITING only: (token id, client id, request id) of the PutStart that began it, so a
        # repeat of that call gets this same put back (master/service.py `_same_put`)
        self.request: tuple[str, str, int] | None = None
        # Monotonic time a read grant for it was last issued (0.0: never): such a grant names
        # its ranges for pin_ttl_s (state/read_frees.py)
        self.read_at = 0.0
        # The client id of every GetReplicas of it within the read trust before `read_at`, or
        # SHARED_READERS when there were several ("": none): a change by that same client
        # need not wait for the trust (state/read_trust.py)
        self.reader = ""

class Segment:
    """One mounted segment: its allocator and the objects holding a replica in it."""

    __slots__ = (
        "segment_id", "node", "size_bytes", "host_id", "info", "allocator", "objects",
        "quarantined_bytes", "gone", "rebuilding", "_untrusted_info", "tier", "read_frees",
    )

    def __init__(self, segment_id: int, node: Node, size_bytes: int, host_id: str, info: Any) -> None:
        self.segment_id = segment_id
        self.node = node
        self.size_bytes = size_bytes
        self.host_id = host_id
        self.info = info  # the SegmentInfo as mounted (endpoints etc.), returned to clients as is
        self.allocator = SegmentAllocator(size_bytes)
        self.objects: set[Obj] = set()
        self.quarantined_bytes = 0
        # ranges freed while a read grant could name them, their notice not acknowledged yet:
        # a shm/rdma write over one claims it first (state/read_frees.py); None: none
        self.read_frees: RecentReadFrees | None = None
        self.gone = False
        self.rebuilding = False  # the node's report has not ended yet: no new placements
        self.tier = TIER_DRAM  # or TIER_DISK: the node's disk tier (state/tiers.py)
        self._untrusted_info: Any = None

    def untrusted_info(self) -> Any:
        """`info` without its shm and rdma endpoints: what a client not trusted on the node's
        host sees (mapping the segment file, or one-sided RDMA under the segment's remote key,
        which the rdma endpoint carries, would expose every tenant's bytes; docs/security.md)."""
        if self._untrusted_info is None:
            info = self.info
            if any(e.transport in TRUSTED_TRANSPORTS for e in info.endpoints):
                info = type(info)()
                info.CopyFrom(self.info)
                kept = [e for e in info.endpoints if e.transport not in TRUSTED_TRANSPORTS]
                del info.endpoints[:]
                info.endpoints.extend(kept)
            self._untrusted_info = info
        return self._untrusted_info

    def free_fraction(self) -> float:
        return self.allocator.free_bytes / self.allocator.capacity_bytes

class Node:
    __slots__ = (
        "node_id", "incarnation", "state", "last_seen", "joined_at", "segments", "outbox",
        "outbox_dropped", "outbox_dropped_seq", "freed_acked", "ramps", "draining",
        "hash_notes", "pin_notes", "claim_until",
    )

    def __init__(self, node_id: str, incarnation: int, now: float) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.state = ACTIVE
        self.last_seen = now
        self.joined_at = now
        self.ramps = False  # a newcomer to nodes that hold data: placement ramps its weight up
        self.segments: dict[int, Segment] = {}
        # (seq, segment_id, alloc_id, offset, length), seq strictly increasing
        self.outbox: deque[tuple[int, int, int, int, int]] = deque()
        self.outbox_dropped = 0
        self.outbox_dropped_seq = 0  # the newest notice dropped unsent (backlog overflow)
        self.freed_acked = 0  # the newest freed-range notice the node acknowledged
        # Monotonic s until which every shm/rdma write on its segments claims its range first
        # (0: none): set when a node process that had mounted before mounts again, since
        # transfers it admitted under the earlier mount may still move bytes in ranges this
        # master treats as free (node_rpcs.py `mount_segment`, replies.py `_claim`).
        self.claim_until = 0.0
        # An admin drains it (state/repair.py): no new placements, its replicas are copied to
        # other nodes and no longer count towards an object's replica count.
        self.draining = False
        # (segment_id, alloc_id, engine hash) of its sealed replicas, for the next heartbeat
        # reply (state/membership.py `note_engine_hash`): best effort, bounded
        self.hash_notes: list[tuple[int, int, bytes]] = []
        # (segment_id, alloc_id, soft pin lapse in wall-clock ms) of its sealed replicas, the same
        # way
        # (`note_soft_pin`), so a rebuilt master soft-pins them again
        self.pin_notes: list[tuple[int, int, int]] = []

class Pool:
    """A flat list of evictable objects; each object knows its index (gslot or tslot).

    `held_bytes` sums the replica bytes (reserved x replicas) of its items and `pinned_bytes`
    those of its pinned items, so "could eviction ever free `need` bytes?" is one subtraction:
    a put that cannot fit even after evicting everything evictable evicts nothing."""

    __slots__ = ("items", "pinned", "is_global", "held_bytes", "pinned_bytes")

    def __init__(self, is_global: bool) -> None:
        self.items: list[Obj] = []
        self.pinned = 0  # how many items have pins > 0
        self.is_global = is_global
        self.held_bytes = 0
        self.pinned_bytes = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, obj: Obj) -> None:
        if self.is_global:
            obj.gslot = len(self.items)
        else:
            obj.tslot = len(self.items)
        self.items.append(obj)
        self.held_bytes += obj.reserved * len(obj.replicas)

    def remove(self, obj: Obj) -> None:
        items = self.items
        slot = obj.gslot if self.is_global else obj.tslot
        assert items[slot] is obj, "eviction pool slot out of sync"
        self.held_bytes -= obj.reserved * len(obj.replicas)
        assert self.held_bytes >= 0, "eviction pool bytes out of sync"
        last = items.pop()
        if last is not obj:
            items[slot] = last
            if self.is_global:
                last.gslot = slot
            else:
                last.tslot = slot

    def evictable(self) -> int:
        return len(self.items) - self.pinned

    def evictable_bytes(self) -> int:
        return self.held_bytes - self.pinned_bytes
