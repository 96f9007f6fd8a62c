"""The master's admin HTTP API (cellar.master.serving.http_api over cellar.http) fed random requests.

Random request heads (methods, paths, Content-Length values, admin/tenant/node/no
credentials) and bodies (random bytes, random
JSON of any shape and nesting, and tenant bodies with random field values) go through the real
HTTP parser and the real admin routes of a master holding tenants. Properties: every request
gets a response (never an exception, never a 5xx), a refused request (any non-200) changes no
tenant, and an accepted tenant body leaves a tenant that validates.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fuzzkit import CREDENTIALS, fingerprint, seeded_servicer
from hypothesis import given
from hypothesis import strategies as st

from cellar.http import HttpServer, Response
from cellar.master.config import MAX_QUOTA
from cellar.master.serving.http_api import build_http
from cellar.master.serving.metrics import make_registry

PATHS = ["/api/v1/tenants", "/api/v1/status", "/", "/health", "/metrics", "/nope", "//", "/api/v1/tenants?x=1"]
_SERVICER = seeded_servicer(max_tenants=50)
_HTTP: HttpServer = build_http(_SERVICER.leadership,
                               make_registry(_SERVICER.leadership, _SERVICER.stats),
                               _SERVICER.authorizer)

_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False),
              st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=30)
_value = st.one_of(st.sampled_from([0, 1, -1, 1 << 63, 1 << 64, "4GiB", "-1MiB", "1e3", "", "lots",
                                    True, None, [], {}]), _json)
_tenant_body = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["alpha", "beta", "new-one", "", "bad name", "x" * 200]),
                       st.text(max_size=10))},
    optional={k: _value for k in ("quota_bytes", "quota_objects", "quota_writing_bytes", "hard_pin",
                                  "quota_hard_pin_bytes", "extra")})
_body = st.one_of(st.binary(max_size=300), _json.map(lambda v: json.dumps(v).encode()),
                  _tenant_body.map(lambda v: json.dumps(v).encode()),
                  st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n))


async def _roundtrip(head: bytes, body: bytes) -> Response:
    reader = asyncio.StreamReader(limit=16 * 1024)
    reader.feed_data(head + body)
    reader.feed_eof()
    try:
        # a header deadline far enough ahead: the fed bytes are all there already
        return await _HTTP._handle(reader, asyncio.get_running_loop().time() + 5.0)
    except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, UnicodeError):
        return Response(400)  # what HttpServer._respond answers for these


@given(st.sampled_from(["GET", "POST", "PUT", "DELETE", "get", "BREW"]), st.sampled_from(PATHS),
       st.one_of(st.none(), st.sampled_from(["0", "-1", "+3", "99999999999999", "abc", "1 1"]),
                 st.integers(0, 400).map(str)), _body, st.sampled_from(CREDENTIALS))
def test_random_admin_requests(method: str, path: str, length: Any, body: bytes, token: str) -> None:
    declared = str(len(body)) if length is None else length
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {declared}\r\n\r\n").encode()
    service = _SERVICER.service
    before = fingerprint(service)
    response = asyncio.run(_roundtrip(head, body))
    assert 200 <= response.status < 500, response.body
    if response.status != 200 or method.upper() not in ("POST", "PUT"):
        assert fingerprint(service) == before
    else:  # an accepted tenant body: every quota in range, the tenant bound held
        for t in service.tenants.all():
            for quota in (t.quota_bytes, t.quota_objects, t.quota_writing_bytes, t.quota_hard_pin_bytes):
                assert 0 <= quota <= MAX_QUOTA
        assert service.tenants.count <= service.config.max_tenants


@given(st.binary(max_size=400))
def test_random_bytes_as_a_request(raw: bytes) -> None:
    before = fingerprint(_SERVICER.service)
    response = asyncio.run(_roundtrip(raw, b""))
    assert response.status < 500
    if response.status != 200:
        assert fingerprint(_SERVICER.service) == before
