"""The drain routes of the master's admin API (an admin's `cellar node drain NODE_ID`).

  POST /api/v1/nodes/drain  JSON {"node_id": ...}: start draining the node (idempotent) and
                            answer its progress                                        [admin]
  GET  /api/v1/nodes/drain?node_id=...: the progress of a drain                        [admin]

Progress is `master/repair.py`'s `DrainStatus` as JSON: {"node_id", "draining", "done",
"remaining_objects", "remaining_bytes"}. 404 names a node that is not mounted, 400 a bad body,
503 a master that does not lead (with the leader's address). The drain itself (no new
placements, the node's objects copied elsewhere) is the repair queue's; these routes only
start it and read it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cellar.http import HttpServer, Request, Response
from cellar.master.repair import DrainRefused
from cellar.master.serving.auth import Identity
from cellar.master.serving.leadership import Leadership
from cellar.master.state.membership import MAX_NODE_ID_CHARS

Guard = Callable[[Callable[[Request, Identity], Awaitable[Response]]], Callable[[Request], Awaitable[Response]]]


def add_drain_routes(server: HttpServer, leadership: Leadership, guard: Guard) -> None:
    async def answer(node_id: object, start: bool) -> Response:
        if not leadership.serving():
            return Response.json({"error": leadership.redirect(),
                                  "leader": leadership.redirect_address()}, 503)
        if not isinstance(node_id, str) or not 0 < len(node_id) <= MAX_NODE_ID_CHARS:
            return Response.json({"error": f"node_id must be 1..{MAX_NODE_ID_CHARS} characters"}, 400)
        repair = leadership.service.repair
        try:
            status = repair.drain(node_id) if start else repair.drain_status(node_id)
        except DrainRefused as exc:
            return Response.json({"error": str(exc)}, 404)
        return Response.json(status.to_json())

    async def start_drain(request: Request, _admin: Identity) -> Response:
        body = request.json()
        if not isinstance(body, dict) or "node_id" not in body:
            return Response.json({"error": 'expected {"node_id": ...}'}, 400)
        return await answer(body["node_id"], True)

    async def drain_progress(request: Request, _admin: Identity) -> Response:
        return await answer((request.query.get("node_id") or [""])[0], False)

    server.route("POST", "/api/v1/nodes/drain", guard(start_drain))
    server.route("GET", "/api/v1/nodes/drain", guard(drain_progress))
