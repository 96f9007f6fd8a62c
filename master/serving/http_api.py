"""The master's HTTP face: /metrics, /health, a status page and the JSON admin API.

Routes:
  GET  /metrics            Prometheus text format (per-process registry, see metrics.py)
  GET  /health             200 "ok"
  GET  /                   the HTML status page (serving/status_page.py); ?text=1 plain text
  GET  /api/v1/events      JSON: the recent events, newest first (master/serving/events.py)
  GET  /api/v1/status      JSON: role, epoch, segments, tiers (use and traffic), capacity, use,
                           objects, tenants, limits
  GET  /api/v1/tenants     JSON list of tenants with use and quotas
  POST /api/v1/tenants     JSON {"name": ..., "quota_bytes": "4GiB", "quota_objects": N}:
  PUT  /api/v1/tenants     create a tenant or change its quotas (no quota_bytes: the master's default quota; 0 or "unlimited" = unlimited)  [admin]
  GET  /api/v1/tokens      the token records (ids, kinds, tenants; never a hash)        [admin]
  POST /api/v1/tokens      JSON {"kind": "tenant"|"admin", "tenant": ..., "shm": bool,
                           "label": ...}: a new token, returned once                    [admin]
  POST /api/v1/tokens/revoke  JSON {"id": ...}                                          [admin]
  POST /api/v1/lookup      the leading run of ordered keys, per tier (serving/lookup_http.py)  [tenant]
  POST /query_by_hash, /query  Mooncake's indexer prefix query (serving/prefix_query.py)  [tenant]
  POST /api/v1/nodes/drain  JSON {"node_id": ...}; GET ?node_id=...: drain a node (drain_api.py) [admin]
  GET  /api/v1/invariants  the full O(n) check of the tables (state/audit.py), for the soak:
                           200 {"ok": true, "objects_checked": N}, 500 {"ok": false, "error"} [admin]

[admin] routes need `Authorization: Bearer <admin token>` (401 without a valid token, 403 with a
non-admin one): the one HTTP check is `_guard` around those handlers, through the same
`Authorizer` as gRPC. The read-only pages are public on the HTTP port and list no shm
endpoints unless the caller sends an admin token (the segment file is what a same-host reader
would map). /api/v1/status reports `cellar.master.serving.cluster_summary.summarize`, as ClusterStatus does.

Handlers run on the master's event loop between RPCs, so they read a consistent snapshot.
This module only reads state, except for tenant quotas through MasterService and tokens
through the TokenStore.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cellar.errors import ConfigError, QuotaExceeded
from cellar.http import HttpServer, Request, Response
from cellar.master.config import TENANT_NAME, parse_tenant_quota
from cellar.master.serving import status_page
from cellar.master.serving.auth import UNAUTHENTICATED, Authorizer, AuthRefused, Identity
from cellar.master.serving.cluster_summary import summarize
from cellar.master.serving.drain_api import add_drain_routes
from cellar.master.serving.leadership import Leadership
from cellar.master.serving.lookup_http import add_lookup_route
from cellar.master.serving.prefix_query import add_prefix_query_routes
from cellar.master.serving.token_log import NotWritten
from cellar.master.state.audit import InvariantBroken
from cellar.master.state.membership import STATE_NAMES
from cellar.master.state.records import Tenant
from cellar.proto.tiers import TIER_NAMES, merge_tier_stats, tier_totals
from cellar.tokens import KINDS
from cellar.units import format_size

log = logging.getLogger("cellar.master")


def _tenant_json(tenant: Tenant) -> dict[str, Any]:
    return {
        "name": tenant.name,
        "used_bytes": tenant.used_bytes,
        # its revoked or refused puts' ranges waiting for their write grants to expire:
        # counted against quota_bytes with used_bytes (master/quota.py)
        "quarantined_bytes": tenant.quarantined_bytes,
        "quota_bytes": tenant.quota_bytes,
        "objects": tenant.object_count,
        "quota_objects": tenant.quota_objects,
        "writing_bytes": tenant.writing_bytes,
        "quota_writing_bytes": tenant.quota_writing_bytes,
        "hard_pin": tenant.may_hard_pin,
        "hard_pinned_bytes": tenant.hard_pinned_bytes,
        "quota_hard_pin_bytes": tenant.quota_hard_pin_bytes,
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


def repair_json(service: Any) -> dict[str, Any]:
    """Re-replication and drain (master/repair.py), for the status page and /api/v1/status."""
    queue = service.repair.queue
    return {"under_replicated": queue.under_replicated(), "copies_in_flight": len(queue.tasks),
            "copies_done": queue.copies_done, "bytes_copied": queue.bytes_copied,
            "copy_failures": queue.copy_failures, "replicas_trimmed": queue.replicas_trimmed,
            "draining": sorted(n.node_id for n in service.membership.nodes.values() if n.draining)}


def status_json(leadership: Leadership, *, show_shm: bool = True) -> dict[str, Any]:
    service = leadership.service
    config = service.config
    summary = summarize(leadership, trusted=show_shm)  # what ClusterStatus reports too
    segments = [{
        "id": s.segment.segment_id,
        "node": s.segment.node.node_id,
        "host": s.segment.host_id,
        "state": STATE_NAMES.get(s.state, "UNKNOWN"),
        "capacity": s.segment.allocator.capacity_bytes,
        "used": s.used_bytes,
        "quarantined": s.segment.quarantined_bytes,
        "objects": s.object_count,
        "tier": TIER_NAMES.get(s.segment.tier, "unknown"),
        "endpoints": [{"transport": e.transport, "address": e.address} for e in s.info.endpoints],
    } for s in summary.segments]
    return {
        **_leadership_json(leadership),
        "segments": segments,
        "tiers": merge_tier_stats(
            tier_totals((s.segment.tier, s.segment.allocator.capacity_bytes, s.used_bytes,
                         s.object_count) for s in summary.segments),
            summary.tier_stats, summary.tier_moves),
        "capacity": summary.capacity_bytes,
        "used": summary.used_bytes,
        "quarantined": service.quarantine.held_bytes,
        "objects": summary.object_count,
        "writing": len(service.objects.puts),
        "pins": len(service.pins),
        "tenants": [_tenant_json(t) for t in service.tenants.all()],
        "nodes": status_page.nodes_of(segments),  # the segments per node, as the page shows them
        "repair": repair_json(service),
        "limits": {
            "max_key_bytes": config.max_key_bytes,
            "max_batch_keys": config.max_batch_keys,
            "max_list_keys": config.max_list_keys,
            "max_replicas": config.max_replicas,
            "max_object_bytes": summary.max_object_bytes,
            "pin_ttl_s": config.pin_ttl_s,
            "max_pins_per_client": config.max_pins_per_client,
            "write_grant_ttl_s": config.write_grant_ttl_s,
            "grpc_max_message_bytes": config.grpc_max_message_bytes,
            "eviction_high_watermark": config.eviction_high_watermark,
            "eviction_low_watermark": config.eviction_low_watermark,
        },
    }


def _status_text(leadership: Leadership) -> str:
    status = status_json(leadership, show_shm=False)
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
            f"  {s['id']:>20} node={s['node']} tier={s['tier']} state={s['state']} "
            f"used={format_size(s['used'])}/{format_size(s['capacity'])} objects={s['objects']}"
        )
    lines += ["", "tenants:"]
    for t in status["tenants"]:
        quota = format_size(t["quota_bytes"]) if t["quota_bytes"] else "unlimited"
        lines.append(f"  {t['name']}: used={format_size(t['used_bytes'])} quota={quota} objects={t['objects']}")
    return "\n".join(lines) + "\n"


def build_http(leadership: Leadership, registry: CollectorRegistry, authorizer: Authorizer) -> HttpServer:
    server = HttpServer()

    def _guard(handler: Callable[[Request, Identity], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """The one HTTP check: an admin token, or 401/403 before the handler runs."""
        async def guarded(request: Request) -> Response:
            try:
                identity = authorizer.check_http(request.header("authorization"), admin=True)
            except AuthRefused as exc:
                if exc.code == UNAUTHENTICATED:
                    response = Response.json({"error": exc.message}, 401)
                    response.headers["WWW-Authenticate"] = 'Bearer realm="cellar"'
                    return response
                return Response.json({"error": exc.message}, 403)
            return await handler(request, identity)
        return guarded

    def _is_admin(request: Request) -> bool:
        if not request.header("authorization"):  # an anonymous reader, not a refusal
            return False
        try:
            return authorizer.check_http(request.header("authorization"), admin=True).admin
        except AuthRefused:
            return False

    async def metrics(_: Request) -> Response:
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    async def health(_: Request) -> Response:
        return Response(200, b"ok\n")

    async def index(request: Request) -> Response:
        if request.query.get("text"):
            return Response(200, _status_text(leadership).encode())
        page = status_page.render(status_json(leadership), leadership.events.recent())
        return Response(200, page.encode(), "text/html; charset=utf-8")

    async def events(_: Request) -> Response:
        return Response.json([e.to_json() for e in leadership.events.recent()])

    async def status(request: Request) -> Response:
        return Response.json(status_json(leadership, show_shm=_is_admin(request)))

    async def list_tenants(_: Request) -> Response:
        return Response.json([_tenant_json(t) for t in leadership.service.tenants.all()])

    async def set_tenant(request: Request, _admin: Identity) -> Response:
        if not leadership.serving():
            return Response.json({"error": leadership.redirect(), "leader": leadership.redirect_address()},
                                 503)
        body = request.json()
        if not isinstance(body, dict) or "name" not in body:
            return Response.json({"error": 'expected {"name": ..., "quota_bytes": ..., "quota_objects": ...}'}, 400)
        try:
            quota = parse_tenant_quota(body["name"], body, field="body")
        except ConfigError as exc:
            return Response.json({"error": str(exc)}, 400)
        try:
            tenant = await leadership.set_tenant(body["name"], quota)
        except QuotaExceeded as exc:
            return Response.json({"error": str(exc)}, 409)
        except Exception as exc:  # noqa: BLE001 - the tenant log could not be written: unchanged
            log.warning("PUT /api/v1/tenants %r: could not write the tenant log: %s",
                        body["name"], exc)
            return Response.json({"error": f"the tenant could not be made durable ({exc}); "
                                           "nothing changed; retry"}, 503)
        return Response.json(_tenant_json(tenant))

    async def check_invariants(_: Request, _admin: Identity) -> Response:
        """The full O(n) check of the tables (cellar.master.state.audit), for the soak."""
        try:
            checked = leadership.service.check_invariants()
        except InvariantBroken as exc:
            log.error("invariant broken: %s", exc)
            return Response.json({"ok": False, "error": str(exc)}, 500)
        return Response.json({"ok": True, "objects_checked": checked})

    server.route("GET", "/metrics", metrics)
    server.route("GET", "/health", health)
    server.route("GET", "/", index)
    server.route("GET", "/api/v1/events", events)
    server.route("GET", "/api/v1/status", status)
    server.route("GET", "/api/v1/tenants", list_tenants)
    server.route("POST", "/api/v1/tenants", _guard(set_tenant))
    server.route("PUT", "/api/v1/tenants", _guard(set_tenant))
    server.route("GET", "/api/v1/invariants", _guard(check_invariants))
    add_token_routes(server, leadership, authorizer, _guard)
    add_lookup_route(server, leadership, authorizer)
    add_prefix_query_routes(server, leadership, authorizer)
    add_drain_routes(server, leadership, _guard)  # POST/GET /api/v1/nodes/drain (drain_api.py)
    return server


def add_token_routes(
    server: HttpServer, leadership: Leadership, authorizer: Authorizer,
    guard: Callable[[Callable[[Request, Identity], Awaitable[Response]]], Callable[[Request], Awaitable[Response]]],
) -> None:
    """GET/POST /api/v1/tokens and POST /api/v1/tokens/revoke (admin only, see the docstring)."""
    store = authorizer.store

    async def list_tokens(_: Request, _admin: Identity) -> Response:
        store.refresh()
        return Response.json([r.public() for r in store.records()])

    async def create_token(request: Request, admin: Identity) -> Response:
        body = request.json()
        if not isinstance(body, dict):
            return Response.json({"error": 'expected {"kind": "tenant", "tenant": ..., "shm": false}'}, 400)
        kind = body.get("kind", "tenant")
        tenant = body.get("tenant", "")
        if kind not in KINDS or not isinstance(tenant, str) or not isinstance(body.get("shm", False), bool):
            return Response.json({"error": f"kind must be one of {list(KINDS)}, tenant a string, shm a bool"}, 400)
        if kind == "tenant" and not TENANT_NAME.match(tenant):
            return Response.json({"error": f"bad tenant name {tenant!r}"}, 400)
        label = body.get("label", "")
        store.refresh()
        shm = bool(body.get("shm", False))
        try:
            if leadership.token_log is not None:  # HA: in etcd, for every later leader
                record, token = await leadership.token_log.create(kind, tenant, shm=shm,
                                                                  label=str(label))
            else:
                record, token = store.create(kind, tenant, shm=shm, label=str(label))
        except ValueError as exc:
            return Response.json({"error": str(exc)}, 400)
        except NotWritten as exc:
            return Response.json({"error": str(exc)}, 503)
        log.info("token %s (%s %s) created by admin token %s", record.id, record.kind,
                 record.tenant or "-", admin.token_id)
        # a tenant token is of use once the tenant exists (PUT /api/v1/tenants creates it)
        known = not record.tenant or record.tenant in leadership.service.tenants.by_name
        return Response.json({**record.public(), "token": token, "tenant_known": known})

    async def revoke_token(request: Request, admin: Identity) -> Response:
        body = request.json()
        token_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(token_id, str):
            return Response.json({"error": 'expected {"id": ...}'}, 400)
        store.refresh()
        try:
            revoked = (await leadership.token_log.revoke(token_id)
                       if leadership.token_log is not None else store.revoke(token_id))
        except NotWritten as exc:
            return Response.json({"error": str(exc)}, 503)
        if not revoked:
            return Response.json({"error": f"no token {token_id!r}"}, 404)
        log.info("token %s revoked by admin token %s", token_id, admin.token_id)
        return Response.json({"id": token_id, "revoked": True})

    server.route("GET", "/api/v1/tokens", guard(list_tokens))
    server.route("POST", "/api/v1/tokens", guard(create_token))
    server.route("POST", "/api/v1/tokens/revoke", guard(revoke_token))
