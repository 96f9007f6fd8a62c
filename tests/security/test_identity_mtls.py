"""Mutual TLS for nodes: a client certificate `node:<id>` instead of the node credential.

`LocalCluster(tls=True)` gives the master the throwaway CA as `tls_client_ca_file` and a second
gRPC port (`node_listen`, `cluster.node_port`) that requires a certificate from it; each node
presents its own `node:<id>` certificate there and sends no token. Tenant clients keep the
ordinary port, without certificates. Each test fails if the master ignored the certificate
(the nodes would be UNAUTHENTICATED), trusted it beyond its node id, or trusted another CA.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from identity_kit import code_of

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.http_fetch import fetch
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc

pytest.importorskip("cryptography")
from cellar.tls import make_dev_pki  # noqa: E402  (needs cryptography)

WAIT_S = 30.0


@pytest.fixture(scope="module")
def mtls_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(2, "64MiB", tls=True, node_flags={"heartbeat_interval_s": 0.2}) as cluster:
        yield cluster


def _metrics(cluster: LocalCluster) -> str:
    return fetch(cluster.http_url, "/metrics", timeout_s=5, ca_file=cluster.http_ca).decode()


def _metric(cluster: LocalCluster, name: str) -> float:
    text = _metrics(cluster)
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _channel(cluster: LocalCluster, cert: tuple[Path, Path] | None, *, node_port: bool = True) -> grpc.Channel:
    assert cluster.tls is not None
    creds = grpc.ssl_channel_credentials(
        cluster.tls.ca_file.read_bytes(),
        private_key=cert[1].read_bytes() if cert else None,
        certificate_chain=cert[0].read_bytes() if cert else None)
    port = cluster.node_port if node_port else int(cluster.address.rpartition(":")[2])
    return grpc.secure_channel(f"127.0.0.1:{port}", creds)


def _client_files(cluster: LocalCluster, node_id: str) -> tuple[Path, Path]:
    assert cluster.tls is not None
    files = cluster.tls.node_client_files(node_id)
    assert files is not None
    return files


def _segments(cluster: LocalCluster) -> dict[str, list[Any]]:
    with _channel(cluster, None, node_port=False) as channel:
        header = pb.RequestHeader(client_id="admin", token=cluster.admin_token)
        out: dict[str, list[Any]] = {}
        for s in pb_grpc.MasterStub(channel).ClusterStatus(pb.ClusterStatusRequest(header=header),
                                                          timeout=10).segments:
            out.setdefault(s.info.node_id, []).append(s)
        return out


def test_nodes_with_a_certificate_and_no_credential_mount_heartbeat_and_serve(
        mtls_cluster: LocalCluster) -> None:
    for child in mtls_cluster.nodes:  # each node reaches the mTLS port with its own certificate
        argv = child.argv
        assert argv[argv.index("--master") + 1] == f"127.0.0.1:{mtls_cluster.node_port}"
        assert argv[argv.index("--master-tls-cert-file") + 1].endswith(f"client-{child.node_id}.pem")
    assert set(_segments(mtls_cluster)) == {"node-0", "node-1"}
    before = _metric(mtls_cluster, "master_heartbeat_requests_total")
    deadline = time.monotonic() + WAIT_S  # heartbeats every 0.2 s: a few must arrive
    while _metric(mtls_cluster, "master_heartbeat_requests_total") < before + 4:
        assert time.monotonic() < deadline, "no heartbeats over mutual TLS"
        time.sleep(0.1)
    assert _metric(mtls_cluster, "master_heartbeat_failures_total") == 0
    assert _metric(mtls_cluster, "master_mount_segment_failures_total") == 0
    # the nodes sent no token: a master that ignored the certificate would have refused them
    assert 'master_auth_refusals_total{reason="no_token"}' not in _metrics(mtls_cluster)
    with cellar.connect(mtls_cluster.address) as client:  # a tenant client without a certificate
        blobs = {f"mtls/{i}": bytes([i]) * (64 << 10) for i in range(16)}
        for key, value in blobs.items():
            client.put(key, value, replicas=2)
        for key, value in blobs.items():
            assert client.get(key) == value
        status = client.status()
        assert len(status["nodes"]) == 2 and all(n["state"] == "ACTIVE" for n in status["nodes"])


def test_a_certificate_for_one_node_cannot_act_as_another(mtls_cluster: LocalCluster) -> None:
    victim = _segments(mtls_cluster)["node-1"][0]
    with _channel(mtls_cluster, _client_files(mtls_cluster, "node-0")) as channel:
        stub = pb_grpc.MasterStub(channel)
        header = pb.RequestHeader(client_id="node-0")  # no token: the certificate speaks
        requests = {
            "MountSegment": pb.MountSegmentRequest(header=header, node_id="node-1", incarnation=7,
                                                   segments=[victim.info]),
            "UnmountSegment": pb.UnmountSegmentRequest(header=header, node_id="node-1",
                                                       segment_ids=[victim.info.segment_id]),
            "Heartbeat": pb.HeartbeatRequest(header=header, node_id="node-1", incarnation=1),
        }
        for rpc, request in requests.items():
            assert code_of(lambda r=request, m=rpc: getattr(stub, m)(r, timeout=10)) == \
                grpc.StatusCode.PERMISSION_DENIED, rpc
        # nor is a node certificate a tenant's identity
        put = pb.KeysRequest(header=pb.RequestHeader(tenant="default", client_id="node-0"),
                             keys=["mtls/1"])
        assert code_of(lambda: stub.Exists(put, timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
        # while its own id passes the check (the service then answers for this made-up request)
        try:
            stub.Heartbeat(pb.HeartbeatRequest(header=header, node_id="node-0", incarnation=0),
                           timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() not in (grpc.StatusCode.UNAUTHENTICATED,
                                      grpc.StatusCode.PERMISSION_DENIED)
    assert _metric(mtls_cluster, 'master_auth_refusals_total{reason="foreign_node"}') >= 3
    after = _segments(mtls_cluster)["node-1"][0]
    assert (after.info.segment_id, after.state) == (victim.info.segment_id, victim.state)


def test_another_ca_or_no_certificate_gives_no_node_rights(mtls_cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    stranger = make_dev_pki(tmp_path / "other", ["127.0.0.1"], ["node-0"])
    foreign = stranger.node_client_files("node-0")
    assert foreign is not None
    header = pb.RequestHeader(client_id="node-0")
    mount = pb.MountSegmentRequest(header=header, node_id="node-0", incarnation=0)
    # the mTLS port: the handshake fails for a certificate of another CA and for none at all
    for cert in (foreign, None):
        with _channel(mtls_cluster, cert) as channel:
            assert code_of(lambda ch=channel: pb_grpc.MasterStub(ch).MountSegment(
                mount, timeout=10)) == grpc.StatusCode.UNAVAILABLE
    # the ordinary port never reads certificates: even this cluster's own node certificate
    # without a token is nobody there, and a tenant token still works beside it
    for cert in (foreign, _client_files(mtls_cluster, "node-0")):
        with _channel(mtls_cluster, cert, node_port=False) as channel:
            stub = pb_grpc.MasterStub(channel)
            assert code_of(lambda s=stub: s.MountSegment(mount, timeout=10)) == \
                grpc.StatusCode.UNAUTHENTICATED
            tenant = pb.RequestHeader(client_id="t", token=mtls_cluster.token)
            assert stub.ClusterStatus(pb.ClusterStatusRequest(header=tenant), timeout=10).segments
    assert set(_segments(mtls_cluster)) == {"node-0", "node-1"}



def test_a_master_that_refuses_node_credentials_takes_nodes_by_certificate_only() -> None:
    # `refuse_node_credentials`: the credential any holder of the cluster secret can compute
    # for any node id no longer makes a node; the certificate `node:<id>` still does
    from cellar.proto.grant import node_credential
    from cellar.secret import ENV_SECRET, load_cluster_secret

    with LocalCluster(1, "64MiB", tls=True, node_flags={"heartbeat_interval_s": 0.2},
                      master_flags={"refuse_node_credentials": "true"}) as cluster:
        assert set(_segments(cluster)) == {"node-0"}  # mounted by its certificate
        with cellar.connect(cluster.address) as client:
            client.put("refuse/k", b"v" * 4096)
            assert client.get("refuse/k") == b"v" * 4096
        secret = load_cluster_secret(None, environ={ENV_SECRET: cluster.secret})
        victim = _segments(cluster)["node-0"][0]
        header = pb.RequestHeader(client_id="node-0", token=node_credential(secret, "node-0"))
        requests = {
            "MountSegment": pb.MountSegmentRequest(header=header, node_id="node-0",
                                                   incarnation=7, segments=[victim.info]),
            "Heartbeat": pb.HeartbeatRequest(header=header, node_id="node-0", incarnation=1),
        }
        for node_port in (False, True):  # the credential is nobody on either port
            cert = _client_files(cluster, "node-0") if node_port else None
            with _channel(cluster, cert, node_port=node_port) as channel:
                stub = pb_grpc.MasterStub(channel)
                for rpc, request in requests.items():
                    assert code_of(lambda r=request, m=rpc, st=stub: getattr(st, m)(r, timeout=10)) == \
                        grpc.StatusCode.UNAUTHENTICATED, (rpc, node_port)
        assert _metric(cluster,
                       'master_auth_refusals_total{reason="node_credential_refused"}') >= 4
        after = _segments(cluster)["node-0"][0]
        assert (after.info.segment_id, after.state) == (victim.info.segment_id, victim.state)


# ---- the rules without processes (the same Authorizer.check the interceptor calls)

def test_the_authorizer_takes_a_verified_peer_node_id_only_for_its_node_rpcs() -> None:
    from cellar.master.serving.auth import Authorizer, AuthRefused, node_id_of_peer
    from cellar.tokens import KIND_TENANT, TokenStore

    assert node_id_of_peer([b"node:node-3"]) == "node-3"
    assert node_id_of_peer([b"node:"]) == node_id_of_peer([b"cellar dev CA"]) == node_id_of_peer([]) == ""
    store = TokenStore(None)
    alice = store.create(KIND_TENANT, "alice")[1]
    auth = Authorizer(store, bytes(32))
    own = pb.HeartbeatRequest(header=pb.RequestHeader(), node_id="node-3")
    assert auth.check("Heartbeat", own, "node-3").node_id == "node-3"
    refusals = {
        "foreign_node": ("Heartbeat", pb.HeartbeatRequest(header=pb.RequestHeader(), node_id="node-4")),
        "not_a_client": ("Exists", pb.KeysRequest(header=pb.RequestHeader(tenant="alice"))),
        # a token, when sent, decides: a tenant's token over a node's certificate is a tenant
        "not_a_node": ("Heartbeat", pb.HeartbeatRequest(header=pb.RequestHeader(token=alice),
                                                        node_id="node-3")),
    }
    for reason, (method, request) in refusals.items():
        with pytest.raises(AuthRefused) as info:
            auth.check(method, request, "node-3")
        assert (info.value.code, info.value.reason) == ("PERMISSION_DENIED", reason)
    with pytest.raises(AuthRefused) as info:  # no certificate, no token: nobody
        auth.check("Heartbeat", own)
    assert info.value.reason == "no_token"


def test_an_authorizer_that_refuses_node_credentials_still_takes_certificates() -> None:
    from cellar.master.serving.auth import Authorizer, AuthRefused
    from cellar.proto.grant import node_credential
    from cellar.tokens import KIND_TENANT, TokenStore

    store = TokenStore(None)
    alice = store.create(KIND_TENANT, "alice")[1]
    secret = bytes(range(32))
    credential = node_credential(secret, "node-3")
    heartbeat = pb.HeartbeatRequest(header=pb.RequestHeader(token=credential), node_id="node-3")
    assert Authorizer(store, secret).check("Heartbeat", heartbeat).node_id == "node-3"
    auth = Authorizer(store, secret, refuse_node_credentials=True)
    for _ in range(2):  # refused every time, never cached as a node
        with pytest.raises(AuthRefused) as info:
            auth.check("Heartbeat", heartbeat)
        assert (info.value.code, info.value.reason) == ("UNAUTHENTICATED",
                                                        "node_credential_refused")
    own = pb.HeartbeatRequest(header=pb.RequestHeader(), node_id="node-3")
    assert auth.check("Heartbeat", own, "node-3").node_id == "node-3"  # the certificate
    exists = pb.KeysRequest(header=pb.RequestHeader(token=alice), keys=["k"])
    assert auth.check("Exists", exists).tenant == "alice"  # tenants are untouched


@pytest.mark.parametrize(("overrides", "field"), [
    ({"node_listen": "127.0.0.1:0"}, "node_listen"),  # no client CA
    ({"tls_client_ca_file": "ca.pem"}, "node_listen"),  # no port for it
    ({"tls_client_ca_file": "ca.pem", "node_listen": "127.0.0.1:0"}, "node_listen"),  # no server cert
    ({"tls_client_ca_file": "ca.pem", "node_listen": "nowhere", "tls_cert_file": "c",
      "tls_key_file": "k"}, "node_listen"),
    ({"refuse_node_credentials": "true"}, "refuse_node_credentials"),  # no way in for nodes
    ({"refuse_node_credentials": "true", "tls_client_ca_file": "ca.pem",  # HA: credentials
      "node_listen": "127.0.0.1:0", "tls_cert_file": "c", "tls_key_file": "k",
      "etcd": "127.0.0.1:2379"}, "refuse_node_credentials"),
])
def test_master_mtls_settings_go_together(overrides: dict[str, str], field: str) -> None:
    from cellar.config import load
    from cellar.errors import ConfigError
    from cellar.master.config import ENV_PREFIX, MasterConfig

    with pytest.raises(ConfigError) as info:
        load(MasterConfig, env_prefix=ENV_PREFIX, environ={}, overrides=overrides)
    assert info.value.field == field
