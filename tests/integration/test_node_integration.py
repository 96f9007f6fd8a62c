"""Storage nodes as real processes against a real master, on 127.0.0.1.

Covers: mounting (ClusterStatus shows the node and its capacity), a full put over gRPC and the
TCP data plane with read-back, refused writes (forged, expired, out of range, sealed) that
change no byte, hostile bytes on the data port, re-mounting after the master is killed and
restarted on the same port, and a clean SIGTERM that removes the segment files.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import xxhash

from cellar.devtools.ports import free_port
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.proto.grant import GRANT_OP_WRITE, Grant, key_tag, sign
from cellar.transfer.base import SegmentRoute, TransferOp
from cellar.transfer.frame import (
    RESPONSE,
    ST_BAD_GRANT,
    ST_EXPIRED,
    ST_OUT_OF_RANGE,
    ST_SEALED,
    ST_STALE_EPOCH,
    RequestHeader,
    WriteMeta,
    decode_response,
)
from cellar.transfer.tcp import TcpTransport
from tests.integration.master_harness import MasterProcess, admin_header, start_master
from tests.integration.node_harness import NodeProcess, kill_node, start_node
from tests.support.receipts import receipts_for
from tests.support.sockets import recv_exactly

pytestmark = pytest.mark.timeout(120)

SEGMENT = "64MiB"
TENANT = "default"
SECRET = secrets.token_bytes(32)
ENV = {"CELLAR_CLUSTER_SECRET": SECRET.hex()}
MASTER_ARGS = ["--heartbeat-interval-s", "0.2", "--node-suspect-after-s", "2",
               "--node-expire-after-s", "4", "--new-node-ramp-s", "0"]


# ---- master process (tests/integration/master_harness.py) -------------------------------

def _start_master(port: int = 0) -> MasterProcess:
    flags = [*MASTER_ARGS, "--listen", f"127.0.0.1:{port}"] if port else MASTER_ARGS
    return start_master(*flags, secret=SECRET)


def _readable(c: Cluster, key: str) -> bool:
    try:
        c.get(key)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return False
        raise
    return True


def _put_when_whole(c: Cluster, key: str, data: bytes) -> bool:
    """Put `key`; False while the master refuses it UNAVAILABLE (still rebuilding)."""
    try:
        c.put(key, data)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return False
        raise
    return True


def _kill_master(master: MasterProcess) -> None:
    master.proc.kill()
    master.proc.wait(10)


# ---- helpers ---------------------------------------------------------------------------

class Cluster:
    def __init__(self, master: MasterProcess) -> None:
        self.master = master
        self.address = master.grpc_address
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.MasterStub(self.channel)
        self.transport = TcpTransport(chunk_bytes=1 << 20)

    def close(self) -> None:
        self.transport.close()
        self.channel.close()

    def header(self) -> pb.RequestHeader:
        return admin_header(TENANT, "node-test")

    def status(self) -> pb.ClusterStatusReply:
        return self.stub.ClusterStatus(pb.ClusterStatusRequest(header=self.header()), timeout=5)

    def put(self, key: str, data: bytes) -> tuple[pb.PutStartResult, dict[int, pb.SegmentInfo]]:
        """PutStart -> TCP write of every replica -> PutEnd; returns the PutStart result."""
        reply = self.stub.PutStart(pb.PutStartRequest(header=self.header(), items=[
            pb.PutItem(key=key, size_bytes=len(data), replicas=1)]), timeout=5)
        result = reply.results[0]
        assert result.status == pb.OK, result.message
        segments = {s.segment_id: s for s in reply.segments}
        checksum = xxhash.xxh3_64_intdigest(data)
        ops = [self.op(r, segments, memoryview(data),
                       WriteMeta(checksum, len(data), TENANT, key)) for r in result.replicas]
        results = self.transport.write(ops, timeout_s=10)
        assert all(r.ok for r in results), [str(r) for r in results]
        end = self.stub.PutEnd(pb.PutEndRequest(header=self.header(), items=[
            pb.PutEndItem(key=key, put_id=result.put_id, checksum=checksum,
                          receipts=receipts_for(SECRET, result, checksum))]), timeout=5)
        assert end.results[0].status == pb.OK, end.results[0].message
        return result, segments

    def get(self, key: str) -> bytes:
        reply = self.stub.GetReplicas(pb.GetReplicasRequest(header=self.header(), keys=[key]),
                                      timeout=5)
        result = reply.results[0]
        assert result.status == pb.OK, result.message
        segments = {s.segment_id: s for s in reply.segments}
        buf = bytearray(result.size_bytes)
        read = self.transport.read([self.op(result.replicas[0], segments, memoryview(buf))], 10)
        assert read[0].ok, str(read[0])
        self.stub.Unpin(pb.UnpinRequest(header=self.header(), pin_ids=[result.pin_id]), timeout=5)
        assert xxhash.xxh3_64_intdigest(bytes(buf)) == result.checksum
        return bytes(buf)

    @staticmethod
    def op(replica: pb.Replica, segments: dict[int, pb.SegmentInfo], buf: memoryview,
           meta: WriteMeta | None = None) -> TransferOp:
        info = segments[replica.segment_id]
        route = SegmentRoute(info.segment_id, info.node_id, info.host_id,
                             {e.transport: e.address for e in info.endpoints})
        return TransferOp(route, to_grant(replica), replica.offset, buf, meta)


def to_grant(replica: pb.Replica) -> Grant:
    g = replica.grant
    return Grant(g.op, replica.segment_id, replica.offset, replica.length, g.alloc_id, g.epoch,
                 g.expiry_ms, g.key_tag, bytes(g.mac))


def raw_write(address: str, grant: Grant, offset: int, payload: bytes,
              meta: WriteMeta) -> tuple[int, str]:
    """Send one WRITE frame by hand (no client-side checks); returns (status, message)."""
    packed_meta = meta.pack()
    header = RequestHeader(GRANT_OP_WRITE, 7, grant.segment_id, offset, len(payload),
                           meta_len=len(packed_meta), grant=grant)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(header.pack() + packed_meta + payload)
        raw = recv_exactly(sock, RESPONSE.size)
        response = decode_response(raw, max_payload_bytes=1 << 30)
        message = recv_exactly(sock, response.msg_len).decode() if response.msg_len else ""
        return response.status, message


def wait_for(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if cond():
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def node_segments(status: pb.ClusterStatusReply, node_id: str) -> list[pb.SegmentStatus]:
    return [s for s in status.segments if s.info.node_id == node_id]


# ---- fixtures --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, NodeProcess]]:
    master = _start_master()
    node = None
    c = None
    try:
        node = start_node(master.grpc_address, segment_size=SEGMENT, segments=2, http=True, env=ENV)
        c = Cluster(master)
        yield c, node
    finally:
        if c is not None:
            c.close()
        if node is not None:
            node.close()
        master.stop()


# ---- tests -----------------------------------------------------------------------------

def test_node_mounts_with_its_capacity(cluster: tuple[Cluster, NodeProcess]) -> None:
    c, node = cluster
    assert node.ready_line.startswith(f"cellar node {node.node_id} serving tcp 127.0.0.1:")
    assert f"segments 2 x {SEGMENT}) mounted on {c.address}" in node.ready_line
    segs = node_segments(c.status(), node.node_id)
    assert sorted(s.info.segment_id for s in segs) == sorted(node.segment_ids)
    for s in segs:
        assert s.info.size_bytes == 64 << 20
        assert s.state == pb.NODE_STATE_ACTIVE
        endpoints = {e.transport: e.address for e in s.info.endpoints}
        assert endpoints["tcp"] == node.tcp_address
        assert endpoints["shm"] in {str(p) for p in node.segment_paths()}
    assert all(p.exists() for p in node.segment_paths())


def test_http_endpoints(cluster: tuple[Cluster, NodeProcess]) -> None:
    import json
    import urllib.request

    _c, node = cluster
    base = f"http://{node.http_address}"
    with urllib.request.urlopen(base + "/health", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(base + "/api/v1/status", timeout=5) as r:
        status = json.loads(r.read())
    assert status["node_id"] == node.node_id and status["master"]["mounted"]
    assert status["master"]["epoch"] > 0 and len(status["segments"]) == 2
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        text = r.read().decode()
    for name in ("node_bytes_written_total", "node_requests_total", "node_active_connections",
                 "node_segment_capacity_bytes", "node_master_connected 1.0", "node_objects"):
        assert name in text, name


def test_put_get_round_trip(cluster: tuple[Cluster, NodeProcess]) -> None:
    c, _node = cluster
    for key, size in (("small", 1), ("page", 4096), ("large", (5 << 20) + 123)):
        data = os.urandom(size)
        c.put(key, data)
        assert c.get(key) == data


def test_refused_writes_change_no_byte(cluster: tuple[Cluster, NodeProcess]) -> None:
    c, node = cluster
    data = os.urandom(100_000)
    result, _ = c.put("guarded", data)
    replica = result.replicas[0]
    g = to_grant(replica)
    meta = WriteMeta(0, len(data), TENANT, "guarded")
    junk = b"\xee" * 1000
    now_ms = int(time.time() * 1000)

    # the sealed allocation refuses its own (still valid) write grant
    status, message = raw_write(node.tcp_address, g, g.offset, junk, meta)
    assert status == ST_SEALED, message
    # forged: same fields, MAC from another secret
    forged = sign(b"x" * 32, op=GRANT_OP_WRITE, segment_id=g.segment_id, offset=g.offset,
                  length=g.length, alloc_id=g.alloc_id + 1000, epoch=g.epoch,
                  expiry_ms=g.expiry_ms, tag=g.key_tag)
    assert raw_write(node.tcp_address, forged, g.offset, junk, meta)[0] == ST_BAD_GRANT

    def real(**kw: int) -> Grant:
        fields = dict(op=GRANT_OP_WRITE, segment_id=g.segment_id, offset=g.offset,
                      length=g.length, alloc_id=g.alloc_id + 2000, epoch=g.epoch,
                      expiry_ms=now_ms + 60_000, tag=key_tag(TENANT, "guarded"))
        fields.update(kw)
        return sign(SECRET, **fields)

    # expired, older epoch: refused even though they are signed with the cluster secret
    assert raw_write(node.tcp_address, real(expiry_ms=now_ms - 10_000), g.offset, junk,
                     meta)[0] == ST_EXPIRED
    assert raw_write(node.tcp_address, real(epoch=g.epoch - 1), g.offset, junk,
                     meta)[0] == ST_STALE_EPOCH
    # outside the grant, and a grant that reaches past the end of the segment
    assert raw_write(node.tcp_address, real(length=1000), g.offset + 500, junk,
                     WriteMeta(0, 1000, TENANT, "guarded"))[0] == ST_OUT_OF_RANGE
    past_end = real(offset=(64 << 20) - 500, length=1000)
    assert raw_write(node.tcp_address, past_end, past_end.offset, junk,
                     WriteMeta(0, 1000, TENANT, "guarded"))[0] == ST_OUT_OF_RANGE
    # a key the grant was not signed for
    assert raw_write(node.tcp_address, real(), g.offset, junk,
                     WriteMeta(0, len(data), TENANT, "other-key"))[0] == ST_BAD_GRANT
    assert c.get("guarded") == data


def test_random_bytes_on_data_port(cluster: tuple[Cluster, NodeProcess]) -> None:
    c, node = cluster
    data = os.urandom(50_000)
    c.put("survivor", data)
    host, port = node.tcp_address.rsplit(":", 1)
    rng = os.urandom
    for i in range(40):
        try:
            with socket.create_connection((host, int(port)), timeout=2) as sock:
                if i % 4 == 0:  # a valid magic followed by garbage gets past the first check
                    sock.sendall(b"CLRQ\x01" + rng(200))
                else:
                    sock.sendall(rng(1 + i * 97))
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(2)
                while sock.recv(65536):
                    pass
        except OSError:
            pass
    assert node.alive
    assert c.get("survivor") == data
    c.put("after-garbage", data)
    assert c.get("after-garbage") == data


def test_remounts_after_master_restart() -> None:
    master = _start_master()
    port = int(master.grpc_address.rsplit(":", 1)[1])
    node = start_node(master.grpc_address, segment_size=SEGMENT, env=ENV)
    try:
        c = Cluster(master)
        first_epoch = c.status().header.epoch
        before, _ = c.put("before", b"x" * 1000)
        c.close()
        _kill_master(master)
        master = _start_master(port)
        c = Cluster(master)
        try:
            wait_for(lambda: len(node_segments(c.status(), node.node_id)) == 1, 10,
                     "the node to re-mount on the restarted master")
            assert node.alive
            data = os.urandom(300_000)
            # puts of a key the table lacks, as reads, wait out the rebuild window (the node
            # said it was mounted before: the key may be in a report still to come)
            wait_for(lambda: _put_when_whole(c, "after", data), 15, "the rebuild window to close")
            assert _readable(c, "after")  # grants of the new epoch were accepted
            assert c.get("after") == data
            assert c.status().header.epoch > first_epoch
            # a grant of the dead master is fenced off by the new epoch
            g = to_grant(before.replicas[0])
            status, message = raw_write(node.tcp_address, g, g.offset, b"y" * 1000,
                                        WriteMeta(0, 1000, TENANT, "before"))
            assert status == ST_STALE_EPOCH, message
        finally:
            c.close()
    finally:
        node.close()
        master.stop()


def test_sigterm_exits_zero_and_removes_segment_files() -> None:
    master = _start_master()
    node = start_node(master.grpc_address, segment_size=SEGMENT, segments=2, env=ENV)
    try:
        paths = node.segment_paths()
        assert all(p.exists() for p in paths)
        assert node.terminate() == 0, node.output()
        assert not any(p.exists() for p in paths)
        c = Cluster(master)
        try:  # unmounted: the master no longer lists it
            wait_for(lambda: not node_segments(c.status(), node.node_id), 5, "unmount")
        finally:
            c.close()
    finally:
        node.close()
        master.stop()


def test_waits_for_an_unreachable_master() -> None:
    port = free_port()  # nothing listens there
    node = start_node(f"127.0.0.1:{port}", segment_size="4MiB", env=ENV, wait=False)
    try:
        wait_for(lambda: "waiting for master" in node.output(), 10, "the waiting line")
        assert node.alive
        master = _start_master(port)
        try:
            node.wait_ready(15)
        finally:
            master.stop()
    finally:
        node.close()


def test_kill_9_leaves_memory_and_same_id_restarts(cluster: tuple[Cluster, NodeProcess]) -> None:
    """The segment file outlives a crash; a node restarted with the same id maps it again."""
    c, _ = cluster
    node = start_node(c.address, segment_size="4MiB", env=ENV)
    try:
        data = os.urandom(3000)
        # place on the new node: the module node must not take this replica
        result = None
        for i in range(50):
            r, _ = c.put(f"crash-{i}", data)
            if r.replicas[0].node_id == node.node_id:
                result = r
                break
        assert result is not None, "the master never placed on the new node"
        kill_node(node)
        assert not node.alive
        path = node.segment_paths()[0]
        with open(path, "rb") as f:  # the bytes survived the crash in the shm file
            f.seek(result.replicas[0].offset)
            assert f.read(len(data)) == data
        again = start_node(c.address, segment_size="4MiB", env=ENV, node_id=node.node_id,
                           shm_dir=node.shm_dir)
        try:
            assert again.segment_ids == node.segment_ids
            wait_for(lambda: len(node_segments(c.status(), node.node_id)) == 1, 5, "re-mount")
        finally:
            assert again.terminate() == 0
    finally:
        node.close()
