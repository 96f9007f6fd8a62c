"""Put ahead: write allocations granted before their key is known, bound to one at PutEnd.

Why
    A put is three round trips (PutStart, the write, PutEnd), each answered by a Python
    process. A client that asks ahead (`PutAheadAsk` on a PutStart or PutEnd) holds
    allocations of the size it keeps putting (an engine's page), so its next puts of that size
    are two: the write under the put-ahead grant, then a PutEnd that names the key.

What it owns
    `PutAheads`: granting put-ahead allocations, and binding one to a key at PutEnd (or
    refusing to, dropping it). A put-ahead allocation is an ordinary WRITING version whose key
    is a placeholder no client can name (AHEAD_KEY_MARK + its put id: a key with a NUL is
    refused) and whose grants carry the tenant's ANY_KEY tag (proto/grant.py). So the
    writer-timeout sweep, quarantine, the WRITING cap and PutRevoke apply to it unchanged: an
    allocation its client never uses is revoked when its grants expire.

The rules
    - Granted as the puts they stand for would be placed (evicting for room, within the
      tenant's quota), in DRAM only: with a disk tier, a full DRAM grants none (a put spills
      to disk through PutStart; an allocation held there would make a fast put a disk
      write), at most `max_put_ahead_keys` per request and only while the tenant's WRITING
      (and quarantined) bytes stay under half its WRITING cap, so they never take the room a
      real put needs. A client asks for as many as its last batch put of the size
      (client/put_ahead.py): what they evict, its next puts would have.
    - Bound at PutEnd only if the put's `bind` fields fit the allocation (size, replicas, no
      hard pin), every node receipt names the key (its key tag: the node stored the object
      under the key its first write named) and the allocation is newer than every version and
      every removal of the key. Allocation ids order a key's versions: a rebuild from the nodes
      keeps the newest, a removal's tombstone kills every older one. A put-ahead allocation
      may be older than the key's last version or removal; binding it then could bring an
      older value back after a restart, or lose the put to a removal acknowledged before it.
      It answers EXPIRED instead, and the client puts the key again through PutStart. So
      too for a version the master dropped on its own (evicted, or lost with its node) while
      the allocation was outstanding: the key is absent, but the node may still report that
      version to a rebuild, which prefers it (state/ahead_drops.py keeps those, bounded).
    - Once bound it is a put like any other (put_ends.py): the upsert's tombstone, COMPLETE.

It never touches payload bytes; it runs on the master's one event loop like every service
method.
"""

from __future__ import annotations

from typing import Any, Protocol

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.quota import SpaceMaker
from cellar.master.receipts import ReceiptChecker
from cellar.master.replies import GrantIssuer, PutStartResult
from cellar.master.requests import MAX_SOFT_PIN_TTL_MS, Clock
from cellar.master.state.ahead_drops import AheadDrops
from cellar.master.state.allocator import SegmentAllocator
from cellar.master.state.ids import AllocIds
from cellar.master.state.membership import Membership
from cellar.master.state.objects import ObjectTable
from cellar.master.state.placement import NO_NODES, Placement
from cellar.master.state.records import NO_PIN, SOFT_PIN, Obj, Segment, Tenant
from cellar.master.state.tombstones import Tombstones
from cellar.proto.engine_hash import error as engine_hash_error
from cellar.proto.grant import any_key_tag, key_tag

AHEAD_KEY_MARK = "\0"  # first character of a put-ahead allocation's placeholder key
OK = Status.OK


def is_ahead(obj: Obj) -> bool:
    """Whether `obj` is a put-ahead allocation not bound to a key yet."""
    return obj.key[:1] == AHEAD_KEY_MARK


class MasterService(Protocol):
    """What put-ahead reads of `cellar.master.service.MasterService` (no import: no cycle)."""

    config: MasterConfig
    clock: Clock
    objects: ObjectTable
    receipts: ReceiptChecker
    tombstones: Tombstones
    membership: Membership
    placement: Placement
    space: SpaceMaker
    grants: GrantIssuer
    alloc_ids: AllocIds

    def next_put_id(self) -> int: ...
    def key_error(self, key: str) -> str: ...
    def ranges_of(self, obj: Obj) -> list[int]: ...


