"""Quota and space: making room for a put, by tenant quota and by segment space.

Owns the two synchronous eviction loops of PutStart (the policy of which victim is eviction.py's):
- `make_quota_room`: the tenant would go over its byte or object quota; evict only that
  tenant's own objects, at most `max_evictions_per_put`, and say why when it cannot;
- `evict_for_space`: no segment has room; evict from the global pools, at most
  `max_evictions_per_put`, until placement succeeds.

It never places, allocates or frees a range itself (placement.py and objects.py do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellar.master.config import MasterConfig
    from cellar.master.eviction import Evictor
    from cellar.master.membership import Segment
    from cellar.master.placement import Placement
    from cellar.master.tenants import Tenant


class SpaceMaker:
    def __init__(self, config: MasterConfig, evictor: Evictor, placement: Placement) -> None:
        self.config = config
        self.evictor = evictor
        self.placement = placement

    def make_quota_room(self, tenant: Tenant, need: int) -> str:
        """Evict the tenant's own objects until `need` more bytes fit its quota; '' or why not."""
        quota_bytes = tenant.quota_bytes
        quota_objects = tenant.quota_objects
        if quota_bytes and need > quota_bytes:
            return f"object needs {need} bytes; tenant {tenant.name!r} quota is {quota_bytes} bytes"
        evictor = self.evictor
        budget = self.config.max_evictions_per_put
        evicted = 0
        while (quota_bytes and tenant.used_bytes + need > quota_bytes) or (
            quota_objects and tenant.object_count + 1 > quota_objects
        ):
            if not evicted:
                evictor.attempts += 1
            if evicted >= budget or evictor.evict_one(tenant) < 0:
                return (
                    f"tenant {tenant.name!r} is over its quota ({tenant.used_bytes}/{quota_bytes or '-'} "
                    f"bytes, {tenant.object_count}/{quota_objects or '-'} objects) and has nothing evictable"
                )
            evicted += 1
            if evicted == 1:
                evictor.successes += 1
        return ""

    def evict_for_space(
        self, size: int, replicas: int, avoid: Sequence[str], preferred_host: str, now: float
    ) -> list[tuple[Segment, int]] | None:
        """Evict until `replicas` ranges of `size` can be placed; the placements, or None."""
        budget = self.config.max_evictions_per_put
        if budget <= 0:
            return None
        evictor = self.evictor
        evictor.attempts += 1
        for attempt in range(budget):
            if evictor.evict_one() < 0:
                return None
            if attempt == 0:
                evictor.successes += 1
            placements = self.placement.place(size, replicas, avoid, preferred_host, now)
            if placements is not None:
                return placements
        return None
