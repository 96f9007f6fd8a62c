"""Quota and space: what a PutStart may hold, and making room for it, bounded.

Owns the admission rules of a put beyond its key and size, and the two synchronous eviction
loops of PutStart (which victim is eviction.py's policy):
- `admit`: the tenant's WRITING bytes (reserved by PutStart, not yet PutEnd), plus the bytes of
  its revoked puts still in quarantine (their grants can still write), stay within its
  `quota_writing_bytes` and within `max_tenant_writing_fraction` of the cluster's capacity,
  whatever its other quotas, so metadata alone (PutStarts with no data) cannot take the store;
  a hard pin needs the tenant's `hard_pin` right and fits its `quota_hard_pin_bytes`;
- `make_quota_room`: the tenant would go over its byte or object quota (its revoked puts'
  ranges in quarantine count as used: they cannot be evicted, and would otherwise let a tenant
  push others out by churning puts): evict only that tenant's own objects, at most
  `max_evictions_per_put`;
- `evict_for_space`: no segment has room: evict from the global pools, at most
  `max_evictions_per_put`, stopping as soon as placement succeeds; only objects with a replica
  where the put may be placed (not one living only on a draining, suspect or still-reporting
  node, or on the nodes the put avoids: evicting it frees nothing the put can use).
Both loops first check that eviction could succeed at all (the free bytes plus every byte
eviction could free cover what the put needs, the pools keep those sums; and, for space, as
many placeable nodes as the put's replicas): a put that will fail anyway is refused at once
and evicts nothing.

It never places, allocates or frees a range itself (placement.py and objects.py do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cellar.errors import Status
from cellar.master.state.eviction import NORMAL, SOFT

if TYPE_CHECKING:
    from cellar.master.config import MasterConfig
    from cellar.master.state.eviction import Evictor
    from cellar.master.state.membership import Membership
    from cellar.master.state.placement import Fallback, Placement
    from cellar.master.state.records import Obj, Segment, Tenant

NO_LIMIT = 1 << 62


class SpaceMaker:
    def __init__(
        self, config: MasterConfig, evictor: Evictor, placement: Placement, membership: Membership
    ) -> None:
        self.config = config
        self.evictor = evictor
        self.placement = placement
        self.membership = membership
        self.refused_before_evicting = 0  # puts refused because eviction could not help
        # A disk-tier range for a replica no DRAM could take (state/tiers.py `Tiers.spill`).
        self.spill: Fallback | None = None

    # ---------------------------------------------------------------- admission

    def capacity_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self.membership.segments.values())

    def writing_cap(self, tenant: Tenant, capacity_bytes: int) -> int:
        """Most bytes `tenant` may hold WRITING now (a fraction of 1.0: the capacity itself
        bounds it, and a put that does not fit is NO_SPACE, not over a cap)."""
        fraction = self.config.max_tenant_writing_fraction
        cap = NO_LIMIT if fraction >= 1.0 else int(capacity_bytes * fraction)
        if tenant.quota_writing_bytes:
            cap = min(cap, tenant.quota_writing_bytes)
        return cap

    def admit(
        self, tenant: Tenant, need: int, hard_pin: bool, writing_cap: int
    ) -> tuple[Status, str] | None:
        """Why a put of `need` replica bytes may not be reserved, or None (nothing changes)."""
        held = tenant.writing_bytes + tenant.quarantined_bytes
        if held + need > writing_cap:
            return Status.QUOTA_EXCEEDED, (
                f"tenant {tenant.name!r} holds {tenant.writing_bytes} bytes WRITING and "
                f"{tenant.quarantined_bytes} of revoked puts in quarantine; {need} more would "
                f"pass its WRITING cap of {writing_cap} bytes (quota_writing_bytes, "
                f"max_tenant_writing_fraction): end puts, or wait for revoked ones' grants to expire"
            )
        if hard_pin:
            if not tenant.may_hard_pin:
                return Status.PERMISSION_DENIED, (
                    f"tenant {tenant.name!r} has no hard_pin right (an admin grants it per tenant)"
                )
            quota = tenant.quota_hard_pin_bytes
            if quota and tenant.hard_pinned_bytes + need > quota:
                return Status.QUOTA_EXCEEDED, (
                    f"tenant {tenant.name!r} holds {tenant.hard_pinned_bytes} hard-pinned bytes; "
                    f"{need} more would pass quota_hard_pin_bytes ({quota})"
                )
        return None

    # ---------------------------------------------------------------- quota room

    def make_quota_room(self, tenant: Tenant, need: int) -> str:
        """Evict the tenant's own objects until `need` more bytes fit its quota; '' or why not."""
        quota_bytes = tenant.quota_bytes
        quota_objects = tenant.quota_objects
        if quota_bytes and need > quota_bytes:
            return f"object needs {need} bytes; tenant {tenant.name!r} quota is {quota_bytes} bytes"
        # a revoked put's ranges in quarantine count too: they are still its grants' to write
        used = tenant.used_bytes + tenant.quarantined_bytes
        over_bytes = bool(quota_bytes) and used + need > quota_bytes
        over_objects = bool(quota_objects) and tenant.object_count + 1 > quota_objects
        if not over_bytes and not over_objects:
            return ""
        evictor = self.evictor
        pools = tenant.pools
        evictable = 0 if pools is None else pools[NORMAL].evictable() + pools[SOFT].evictable()
        if (over_bytes and used + need - evictor.evictable_bytes(tenant) > quota_bytes) or (
                over_objects and not evictable):
            self.refused_before_evicting += 1
            return self._over_quota(tenant)
        budget = self.config.max_evictions_per_put
        evicted = 0
        evictor.attempts += 1
        while (quota_bytes and tenant.used_bytes + tenant.quarantined_bytes + need > quota_bytes) or (
            quota_objects and tenant.object_count + 1 > quota_objects
        ):
            if evicted >= budget or evictor.evict_one(tenant) < 0:
                return self._over_quota(tenant)
            evicted += 1
            if evicted == 1:
                evictor.successes += 1
        return ""

    @staticmethod
    def _over_quota(tenant: Tenant) -> str:
        return (
            f"tenant {tenant.name!r} is over its quota ({tenant.used_bytes}/{tenant.quota_bytes or '-'} "
            f"bytes, {tenant.quarantined_bytes} more of revoked puts in quarantine, "
            f"{tenant.object_count}/{tenant.quota_objects or '-'} objects) and has nothing "
            "evictable"
        )

    # ---------------------------------------------------------------- space

    def could_fit(self, need: int, avoid: Sequence[str], replicas: int = 1) -> bool:
        """Whether eviction could make room for `need` bytes in `replicas` ranges (an upper
        bound on what it achieves: if this is False, evicting is pointless): as many placeable
        nodes outside `avoid` as replicas (eviction frees bytes, never nodes: a put of 2
        replicas while one node is live, as when a new leader's nodes are still mounting,
        emptied that node 64 objects a put before this was checked), and free bytes plus all
        evictable bytes holding `need`."""
        membership = self.membership
        if replicas > membership.placeable_nodes(avoid):
            return False
        free = sum(s.allocator.capacity_bytes - s.allocator.used_bytes
                   for s in membership.placeable_segments(avoid))
        return free + self.evictor.evictable_bytes() >= need

    def _frees_placeable(self, avoid: Sequence[str]) -> Callable[[Obj], bool] | None:
        """Which victims can make room for a put: those with a replica on a segment it may be
        placed on. Evicting one that lives only on a node being drained or still reporting, or
        one the put avoids, frees nothing it can use. None when every segment qualifies (the
        common case, no filter) or with a disk tier (an evicted disk object makes room to
        spill, and `Tiers` keeps the disk's own watermarks)."""
        membership = self.membership
        if membership.tiered:
            return None
        placeable = set(membership.placeable_segments(avoid))
        if len(placeable) == len(membership.segments):
            return None

        def useful(obj: Obj) -> bool:
            return any(replica.segment in placeable for replica in obj.replicas)

        return useful

    def evict_for_space(
        self, size: int, replicas: int, avoid: Sequence[str], preferred_host: str, now: float,
        reserved: int,
    ) -> list[tuple[Segment, int]] | None:
        """Evict until `replicas` ranges of `size` can be placed; the placements, or None.
        The caller found no room first, a disk tier's `spill` included (a disk with room:
        nothing is evicted)."""
        spill = self.spill
        if spill is not None and self.membership.disks_rebuilding:
            # A new master whose nodes' DRAM is mounted but whose disks are still reporting:
            # their room comes with them, so the put is refused rather than DRAM objects
            # thrown away (make soak-disk: 64 evicted by one put right after a master restart,
            # at 17% use, and 17 acknowledged objects lost with them).
            self.refused_before_evicting += 1
            return None
        budget = self.config.max_evictions_per_put
        if budget <= 0:
            return None
        if not self.could_fit(reserved * replicas, avoid, replicas):
            self.refused_before_evicting += 1
            return None
        evictor = self.evictor
        evictor.attempts += 1
        useful = self._frees_placeable(avoid)
        for attempt in range(budget):
            if evictor.evict_one(useful=useful) < 0:
                return None
            if attempt == 0:
                evictor.successes += 1
            # (with a disk tier, the evicted bytes may have been on a disk: spill again)
            placements = self.placement.place(size, replicas, avoid, preferred_host, now, spill)
            if placements is not None:
                return placements
        return None