class PutAheads:
    """Put-ahead allocations over one `MasterService`'s tables."""

    def __init__(self, service: MasterService) -> None:
        self.service = service
        self.granted = 0   # allocations handed out
        self.bound = 0     # ... bound to a key at PutEnd
        self.refused = 0   # ... refused at PutEnd (dropped; the client puts through PutStart)
        # the outstanding ones, and the versions dropped behind them (state/ahead_drops.py)
        self.drops = AheadDrops(service.config.max_put_ahead_dropped_keys)

    def reserve(self, tenant: Tenant, ask: Any, write_op: int, now: float, wall_ms: int,
                segments: dict[int, Segment]) -> list[PutStartResult]:
        """Up to `ask.count` allocations of `ask.size_bytes` (see the module's rules); fewer,
        or none, is the answer when they do not fit. Never refuses the request it rides on
        (an ask out of range is granted nothing)."""
        s = self.service
        config = s.config
        count = min(int(ask.count), config.max_put_ahead_keys)
        size = int(ask.size_bytes)
        replicas = int(ask.replicas) or config.default_replicas
        if (count <= 0 or not 0 < size <= s.membership.max_segment_bytes
                or replicas > config.max_replicas
                or replicas > s.membership.placeable_nodes()):  # as PutStart: UNAVAILABLE
            return []
        reserved = SegmentAllocator.rounded_size(size)
        need = reserved * replicas
        half_cap = s.space.writing_cap(tenant, s.space.capacity_bytes()) // 2
        # The grants live as long as a put's: a node takes a grant's expiry less
        # write_grant_ttl_s for when it was issued (storage_node/index.py, the mount floor).
        ttl_s = config.write_grant_ttl_s
        expiry_ms = wall_ms + int(ttl_s * 1000)
        tag = any_key_tag(tenant.name)
        out: list[PutStartResult] = []
        for _ in range(count):
            if tenant.writing_bytes + tenant.quarantined_bytes + need > half_cap:
                break
            if tenant.limited and s.space.make_quota_room(tenant, need):
                break  # over its quota even after evicting its own objects
            placements = s.placement.place(size, replicas, NO_NODES, "", now)
            # with a disk tier (mounted or still reporting to a new master): never evicts
            if placements is None and not s.membership.tiered:
                placements = s.space.evict_for_space(size, replicas, NO_NODES, "", now, reserved)
            if placements is None:
                break
            put_id = s.next_put_id()
            obj = Obj(tenant, AHEAD_KEY_MARK + str(put_id), size, reserved, put_id, NO_PIN,
                      now + ttl_s, tag)
            s.objects.begin(obj, placements, s.alloc_ids.next)
            self.drops.granted(put_id, obj.version)
            out.append(PutStartResult(OK, "", put_id, s.grants.all(obj, write_op, expiry_ms,
                                                                     segments)))
        self.granted += len(out)
        return out

    def bind(self, tenant: Tenant, obj: Obj, item: Any, now: float) -> tuple[int, str] | None:
        """Bind the put-ahead `obj` to `item.key` (a PutEnd item), or drop it and say why not.
        None: bound, WRITING under the key; the caller ends it as any put."""
        s = self.service
        key = item.key
        put: Any = getattr(item, "bind", None)
        why = s.key_error(key) or _bind_error(obj, put, s.config.default_replicas)
        refusal: tuple[int, str] | None = None
        if why:
            refusal = Status.INVALID, why
        elif key in tenant.writing:
            refusal = Status.ALREADY_EXISTS, "key is being written by another put"
        else:
            current = tenant.objects.get(key)
            if current is not None and not put.upsert:
                refusal = Status.ALREADY_EXISTS, "key exists (use upsert to replace it)"
            else:
                first_alloc = min(rep.alloc_id for rep in obj.replicas)
                newest = max((rep.alloc_id for rep in current.replicas), default=0) \
                    if current is not None else 0
                if first_alloc <= max(newest, s.tombstones.removed_alloc_id(tenant.name, key),
                                      self.drops.refused_at_or_below(tenant.name, key)):
                    refusal = Status.EXPIRED, (
                        "the put-ahead allocation is older than the key's last version, "
                        "removal or dropped version: put the key again")
        self.drops.ended(obj.put_id)  # decided: bound, or dropped below
        if refusal is None:
            obj.tag = key_tag(tenant.name, key)  # the receipts must name this key
            why = s.receipts.why_not(obj, item.checksum, item.receipts)
            if why:
                refusal = Status.PERMISSION_DENIED, f"put revoked: {why}"
        if refusal is not None:
            s.objects.drop(obj, now)
            self.refused += 1
            return refusal
        del tenant.writing[obj.key]
        obj.key = key
        tenant.writing[key] = obj
        if put.soft_pin:
            obj.pin_kind = SOFT_PIN  # the evictor takes it in at complete()
            if put.soft_pin_ttl_ms:
                s.objects.lapse_soft_pin(obj, now + put.soft_pin_ttl_ms / 1000)
        obj.engine_hash = bytes(put.engine_hash)
        self.bound += 1
        return None

    def vanished(self, obj: Obj) -> None:
        """A COMPLETE version left the table without a client's remove or upsert (the object
        table's hook): no outstanding allocation older than its newest range may be bound to
        its key. Only an outstanding allocation makes it cost more than one look."""
        if self.drops.outstanding:
            newest = max([obj.version, *self.service.ranges_of(obj)])
            self.drops.dropped_version(obj.tenant.name, obj.key, newest)

    def dropped_unbound(self, obj: Obj) -> None:
        """A WRITING version was dropped (the object table's hook): if it was an outstanding
        put-ahead allocation (handed back, revoked, lost), it is no longer."""
        if is_ahead(obj):
            self.drops.ended(obj.put_id)


def _bind_error(obj: Obj, put: Any, default_replicas: int) -> str:
    """Why a PutEnd's `bind` fields cannot take the put-ahead `obj`, or ""."""
    if put is None or not put.size_bytes:
        return "a PutEnd of a put-ahead allocation must carry the put's `bind` fields"
    if put.size_bytes != obj.size:
        return f"size_bytes {put.size_bytes} is not the put-ahead allocation's {obj.size}"
    if (put.replicas or default_replicas) != obj.wanted:
        return f"replicas {put.replicas} is not the put-ahead allocation's {obj.wanted}"
    if put.hard_pin:
        return "a hard-pinned put cannot use a put-ahead allocation (it needs PutStart)"
    if put.soft_pin_ttl_ms and not put.soft_pin:
        return "soft_pin_ttl_ms needs soft_pin"
    if put.soft_pin_ttl_ms > MAX_SOFT_PIN_TTL_MS:
        return f"soft_pin_ttl_ms above {MAX_SOFT_PIN_TTL_MS}"
    return engine_hash_error(put.engine_hash) or ""


__all__ = ["AHEAD_KEY_MARK", "PutAheads", "is_ahead"]
