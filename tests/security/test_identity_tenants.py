"""Tenant isolation: the master takes the tenant from the token, never from the request.

Each test fails on a master without authentication (the tenant was whatever the caller
claimed): bob claiming `alice` could read, overwrite, remove and wipe alice's objects.
"""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from identity_kit import SecurityCluster, code_of

import cellar
from cellar.proto import cellar_pb2 as pb


def _alice(cluster: SecurityCluster) -> cellar.Client:
    return cellar.connect(cluster.address, tenant="alice", token=cluster.alice)


def test_another_tenants_token_cannot_read_write_or_remove(cluster: SecurityCluster) -> None:
    with _alice(cluster) as alice:
        alice.put("iso/1", b"alice's first")
        alice.put("iso/2", b"alice's second")
        # bob's token claiming alice: refused on every per-tenant call (fast line and gRPC)
        with cellar.connect(cluster.address, tenant="alice", token=cluster.bob) as bob_as_alice:
            calls = [
                lambda: bob_as_alice.get("iso/1"),
                lambda: bob_as_alice.exists("iso/1"),
                lambda: bob_as_alice.put("iso/3", b"planted"),
                lambda: bob_as_alice.upsert("iso/1", b"overwritten"),
                lambda: bob_as_alice.remove("iso/1"),
                lambda: bob_as_alice.remove_prefix("iso/"),
            ]
            for call in calls:
                with pytest.raises(cellar.PermissionDenied) as info:
                    call()
                assert not isinstance(info.value, cellar.Unauthenticated)
                assert "for tenant 'bob', not 'alice'" in str(info.value)
        # bob as himself sees his own namespace only
        with cellar.connect(cluster.address, tenant="bob", token=cluster.bob) as bob:
            with pytest.raises(cellar.NotFound):
                bob.get("iso/1")
            assert not bob.exists("iso/2")
            assert bob.remove_prefix("iso/") == 0
        # nothing of alice's changed
        assert alice.get("iso/1") == b"alice's first"
        assert alice.get("iso/2") == b"alice's second"
        assert not alice.exists("iso/3")


def test_remove_all_of_another_tenant_is_refused(cluster: SecurityCluster, stub) -> None:  # type: ignore[no-untyped-def]
    with _alice(cluster) as alice:
        alice.put("wipe/1", b"keep me")
        bob_claims_alice = pb.RequestHeader(tenant="alice", client_id="bob", token=cluster.bob)
        code = code_of(lambda: stub.RemoveAll(pb.RemoveAllRequest(header=bob_claims_alice)))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        # bob's own RemoveAll (the tenant filled in from his token) touches only bob's keys
        bob = pb.RequestHeader(client_id="bob", token=cluster.bob)
        stub.RemoveAll(pb.RemoveAllRequest(header=bob))
        assert alice.get("wipe/1") == b"keep me"


def test_no_or_unknown_token_is_unauthenticated(cluster: SecurityCluster, stub) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(cellar.Unauthenticated):
        cellar.connect(cluster.address, tenant="alice", token="")
    forged = "cellar_" + "0" * 12 + "_" + "A" * 43
    with pytest.raises(cellar.Unauthenticated):
        cellar.connect(cluster.address, tenant="alice", token=forged)
    for token in ("", forged, cluster.alice + "x", "Bearer " + cluster.alice):
        header = pb.RequestHeader(tenant="alice", client_id="x", token=token)
        assert code_of(lambda h=header: stub.Exists(pb.KeysRequest(header=h, keys=["k"]))) == \
            grpc.StatusCode.UNAUTHENTICATED


def test_a_revoked_token_stops_working_at_once(cluster: SecurityCluster) -> None:
    created = cluster.admin_request("POST", "/api/v1/tokens", {"kind": "tenant", "tenant": "alice"})
    with cellar.connect(cluster.address, tenant="alice", token=created["token"]) as client:
        client.put("rev/1", b"x")
        cluster.admin_request("POST", "/api/v1/tokens/revoke", {"id": created["id"]})
        with pytest.raises(cellar.Unauthenticated):
            client.get("rev/1")
    with _alice(cluster) as alice:  # the object itself is untouched
        assert alice.get("rev/1") == b"x"


def _foreign_tenant_refusals(cluster: SecurityCluster) -> tuple[float, str]:
    with urllib.request.urlopen(f"{cluster.http_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    line = next((x for x in text.splitlines()
                 if x.startswith('master_auth_refusals_total{reason="foreign_tenant"}')), None)
    return (0.0 if line is None else float(line.split()[-1])), text


def test_refusals_are_counted_by_reason(cluster: SecurityCluster, stub) -> None:  # type: ignore[no-untyped-def]
    # before and after: earlier tests of this module refused foreign tenants too
    before, _ = _foreign_tenant_refusals(cluster)
    header = pb.RequestHeader(tenant="alice", client_id="x", token=cluster.bob)
    assert code_of(lambda: stub.Exists(pb.KeysRequest(header=header, keys=["k"]))) == \
        grpc.StatusCode.PERMISSION_DENIED
    after, text = _foreign_tenant_refusals(cluster)
    assert after == before + 1
    assert cluster.bob not in text and cluster.alice not in text  # tokens are never shown
