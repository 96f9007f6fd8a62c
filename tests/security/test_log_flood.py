"""Finding (issue #19, 6): a node-credential-shaped token with non-ASCII characters
(`cellarnode_` + "é" x 32) made `hmac.compare_digest` raise TypeError: gRPC answered UNKNOWN,
the fast line INTERNAL, each request logged a ~930-byte traceback and was not counted in
`master_auth_refusals_total`; one connection wrote 7.3 MB of log in 3 s. Nodes logged nothing
about refused grants or commits.

Real master and node processes on loopback (cellar.devtools.local_cluster). The refusal-log
interval is set long (60 s), so "at most one line per peer per interval" means exactly one
line here, whatever the number of refusals. Every flood is bounded in count.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Iterator

import grpc
import pytest
from flood_kit import metered_cluster, metric

from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto.fastline import FRAME, METHOD_IDS, PORT_METADATA
from cellar.proto.grant import Grant
from cellar.transfer.frame import (
    OP_COMMIT,
    OP_WRITE,
    RESPONSE,
    ST_OK,
    RequestHeader,
    WriteMeta,
    decode_response,
    pack_commit_meta,
)
from tests.support.sockets import recv_exactly

# a node credential's shape (cellarnode_<32 hex>_<node id>) with a non-ASCII MAC, and without
# the node id part: both must be refused the same way
BAD_TOKENS = ("cellarnode_" + "é" * 32 + "_node-0", "cellarnode_" + "é" * 32)
REQUESTS = 200
INTERVAL_S = 60


@pytest.fixture(scope="module")
def cluster_and_metrics() -> Iterator[tuple[LocalCluster, str]]:
    with metered_cluster("32MiB", {"refusal_log_interval_s": INTERVAL_S},
                         {"refusal_log_interval_s": INTERVAL_S}) as c:
        yield c


def _log(path: os.PathLike[str]) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _status_call(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary("/cellar.v1.Master/ClusterStatus",
                               request_serializer=pb.ClusterStatusRequest.SerializeToString,
                               response_deserializer=pb.ClusterStatusReply.FromString)


def _fast_port(cluster: LocalCluster) -> int:
    with grpc.insecure_channel(cluster.address) as channel:
        _, info = _status_call(channel).with_call(
            pb.ClusterStatusRequest(header=pb.RequestHeader(token=cluster.token)), timeout=10)
    for key, value in info.trailing_metadata() or ():
        if key == PORT_METADATA:
            return int(value)
    raise AssertionError("the master advertises no fast line")


def test_non_ascii_credential_is_unauthenticated_counted_and_logged_once(
        cluster_and_metrics: tuple[LocalCluster, str]) -> None:
    cluster, _ = cluster_and_metrics
    master = cluster.masters[0]
    metrics = cluster.http_url + "/metrics"
    before = metric(metrics, "master_auth_refusals_total", reason="bad_token")
    log_before = len(_log(master.log_path))
    codes = set()
    t0 = time.monotonic()
    with grpc.insecure_channel(cluster.address) as channel:
        call = _status_call(channel)
        for i in range(REQUESTS):
            token = BAD_TOKENS[i % 2]
            with pytest.raises(grpc.RpcError) as info:
                call(pb.ClusterStatusRequest(header=pb.RequestHeader(token=token)), timeout=10)
            codes.add(info.value.code())
    # the fast line: the same credential on a GetReplicas frame, one connection
    fast_codes = set()
    with socket.create_connection(("127.0.0.1", _fast_port(cluster)), timeout=10) as sock:
        for i in range(REQUESTS):
            frame = pb.GetReplicasRequest(header=pb.RequestHeader(token=BAD_TOKENS[i % 2]),
                                          keys=["k"]).SerializeToString()
            sock.sendall(FRAME.pack(len(frame), METHOD_IDS["GetReplicas"]) + frame)
            length, code = FRAME.unpack(recv_exactly(sock, FRAME.size))
            recv_exactly(sock, length)
            fast_codes.add(code)
    took = time.monotonic() - t0
    counted = metric(metrics, "master_auth_refusals_total", reason="bad_token") - before
    grown = _log(master.log_path)[log_before:]
    lines = [line for line in grown.splitlines() if "master refused" in line]
    print(f"\n{2 * REQUESTS} requests with a non-ASCII node credential in {took:.2f} s: gRPC "
          f"{sorted(c.name for c in codes)}, fast line {sorted(fast_codes)}, {counted:.0f} "
          f"counted, master log +{len(grown)} bytes, {len(lines)} refusal line(s)")
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}
    assert fast_codes == {grpc.StatusCode.UNAUTHENTICATED.value[0]}
    assert counted == 2 * REQUESTS
    assert "Traceback" not in grown
    assert len(lines) == 1, grown[-2000:]  # one peer (127.0.0.1), one interval


def test_node_counts_and_logs_refused_grants_and_commits_once(
        cluster_and_metrics: tuple[LocalCluster, str]) -> None:
    cluster, metrics = cluster_and_metrics
    node = cluster.nodes[0]
    host, port = node.address.rsplit(":", 1)
    log_before = len(_log(node.log_path))
    before = {op: metric(metrics, "node_refusals_total", op=op) for op in ("write", "commit")}
    forged = Grant(OP_WRITE, 1, 0, 4096, 1, 1, 2**62, 1, bytes(16))
    meta = WriteMeta(0, 4096, "default", "forged").pack()
    write = RequestHeader(OP_WRITE, 1, 1, 0, 4096, len(meta), grant=forged).pack() + meta \
        + bytes(4096)
    commit_meta = pack_commit_meta(WriteMeta(0, 4096, "default", "forged"), 0, 0)
    commit = RequestHeader(OP_COMMIT, 2, 1, 0, 4096, len(commit_meta),
                           grant=Grant(OP_COMMIT, 1, 0, 4096, 1, 1, 2**62, 1, bytes(16))
                           ).pack() + commit_meta
    statuses = []
    for _ in range(10):  # a connection that shows no authentic grant lives ~1 s: 10 of them
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall((write + commit) * 10)
            for _ in range(20):
                reply = decode_response(recv_exactly(sock, RESPONSE.size),
                                        max_payload_bytes=1 << 20)
                recv_exactly(sock, reply.msg_len + reply.length)  # the refusal's message
                statuses.append(reply.status)
    counted = {op: metric(metrics, "node_refusals_total", op=op) - n
               for op, n in before.items()}
    grown = _log(node.log_path)[log_before:]
    lines = [line for line in grown.splitlines() if "data port refused" in line]
    print(f"\nnode: 100 forged writes + 100 forged commits -> counted {counted}, "
          f"node log +{len(grown)} bytes, {len(lines)} refusal line(s)")
    assert len(statuses) == 200 and ST_OK not in statuses
    assert counted == {"write": 100, "commit": 100}
    assert "Traceback" not in grown
    assert len(lines) == 1, grown[-2000:]


def test_logs_are_private(cluster_and_metrics: tuple[LocalCluster, str]) -> None:
    cluster, _ = cluster_and_metrics
    for child in (*cluster.masters, *cluster.nodes):
        mode = stat.S_IMODE(os.stat(child.log_path).st_mode)
        print(f"\n{child.log_path.name}: mode {mode:o}")
        assert mode & 0o077 == 0, f"{child.log_path} is mode {mode:o}"
