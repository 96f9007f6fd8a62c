"""POST /api/v1/lookup: `lookup` for callers that speak HTTP (tenant token).

    POST /api/v1/lookup   Authorization: Bearer <tenant token (or admin token + "tenant")>
    {"keys": [...ordered page keys...],
     "prefill_tokens_per_s": 20000, "tokens_per_key": 16,    (optional, together)
     "bytes_per_s": 2.5e9, "rtt_s": 0.0002}                   (optional: the caller's load rate)
 -> {"prefix_len": N, "prefix_bytes": B, "tiers": {"dram": {"keys": N, "bytes": B}},
     "load_s": ..., "tokens_reused": ..., "prefill_saved_s": ..., "advice": "load"|"recompute"}

The master does not know how fast this caller loads (the SDK measures that itself, client/
load_costs.py), so `load_s` and `advice` are answered only when the caller gives `bytes_per_s`
(its read throughput) and, for advice, its prefill rate; the rule is `cellar.advice`'s. The
keys are checked as Lookup checks them (master/lookup.py): a refused request changes nothing.
401 without a valid token, 403 for another tenant, 400 for a malformed body.
"""

from __future__ import annotations

import math
from typing import Any

from cellar.advice import advise, check_rate
from cellar.errors import InvalidArgument
from cellar.http import HttpServer, Request, Response
from cellar.master.lookup import lookup
from cellar.master.service import RequestRejected
from cellar.master.serving.auth import UNAUTHENTICATED, Authorizer, AuthRefused
from cellar.master.serving.leadership import Leadership

MAX_BYTES_PER_S = 1e13  # a bound on what a caller may claim (10 TB/s)


def add_lookup_route(server: HttpServer, leadership: Leadership, authorizer: Authorizer) -> None:
    async def lookup_route(request: Request) -> Response:
        try:
            identity = authorizer.check_http(request.header("authorization"), admin=False)
        except AuthRefused as exc:
            return Response.json({"error": exc.message}, 401 if exc.code == UNAUTHENTICATED else 403)
        if not leadership.serving():
            return Response.json({"error": leadership.redirect(),
                                  "leader": leadership.redirect_address()}, 503)
        body = request.json()
        if not isinstance(body, dict) or not isinstance(body.get("keys"), list) \
                or not all(isinstance(k, str) for k in body["keys"]):
            return Response.json({"error": 'expected {"keys": [strings], ...}'}, 400)
        tenant = identity.tenant
        if identity.admin:
            tenant = body.get("tenant", "default")
        elif body.get("tenant", tenant) != tenant:
            return Response.json({"error": f"this token is for tenant {tenant!r}"}, 403)
        rate, per_key = body.get("prefill_tokens_per_s"), body.get("tokens_per_key")
        bytes_per_s, rtt_s = body.get("bytes_per_s"), body.get("rtt_s", 0.0)
        try:
            check_rate(rate, per_key)
            for name, value, top in (("bytes_per_s", bytes_per_s, MAX_BYTES_PER_S),
                                     ("rtt_s", rtt_s, 60.0)):
                # the range first: it refuses NaN and inf, and compares a JSON integer too big
                # for a float exactly, where math.isfinite raised OverflowError (no reply)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                          or not 0 <= value <= top or not math.isfinite(value)
                                          or (name == "bytes_per_s" and value == 0)):
                    raise InvalidArgument(f"{name} must be a number in the range (0, {top:g}]")
            outcome = lookup(leadership.service, str(tenant), body["keys"])
        except (InvalidArgument, RequestRejected) as exc:
            return Response.json({"error": str(getattr(exc, "message", exc))}, 400)
        out: dict[str, Any] = {
            "prefix_len": outcome.prefix_len, "prefix_bytes": outcome.prefix_bytes,
            "tiers": {t: {"keys": k, "bytes": b} for t, k, b in outcome.tiers},
            "load_s": None, "tokens_reused": None, "prefill_saved_s": None, "advice": None}
        if bytes_per_s is not None:
            out["load_s"] = (rtt_s + outcome.prefix_bytes / bytes_per_s) if outcome.prefix_len else 0.0
        if per_key is not None:
            out["tokens_reused"] = outcome.prefix_len * per_key
        if rate is not None and per_key is not None and out["load_s"] is not None:
            verdict = advise(outcome.prefix_len, out["load_s"], rate, per_key)
            out["prefill_saved_s"], out["advice"] = verdict.prefill_saved_s, verdict.advice
        return Response.json(out)

    server.route("POST", "/api/v1/lookup", lookup_route)
