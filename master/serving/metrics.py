"""Prometheus metrics of the master, computed at scrape time.

Owns the per-RPC counters (plain ints bumped by the servicer: a prometheus_client Counter takes
a lock per increment, which the metadata hot path should not pay) and a custom collector that
reads them and the service's tables when /metrics is scraped. Names follow Mooncake's master
where the meaning is the same (`master_key_count`, `master_allocated_bytes`,
`master_total_capacity_bytes`, `master_<rpc>_requests_total`, `master_evicted_key_count`, ...),
so existing dashboards keep working; per-tenant gauges carry a `tenant` label and per-segment
gauges `segment` and `node` labels.

A registry is per process (never the global default), so tests can run several masters.
This module only reads state; it never changes it.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cellar.master.state.membership import STATE_NAMES
from cellar.proto.tiers import TIER_COUNTERS, merge_tier_stats, tier_totals

if TYPE_CHECKING:
    from cellar.master.service import MasterService
    from cellar.master.serving.leadership import Leadership

# RPC name -> metric stem (Mooncake's stem where the meaning is the same)
RPC_METRIC_NAMES = {
    "PutStart": "put_start",
    "PutEnd": "put_end",
    "PutRevoke": "put_revoke",
    "GetReplicas": "get_replica_list",
    "Unpin": "unpin",
    "Exists": "exist_key",
    "PrefixLen": "prefix_len",
    "Remove": "remove",
    "RemovePrefix": "remove_prefix",
    "RemoveAll": "remove_all",
    "ListKeys": "list_keys",
    "MountSegment": "mount_segment",
    "UnmountSegment": "unmount_segment",
    "Heartbeat": "heartbeat",
    "ReportObjects": "report_objects",
    "ClusterStatus": "cluster_status",
    "Lookup": "lookup",
}
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)


class RpcStats:
    """Counters of one RPC, bumped on the hot path with plain integer adds."""

    __slots__ = ("requests", "failures", "keys", "key_failures", "buckets", "latency_sum_s")

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0  # whole-request failures (gRPC error status)
        self.keys = 0
        self.key_failures = 0  # per-key results other than OK
        self.buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.latency_sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.latency_sum_s += seconds


def _untyped(name: str, doc: str, value: float) -> Metric:
    """A sample named exactly `name`: Mooncake exposes these counters without a _total suffix,
    which the text format only allows for untyped metrics."""
    metric = Metric(name, doc, "unknown")
    metric.add_sample(name, {}, value)
    return metric


def _total(stem: str, doc: str, value: float) -> Metric:
    metric = Metric(stem, doc, "counter")
    metric.add_sample(stem + "_total", {}, value)
    return metric


def _tier_gauges(service: MasterService) -> Iterator[Metric]:
    """Capacity, use, objects and traffic per tier (dram, disk): docs/disk-tier.md. The rows
    are ClusterStatus's (cellar.proto.tiers): the same tiers, the same counters."""
    tiers = service.tiers
    writing = service.objects.writing_replicas()  # in-flight versions are not objects yet
    rows = merge_tier_stats(
        tier_totals((s.tier, s.allocator.capacity_bytes, s.allocator.used_bytes,
                     len(s.objects) - writing[s.segment_id])
                    for s in service.membership.segments.values()),
        tiers.stats(), tiers.moves())
    gauges = [(key, GaugeMetricFamily(f"master_tier_{key}", doc, labels=["tier"])) for key, doc in (
        ("capacity_bytes", "bytes of the mounted segments of the tier"),
        ("used_bytes", "bytes allocated in the tier (incl. quarantine and retired ranges)"),
        ("objects", "object replicas stored in the tier (not those being written)"))]
    counters = [(key, CounterMetricFamily(f"master_tier_{key}", doc, labels=["tier"])) for key, doc in (
        ("hits", "GetReplicas hits served from the tier"),
        ("read_bytes", "bytes of the objects those hits granted"),
        ("write_bytes", "bytes written into the tier: completed puts' replicas and "
                        "demotions or promotions into it"))]
    assert tuple(key for key, _ in counters) == TIER_COUNTERS
    for name, row in rows.items():  # the tiers mounted now ("dram", and "disk" with one)
        for key, gauge in gauges:
            gauge.add_metric([name], row[key])
        for key, counter in counters:
            counter.add_metric([name], row[key])
    families: list[Metric] = [family for _, family in (*gauges, *counters)]
    yield from families


