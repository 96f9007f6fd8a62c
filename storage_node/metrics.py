"""Node observability: Prometheus metrics and the HTTP endpoints beside them.

Metrics live in a per-process registry and are computed at scrape time from the sources that
already count them: the data server's stats (bytes, requests, errors, connections), the
index (objects and sealed bytes per segment) and the control loop (master connection). So
the data-plane hot path pays for no Prometheus call of its own.

Endpoints (only when `--http` is given): `/metrics`, `/health` (200 once mounted, else 503),
`/api/v1/status` (JSON: node id, segments, index counts, master epoch, connected).
It never changes node state; every handler only reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cellar.http import HttpServer, Request, Response
from cellar.proto.tiers import TIER_NAMES
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer.frame import (
    ST_BAD_GRANT,
    ST_EXPIRED,
    ST_OUT_OF_RANGE,
    ST_STALE_EPOCH,
    STATUS_NAMES,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# frame statuses (transfer/frame.py STATUS_NAMES) that mean "your grant does not allow this"
GRANT_REFUSAL_STATUSES = (
    STATUS_NAMES[ST_BAD_GRANT], STATUS_NAMES[ST_EXPIRED], STATUS_NAMES[ST_STALE_EPOCH],
    STATUS_NAMES[ST_OUT_OF_RANGE],
)


def _slug(name: str) -> str:
    return name.replace(" ", "_")


class NodeCollector(Collector):
    """Reads the node's counters at scrape time."""

    def __init__(
        self,
        segments: Mapping[int, Segment],
        index: ObjectIndex,
        server_stats: Callable[[], Mapping[str, Any]],
        master_connected: Callable[[], bool],
    ) -> None:
        self._segments = segments
        self._index = index
        self._server_stats = server_stats
        self._master_connected = master_connected

    def collect(self) -> Iterator[Metric]:
        stats = self._server_stats()
        yield CounterMetricFamily("node_bytes_written", "payload bytes received by writes",
                                  value=stats.get("bytes_in", 0))
        yield CounterMetricFamily("node_bytes_read", "payload bytes sent by reads",
                                  value=stats.get("bytes_out", 0))
        requests = CounterMetricFamily("node_requests", "data-plane requests served",
                                       labels=["op"])
        for op, count in sorted(stats.get("requests", {}).items()):
            requests.add_metric([op], count)
        yield requests
        errors = CounterMetricFamily("node_request_errors", "data-plane requests refused",
                                     labels=["status"])
        for status, count in sorted(stats.get("errors", {}).items()):
            errors.add_metric([_slug(status)], count)
        yield errors
        # Always every reason, zero included, so dashboards and alerts see the series exist.
        refusals = CounterMetricFamily("node_grant_refusals", "data-plane requests refused for "
                                       "their grant", labels=["reason"])
        counted = stats.get("errors", {})
        for status in GRANT_REFUSAL_STATUSES:
            refusals.add_metric([_slug(status)], counted.get(status, 0))
        yield refusals
        yield GaugeMetricFamily("node_active_connections", "open data-plane connections",
                                value=stats.get("active_connections", 0))
        by_op = CounterMetricFamily("node_refusals", "data-plane requests refused, by op and "
                                    "status (refused grants and commits)", labels=["op", "reason"])
        for key, count in sorted(stats.get("errors_by_op", {}).items()):
            op, _, status = key.partition("/")
            by_op.add_metric([op, _slug(status)], count)
        yield by_op
        connections = CounterMetricFamily("node_connections_refused", "data-plane connections "
                                          "refused or closed unauthenticated, by reason",
                                          labels=["reason"])
        for reason, count in sorted(stats.get("connections_refused_by_reason", {}).items()):
            connections.add_metric([reason], count)
        yield connections
        usage = self._index.usage()
        capacity = GaugeMetricFamily("node_segment_capacity_bytes", "segment size",
                                     labels=["segment"])
        sealed = GaugeMetricFamily("node_segment_sealed_bytes",
                                   "bytes of completely written objects", labels=["segment"])
        objects = GaugeMetricFamily("node_objects", "objects in the node's index",
                                    labels=["segment"])
        for seg_id, segment in sorted(self._segments.items()):
            label = [str(seg_id)]
            row = usage.get(seg_id)
            capacity.add_metric(label, segment.size_bytes)
            sealed.add_metric(label, row.sealed_bytes if row else 0)
            objects.add_metric(label, row.objects if row else 0)
        yield capacity
        yield sealed
        yield objects
        dropped = CounterMetricFamily("node_corrupt_dropped", "dropped as corrupt, never served: "
                                      "a segment or disk-tier file of the wrong size at start "
                                      "(what=file), restored objects failing their checksum "
                                      "(what=objects)", labels=["segment", "tier", "what"])
        for seg_id, segment in sorted(self._segments.items()):
            tier = TIER_NAMES.get(segment.tier, "unknown")
            dropped.add_metric([str(seg_id), tier, "file"], segment.dropped_files)
            dropped.add_metric([str(seg_id), tier, "objects"], segment.dropped_objects)
        yield dropped
        yield GaugeMetricFamily("node_index_tombstones",
                                "freed allocations still refusing writes",
                                value=self._index.counts()["tombstones"])
        yield GaugeMetricFamily("node_master_connected", "1 if the last master RPC succeeded",
                                value=1 if self._master_connected() else 0)


def build_registry(collector: NodeCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def build_http(
    registry: CollectorRegistry,
    status: Callable[[], dict[str, Any]],
    healthy: Callable[[], bool],
) -> HttpServer:
    server = HttpServer()

    async def metrics(_request: Request) -> Response:
        return Response(200, generate_latest(registry), CONTENT_TYPE)

    async def health(_request: Request) -> Response:
        ok = healthy()
        return Response.json({"status": "ok" if ok else "not mounted"}, 200 if ok else 503)

    async def api_status(_request: Request) -> Response:
        return Response.json(status())

    server.route("GET", "/metrics", metrics)
    server.route("GET", "/health", health)
    server.route("GET", "/api/v1/status", api_status)
    return server
