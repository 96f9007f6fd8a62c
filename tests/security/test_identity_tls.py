"""`cellar up --tls`: gRPC and the metadata fast line over TLS with a throwaway CA.

The SDK and the nodes verify the master against the CA the cluster wrote (credentials file,
$CELLAR_TLS_CA for the nodes); a plaintext client gets nothing, neither on gRPC nor on the
fast line, and a client that does not trust the CA cannot connect."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import grpc
import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB", tls=True) as cluster:
        yield cluster


def test_sdk_and_nodes_speak_tls(tls_cluster: LocalCluster) -> None:
    assert tls_cluster.tls is not None
    with cellar.connect(tls_cluster.address) as client:  # CA and token from the credentials file
        client.put("tls/1", b"over tls")
        assert client.get("tls/1") == b"over tls"
        status = client.status()
        assert status["nodes"] and all(n["state"] == "ACTIVE" for n in status["nodes"])
    ca = tls_cluster.tls.ca_file.read_bytes()
    with grpc.secure_channel(tls_cluster.address, grpc.ssl_channel_credentials(ca)) as channel:
        header = pb.RequestHeader(client_id="t", token=tls_cluster.token)
        call = pb_grpc.MasterStub(channel).ClusterStatus.with_call(
            pb.ClusterStatusRequest(header=header), timeout=10)
        fast_port = int(dict(call[1].trailing_metadata())["cellar-fast-rpc-port"])
    assert fast_port > 0


def test_plaintext_and_untrusted_clients_get_nothing(tls_cluster: LocalCluster) -> None:
    header = pb.RequestHeader(client_id="t", token=tls_cluster.token)
    with grpc.insecure_channel(tls_cluster.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.MasterStub(channel).ClusterStatus(pb.ClusterStatusRequest(header=header), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    other_ca = LocalCluster(0, "64MiB", tls=True)  # another throwaway CA, never started
    try:
        assert other_ca.tls is not None
        creds = grpc.ssl_channel_credentials(other_ca.tls.ca_file.read_bytes())
        with grpc.secure_channel(tls_cluster.address, creds) as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.MasterStub(channel).ClusterStatus(pb.ClusterStatusRequest(header=header), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        other_ca.stop()
    # the fast line: a plaintext frame gets no reply (the TLS handshake fails, the line closes)
    ca = tls_cluster.tls.ca_file.read_bytes() if tls_cluster.tls else b""
    with grpc.secure_channel(tls_cluster.address, grpc.ssl_channel_credentials(ca)) as channel:
        _, call = pb_grpc.MasterStub(channel).ClusterStatus.with_call(
            pb.ClusterStatusRequest(header=header), timeout=10)
        port = int(dict(call.trailing_metadata())["cellar-fast-rpc-port"])
    body = pb.GetReplicasRequest(header=header, keys=["tls/1"]).SerializeToString()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(struct.pack("<IB", len(body), 4) + body)
        try:
            reply = sock.recv(65536)
        except ConnectionError:
            reply = b""
    assert reply == b"" or reply[0] == 0x15  # closed, or a TLS alert record: never a frame
