"""The master's HTTP face: /metrics, /health, a status page and the JSON admin API.

Routes:
  GET  /metrics            Prometheus text format (per-process registry, see metrics.py)
  GET  /health             200 "ok"
  GET  /                   the HTML status page (master/statuspage.py); ?text=1 plain text
  GET  /api/v1/events      JSON: the recent events, newest first (master/events.py)
  GET  /api/v1/status      JSON: role, epoch, segments, capacity, use, objects, tenants, limits
  GET  /api/v1/tenants     JSON list of tenants with use and quotas
  POST /api/v1/tenants     JSON {"name": ..., "quota_bytes": "4GiB", "quota_objects": N}:
  PUT  /api/v1/tenants     create a tenant or change its quotas (0 = unlimited)

Handlers run on the master's event loop between RPCs, so they read a consistent snapshot.
This module only reads state, except for tenant quotas through MasterService.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cellar.errors import ConfigError
from cellar.http import HttpServer, Request, Response
from cellar.master import statuspage
from cellar.master.config import parse_tenant_quota
from cellar.master.leadership import Leadership
from cellar.master.membership import STATE_NAMES
from cellar.master.tenants import Tenant
from cellar.units import format_size


def _tenant_json(tenant: Tenant) -> dict[str, Any]:
    return {
        "name": tenant.name,
        "used_bytes": tenant.used_bytes,
        "quota_bytes": tenant.quota_bytes,
        "objects": tenant.object_count,
        "quota_objects": tenant.quota_objects,
    }


def _leadership_json(leadership: Leadership) -> dict[str, Any]:
    leader = leadership.leader
    takeover = leadership.takeover
    return {
        "role": leadership.role,
        "epoch": leadership.epoch,
        "serving": leadership.serving(),
        "master_id": leadership.master_id,
        "cluster": leadership.config.cluster if leadership.ha else "",
        "leader": None if leader is None else {
            "master_id": leader.master_id, "address": leader.address, "http": leader.http,
            "epoch": leader.epoch,
        },
        "lease_remaining_s": round(leadership.lease_remaining_s(), 3),
        "elections_won": leadership.elections_won,
        "takeover": None if not takeover.epoch else {
            "epoch": takeover.epoch, "complete": takeover.complete,
            "duration_s": round(takeover.duration_s, 3),
            "recovered_objects": takeover.recovered_objects, "nodes": takeover.nodes,
        },
    }


def status_json(leadership: Leadership) -> dict[str, Any]:
    service = leadership.service
    capacity, used = service.capacity()
    config = service.config
    segments = []
    for segment in service.membership.segments.values():
        segments.append({
            "id": segment.segment_id,
            "node": segment.node.node_id,
            "host": segment.host_id,
            "state": STATE_NAMES.get(segment.node.state, "UNKNOWN"),
            "capacity": segment.allocator.capacity_bytes,
            "used": segment.allocator.used_bytes,
            "quarantined": segment.quarantined_bytes,
            "objects": len(segment.objects),
            "endpoints": [
                {"transport": e.transport, "address": e.address} for e in segment.info.endpoints
            ],
        })
    return {
        **_leadership_json(leadership),
        "segments": segments,
        "capacity": capacity,
        "used": used,
        "quarantined": service.quarantine.held_bytes,
        "objects": service.objects.complete_count,
        "writing": len(service.objects.puts),
        "pins": len(service.pins),
        "tenants": [_tenant_json(t) for t in service.tenants.all()],
        "nodes": statuspage.nodes_of(segments),  # the segments per node, as the page shows them
        "limits": {
            "max_key_bytes": config.max_key_bytes,
            "max_batch_keys": config.max_batch_keys,
            "max_replicas": config.max_replicas,
            "max_object_bytes": service.largest_placeable_bytes(),
            "pin_ttl_s": config.pin_ttl_s,
            "max_pins_per_client": config.max_pins_per_client,
            "write_grant_ttl_s": config.write_grant_ttl_s,
            "grpc_max_message_bytes": config.grpc_max_message_bytes,
            "eviction_high_watermark": config.eviction_high_watermark,
            "eviction_low_watermark": config.eviction_low_watermark,
        },
    }


def _status_text(leadership: Leadership) -> str:
    status = status_json(leadership)
    leader = status["leader"]
    lines = [
        f"cellar master ({status['role']}, epoch {status['epoch']})"
        + (f", leader {leader['master_id']} at {leader['address']}" if leader else ""),
        f"capacity {format_size(status['capacity'])}, used {format_size(status['used'])}, "
        f"objects {status['objects']}, writing {status['writing']}, pins {status['pins']}",
        "",
        "segments:",
    ]
    for s in status["segments"]:
        lines.append(
            f"  {s['id']:>20} node={s['node']} state={s['state']} "
            f"used={format_size(s['used'])}/{format_size(s['capacity'])} objects={s['objects']}"
        )
    lines += ["", "tenants:"]
    for t in status["tenants"]:
        quota = format_size(t["quota_bytes"]) if t["quota_bytes"] else "unlimited"
        lines.append(f"  {t['name']}: used={format_size(t['used_bytes'])} quota={quota} objects={t['objects']}")
    return "\n".join(lines) + "\n"


def build_http(leadership: Leadership, registry: CollectorRegistry) -> HttpServer:
    server = HttpServer()

    async def metrics(_: Request) -> Response:
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    async def health(_: Request) -> Response:
        return Response(200, b"ok\n")

    async def index(request: Request) -> Response:
        if request.query.get("text"):
            return Response(200, _status_text(leadership).encode())
        page = statuspage.render(status_json(leadership), leadership.events.recent())
        return Response(200, page.encode(), "text/html; charset=utf-8")

    async def events(_: Request) -> Response:
        return Response.json([e.to_json() for e in leadership.events.recent()])

    async def status(_: Request) -> Response:
        return Response.json(status_json(leadership))

    async def list_tenants(_: Request) -> Response:
        return Response.json([_tenant_json(t) for t in leadership.service.tenants.all()])

    async def set_tenant(request: Request) -> Response:
        if not leadership.serving():
            return Response.json({"error": leadership.redirect(), "leader": leadership.redirect_address()},
                                 503)
        service = leadership.service
        body = request.json()
        if not isinstance(body, dict) or "name" not in body:
            return Response.json({"error": 'expected {"name": ..., "quota_bytes": ..., "quota_objects": ...}'}, 400)
        try:
            quota = parse_tenant_quota(body["name"], body, field="body")
        except ConfigError as exc:
            return Response.json({"error": str(exc)}, 400)
        tenant = service.set_tenant_quota(body["name"], quota)
        return Response.json(_tenant_json(tenant))

    server.route("GET", "/metrics", metrics)
    server.route("GET", "/health", health)
    server.route("GET", "/", index)
    server.route("GET", "/api/v1/events", events)
    server.route("GET", "/api/v1/status", status)
    server.route("GET", "/api/v1/tenants", list_tenants)
    server.route("POST", "/api/v1/tenants", set_tenant)
    server.route("PUT", "/api/v1/tenants", set_tenant)
    return server