class MasterCollector(Collector):
    def __init__(self, leadership: Leadership, rpc_stats: dict[str, RpcStats]) -> None:
        self.leadership = leadership
        self.rpc_stats = rpc_stats

    def collect(self) -> Iterator[Metric]:
        leadership = self.leadership
        service = leadership.service
        capacity, used = service.capacity()
        yield GaugeMetricFamily("master_epoch", "the epoch served under (ms-like; grows with every "
                                "start or new leader; a standby shows its leader's)", value=leadership.epoch)
        yield GaugeMetricFamily("master_is_leader", "1 while this master serves (leader with a "
                                "valid lease, or a single master), else 0", value=int(leadership.serving()))
        yield _total("master_elections_won", "times this master became leader", leadership.elections_won)
        takeover = leadership.takeover
        yield GaugeMetricFamily("master_takeover_duration_seconds", "last takeover: from winning the "
                                "election to the end of the rebuild (0 until complete)",
                                value=takeover.duration_s)
        yield GaugeMetricFamily("master_takeover_recovered_objects", "last takeover: objects adopted "
                                "from the nodes' index reports", value=takeover.recovered_objects)
        yield GaugeMetricFamily("master_key_count", "visible (COMPLETE) objects",
                                value=service.objects.complete_count)
        yield GaugeMetricFamily("master_writing_key_count", "objects being written (WRITING)",
                                value=len(service.objects.puts))
        yield GaugeMetricFamily("master_allocated_bytes", "bytes allocated in segments (incl. quarantine)",
                                value=used)
        yield GaugeMetricFamily("master_total_capacity_bytes", "bytes of all mounted segments", value=capacity)
        yield GaugeMetricFamily("master_quarantined_bytes", "freed bytes waiting for write grants to expire",
                                value=service.quarantine.held_bytes)
        yield GaugeMetricFamily("master_pin_count", "live read pins", value=len(service.pins))

        nodes = GaugeMetricFamily("master_node_count", "storage nodes by state", labels=["state"])
        by_state = dict.fromkeys(STATE_NAMES.values(), 0)
        for node in service.membership.nodes.values():
            by_state[STATE_NAMES[node.state]] += 1
        for state, count in by_state.items():
            nodes.add_metric([state], count)
        yield nodes

        seg_cap = GaugeMetricFamily("master_segment_capacity_bytes", "segment size", labels=["segment", "node"])
        seg_used = GaugeMetricFamily("master_segment_used_bytes", "segment bytes allocated",
                                     labels=["segment", "node"])
        seg_keys = GaugeMetricFamily("master_segment_key_count",
                                     "replicas stored in the segment (not those being written)",
                                     labels=["segment", "node"])
        writing = service.objects.writing_replicas()
        for segment in service.membership.segments.values():
            labels = [str(segment.segment_id), segment.node.node_id]
            seg_cap.add_metric(labels, segment.allocator.capacity_bytes)
            seg_used.add_metric(labels, segment.allocator.used_bytes)
            seg_keys.add_metric(labels, len(segment.objects) - writing[segment.segment_id])
        yield seg_cap
        yield seg_used
        yield seg_keys

        t_used = GaugeMetricFamily("master_tenant_used_bytes", "bytes charged to the tenant", labels=["tenant"])
        t_quota = GaugeMetricFamily("master_tenant_quota_bytes", "tenant byte quota (0 = unlimited)",
                                    labels=["tenant"])
        t_keys = GaugeMetricFamily("master_tenant_key_count", "objects charged to the tenant", labels=["tenant"])
        t_quota_keys = GaugeMetricFamily("master_tenant_quota_keys", "tenant object quota (0 = unlimited)",
                                         labels=["tenant"])
        t_held = GaugeMetricFamily("master_tenant_quarantined_bytes", "bytes of the tenant's "
                                   "revoked puts waiting in quarantine (counted against its "
                                   "WRITING cap and byte quota)", labels=["tenant"])
        for tenant in service.tenants.all():
            t_used.add_metric([tenant.name], tenant.used_bytes)
            t_quota.add_metric([tenant.name], tenant.quota_bytes)
            t_keys.add_metric([tenant.name], tenant.object_count)
            t_quota_keys.add_metric([tenant.name], tenant.quota_objects)
            t_held.add_metric([tenant.name], tenant.quarantined_bytes)
        yield t_used
        yield t_quota
        yield t_keys
        yield t_quota_keys
        yield t_held

        evictor = service.evictor
        yield _untyped("master_evicted_key_count", "objects evicted", evictor.evicted_keys)
        yield _untyped("master_evicted_size_bytes", "bytes evicted", evictor.evicted_bytes)
        yield _total("master_attempted_evictions", "eviction runs started", evictor.attempts)
        yield _total("master_successful_evictions", "eviction runs that evicted something",
                     evictor.successes)
        for name, value in service.tiers.counters().items():  # the disk tier (state/tiers.py)
            yield _untyped(f"master_tier_{name}", f"disk tier: {name.replace('_', ' ')}", value)
        yield from _tier_gauges(service)
        yield _total("master_put_start_alloc_failures", "put keys refused NO_SPACE",
                     service.no_space_count)
        aheads = service.aheads  # put-ahead allocations (master/put_ahead.py)
        yield _total("master_put_ahead_granted", "put-ahead allocations granted", aheads.granted)
        yield _total("master_put_ahead_bound", "put-ahead allocations bound to a key at PutEnd",
                     aheads.bound)
        yield _total("master_put_ahead_refused", "put-ahead binds refused (the key put again "
                     "through PutStart, or the PutEnd refused)", aheads.refused)
        yield GaugeMetricFamily("master_put_ahead_outstanding", "put-ahead allocations granted "
                                "and not yet bound or dropped", value=len(aheads.drops.outstanding))
        yield GaugeMetricFamily("master_put_ahead_dropped_keys", "versions evicted or lost that "
                                "an outstanding put-ahead allocation must not be bound behind "
                                "(state/ahead_drops.py)", value=len(aheads.drops))
        yield _total("master_pin_expired", "pins released by their TTL", service.pins.expired_total)
        yield _total("master_put_timeout", "puts revoked by the writer timeout", service.nodes.puts_timed_out)
        yield _total("master_node_expired", "nodes expired", service.nodes.nodes_expired)
        yield _total("master_rebuild_objects_adopted", "reported objects (replicas) adopted in rebuilds",
                     service.nodes.objects_adopted)
        yield _total("master_rebuild_objects_refused", "reported objects refused in rebuilds",
                     service.nodes.objects_refused)
        yield _total("master_replicas_lost", "replicas dropped after a node found them corrupt",
                     service.nodes.replicas_lost)
        queue = service.repair.queue
        yield GaugeMetricFamily("master_objects_under_replicated", "objects with fewer live replicas "
                                "than they were written with (re-replication pending)",
                                value=queue.under_replicated())
        yield GaugeMetricFamily("master_repair_copies_in_flight", "node-to-node copies planned or "
                                "running", value=len(queue.tasks))
        yield _total("master_repair_copies", "copies that became replicas", queue.copies_done)
        yield _total("master_repair_bytes_copied", "bytes of copies that became replicas",
                     queue.bytes_copied)
        yield _total("master_repair_copy_failures", "copies failed or not reported in time",
                     queue.copy_failures)
        yield _total("master_repair_replicas_trimmed", "surplus replicas dropped (a returning node)",
                     queue.replicas_trimmed)
        yield GaugeMetricFamily("master_nodes_draining", "nodes being drained (no new placements)",
                                value=sum(1 for n in service.membership.nodes.values() if n.draining))
        yield GaugeMetricFamily("master_segments_rebuilding", "segments whose index report is not "
                                "complete (no new placements)", value=service.membership.rebuilding_count)
        recovering = leadership.serving() and service.recovering()
        yield GaugeMetricFamily("master_rebuild_in_progress", "1 while this serving master may still "
                                "miss objects the nodes have not reported (rebuild)", value=int(recovering))
        yield GaugeMetricFamily("master_rebuild_elapsed_seconds", "how long the current rebuild has "
                                "run (0 when none runs)",
                                value=time.monotonic() - leadership.service_started_monotonic if recovering else 0.0)
        yield _total("master_events", "entries written to the master's event log (master/serving/events.py)",
                     leadership.events.recorded_total)
        yield _total("master_loop_lag_credited_seconds", "event-loop lag credited to node liveness",
                     service.membership.lag_credited_s)

        latency = HistogramMetricFamily("master_rpc_latency_seconds", "RPC handling time", labels=["rpc"])
        for rpc, stats in self.rpc_stats.items():
            stem = "master_" + RPC_METRIC_NAMES[rpc]
            yield _total(stem + "_requests", f"{rpc} calls", stats.requests)
            yield _total(stem + "_failures", f"{rpc} calls refused as a whole", stats.failures)
            yield _total(stem + "_keys", f"keys in {rpc} calls", stats.keys)
            yield _total(stem + "_key_failures", f"keys of {rpc} calls with a status other than OK",
                         stats.key_failures)
            cumulative = 0
            buckets = []
            for bound, count in zip(LATENCY_BUCKETS_S, stats.buckets, strict=False):
                cumulative += count
                buckets.append((repr(bound), cumulative))
            buckets.append(("+Inf", cumulative + stats.buckets[-1]))
            latency.add_metric([rpc], buckets, stats.latency_sum_s)
        yield latency


def make_registry(leadership: Leadership, rpc_stats: dict[str, RpcStats]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MasterCollector(leadership, rpc_stats))
    return registry
