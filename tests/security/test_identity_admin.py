"""The admin API needs an admin token; tokens are managed through it and never shown again.

On a master without authentication `PUT /api/v1/tenants` created tenants and changed quotas
for anyone; these tests fail there."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import grpc
from identity_kit import SecurityCluster, code_of

import cellar
from cellar.proto import cellar_pb2 as pb


def http(cluster: SecurityCluster, method: str, path: str, body: Any = None,
         token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(cluster.http_url + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def tenants(cluster: SecurityCluster) -> dict[str, Any]:
    return {t["name"]: t for t in http(cluster, "GET", "/api/v1/tenants")[1]}


def test_tenant_changes_need_an_admin_token(cluster: SecurityCluster) -> None:
    before = tenants(cluster)
    for method in ("POST", "PUT"):
        assert http(cluster, method, "/api/v1/tenants", {"name": "mallory"})[0] == 401
        assert http(cluster, method, "/api/v1/tenants", {"name": "alice", "quota_bytes": 1},
                    token="cellar_" + "0" * 12 + "_" + "A" * 43)[0] == 401
        assert http(cluster, method, "/api/v1/tenants", {"name": "alice", "quota_bytes": 1},
                    token=cluster.alice)[0] == 403
    assert tenants(cluster) == before  # no tenant created, no quota changed
    code, body = http(cluster, "PUT", "/api/v1/tenants", {"name": "carol", "quota_bytes": "1MiB"},
                      token=cluster.admin_token)
    assert code == 200 and body["quota_bytes"] == 1 << 20


def test_tokens_are_created_listed_and_revoked_by_admins_only(cluster: SecurityCluster) -> None:
    assert http(cluster, "GET", "/api/v1/tokens")[0] == 401
    assert http(cluster, "GET", "/api/v1/tokens", token=cluster.bob)[0] == 403
    assert http(cluster, "POST", "/api/v1/tokens", {"kind": "admin"}, token=cluster.bob)[0] == 403
    code, made = http(cluster, "POST", "/api/v1/tokens", {"kind": "tenant", "tenant": "alice"},
                      token=cluster.admin_token)
    assert code == 200 and made["token"].startswith("cellar_") and made["tenant"] == "alice"
    code, listed = http(cluster, "GET", "/api/v1/tokens", token=cluster.admin_token)
    assert code == 200 and made["id"] in {r["id"] for r in listed}
    shown = json.dumps(listed)
    assert made["token"] not in shown and "sha256" not in shown  # never the token nor its hash
    assert cluster.admin_token not in cluster.tokens_path.read_text()  # the store holds hashes
    assert (cluster.tokens_path.stat().st_mode & 0o777) == 0o600
    assert http(cluster, "POST", "/api/v1/tokens/revoke", {"id": made["id"]}, token=cluster.alice)[0] == 403
    assert http(cluster, "POST", "/api/v1/tokens/revoke", {"id": made["id"]},
                token=cluster.admin_token)[0] == 200
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice):
        pass  # other tokens are unaffected
    try:
        cellar.connect(cluster.address, tenant="alice", token=made["token"]).close()
        raise AssertionError("a revoked token connected")
    except cellar.Unauthenticated:
        pass


def test_admin_acts_for_any_tenant_and_tenants_cannot(cluster: SecurityCluster, stub) -> None:  # type: ignore[no-untyped-def]
    with cellar.connect(cluster.address, tenant="bob", token=cluster.bob) as bob:
        bob.put("adm/1", b"bob's")
        alice_claims_bob = pb.RequestHeader(tenant="bob", client_id="a", token=cluster.alice)
        assert code_of(lambda: stub.RemoveAll(pb.RemoveAllRequest(header=alice_claims_bob))) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert bob.get("adm/1") == b"bob's"
        admin = pb.RequestHeader(tenant="bob", client_id="admin", token=cluster.admin_token)
        assert stub.RemoveAll(pb.RemoveAllRequest(header=admin)).removed >= 1  # across tenants
        assert not bob.exists("adm/1")


def test_status_page_hides_segment_files_from_anonymous_readers(cluster: SecurityCluster) -> None:
    _, anonymous = http(cluster, "GET", "/api/v1/status")
    assert anonymous["segments"] and all(
        e["transport"] != "shm" for s in anonymous["segments"] for e in s["endpoints"])
    _, admin = http(cluster, "GET", "/api/v1/status", token=cluster.admin_token)
    shm = [e for s in admin["segments"] for e in s["endpoints"] if e["transport"] == "shm"]
    assert len(shm) == len(admin["segments"]) and all(e["address"].startswith("/") for e in shm)
