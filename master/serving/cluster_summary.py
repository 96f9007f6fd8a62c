"""The cluster summary that ClusterStatus (gRPC) and /api/v1/status (HTTP) both report.

One place reads the tables for a status answer, so the two faces cannot disagree: totals,
each segment with its node's state and use, the tenants a caller may be shown (bounded by
`max_status_tenants`, the caller's own first), the tier counters (state/tiers.py, which
/metrics reads too), and the limits a client needs. Segment infos carry shm endpoints only for
a caller trusted on the nodes' hosts (docs/security.md).
It only reads state and never builds protobuf or JSON itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cellar.master.serving.leadership import Leadership
    from cellar.master.state.records import Segment, Tenant


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    segment: Segment
    info: Any            # SegmentInfo as the caller may see it (shm endpoints or not)
    state: int           # the node's NodeState
    used_bytes: int
    object_count: int


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    serving: bool
    role: str
    epoch: int
    master_time_ms: int
    leader_address: str
    max_key_bytes: int
    max_batch_keys: int
    max_list_keys: int
    # the rest is empty on a standby (it holds no metadata)
    capacity_bytes: int = 0
    used_bytes: int = 0
    object_count: int = 0
    max_object_bytes: int = 0
    segments: tuple[SegmentSummary, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    tier_stats: tuple[tuple[int, int, int, int], ...] = ()  # (tier, hits, read B, write B)
    tier_moves: dict[str, int] = field(default_factory=dict)  # demotions, promotions, ...


def summarize(leadership: Leadership, *, caller_tenant: str = "", trusted: bool = False) -> ClusterSummary:
    """The summary as `caller_tenant` sees it; `trusted`: show shm endpoints."""
    service = leadership.service
    config = service.config
    if not leadership.serving():  # a standby, or a leader past its lease (`Leadership.role`)
        return ClusterSummary(False, leadership.role, leadership.epoch, service.clock.wall_ms(),
                              leadership.leader_address, config.max_key_bytes,
                              config.max_batch_keys, config.max_list_keys)
    epoch, wall_ms = service.header()
    capacity, used = service.capacity()
    writing = service.objects.writing_replicas()  # in-flight versions are not objects yet
    segments = tuple(
        SegmentSummary(s, s.info if trusted else s.untrusted_info(), s.node.state,
                       s.allocator.used_bytes, len(s.objects) - writing[s.segment_id])
        for s in service.membership.segments.values()
    )
    return ClusterSummary(
        True, leadership.role, epoch, wall_ms, leadership.leader_address, config.max_key_bytes,
        config.max_batch_keys, config.max_list_keys, capacity, used, service.objects.complete_count,
        service.largest_placeable_bytes(), segments,
        tuple(service.status_tenants(caller_tenant)),  # bounded: max_status_tenants
        tuple(service.tiers.stats()), service.tiers.moves(),
    )
