"""Quarantine: freed ranges held back until no write grant can still land in them.

A put that is revoked or times out leaves ranges its writer may still hold write grants for; a
late write from that writer must never land in another object's bytes (DESIGN write path 4).
Such ranges wait here, still allocated in their segment's allocator, until their grant's expiry
plus `grant_skew_s` has passed, and only then go back to the allocator.

Invariant: a range is either in quarantine or free in its allocator, never both; quarantined
bytes count as used for the watermark, and in the `quarantined_bytes` of the tenant whose put
was revoked: its WRITING cap and its byte quota bound them with its other bytes (quota.py), since
the ranges are still writable by its own grants, and a tenant that starts and revokes puts in a
loop must not hold the cluster's free space in quarantine (issue 19). Ranges of a segment
that went away are discarded without touching its allocator. This module never decides *when*
a range is freed (objects.py does); it only holds it until it is safe.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellar.master.state.records import Segment, Tenant


class Quarantine:
    def __init__(self) -> None:
        # (release_at monotonic s, tie-break, segment, offset, reserved bytes, tenant charged)
        self._heap: list[tuple[float, int, Segment, int, int, Tenant | None]] = []
        self._tiebreak = itertools.count()
        self.held_bytes = 0
        self.released_ranges = 0

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, segment: Segment, offset: int, reserved: int, release_at: float,
             tenant: Tenant | None = None) -> None:
        heapq.heappush(self._heap, (release_at, next(self._tiebreak), segment, offset, reserved,
                                    tenant))
        segment.quarantined_bytes += reserved
        self.held_bytes += reserved
        if tenant is not None:
            tenant.quarantined_bytes += reserved

    def release_due(self, now: float) -> int:
        """Free every range whose hold has ended; returns the bytes given back."""
        heap = self._heap
        freed = 0
        while heap and heap[0][0] <= now:
            _, _, segment, offset, reserved, tenant = heapq.heappop(heap)
            self.held_bytes -= reserved
            segment.quarantined_bytes -= reserved
            if tenant is not None:
                tenant.quarantined_bytes -= reserved
                assert tenant.quarantined_bytes >= 0, tenant.name
            if segment.gone:
                continue
            segment.allocator.free(offset)
            freed += reserved
            self.released_ranges += 1
        return freed

    def held_by_tenant(self) -> dict[str, int]:
        """Bytes held per tenant charged (for the audit: O(held ranges))."""
        out: dict[str, int] = {}
        for entry in self._heap:
            tenant = entry[5]
            if tenant is not None:
                out[tenant.name] = out.get(tenant.name, 0) + entry[4]
        return out

    def forget_segment(self, segment: Segment) -> None:
        """The segment went away: its held ranges no longer count (their entries are skipped)."""
        self.held_bytes -= segment.quarantined_bytes
        segment.quarantined_bytes = 0
        for entry in self._heap:
            tenant = entry[5]
            if entry[2] is segment and tenant is not None:
                tenant.quarantined_bytes -= entry[4]
        self._heap = [entry for entry in self._heap if entry[2] is not segment]
        heapq.heapify(self._heap)
