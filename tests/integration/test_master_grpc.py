"""A real master process over gRPC on 127.0.0.1 with simulated nodes (test code that mounts
segments and heartbeats): put/get flows, bad input, eviction under pressure, HTTP endpoints."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from master_harness import TEST_ADMIN_TOKEN, MasterProcess, admin_header, running_master

from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE, Grant, node_credential, verify
from tests.support.receipts import receipts_for

MiB = 1 << 20
# long liveness timeouts: the simulated nodes of this module never heartbeat
FLAGS = ("--node-suspect-after-s", "600", "--node-expire-after-s", "1200")


@pytest.fixture(scope="module")
def master() -> Iterator[MasterProcess]:
    with running_master(*FLAGS, secret=SECRET) as process:
        yield process
    assert process.proc.returncode == 0, process.stderr()


@pytest.fixture(scope="module")
def channel(master: MasterProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(master.grpc_address) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> pb_grpc.MasterStub:
    return pb_grpc.MasterStub(channel)


@pytest.fixture(scope="module")
def nodes(stub: pb_grpc.MasterStub) -> list[str]:
    for n in (1, 2):
        reply = stub.MountSegment(pb.MountSegmentRequest(
            header=NODE_HEADERS[f"node-{n}"], node_id=f"node-{n}", incarnation=1,
            segments=[pb.SegmentInfo(segment_id=100 + n, size_bytes=256 * MiB, host_id=f"host-{n}",
                                     endpoints=[pb.Endpoint(transport="tcp", address=f"127.0.0.1:{9000 + n}")])],
        ))
        assert [r.status for r in reply.results] == [pb.OK]
        assert reply.heartbeat_interval_ms == 1000
    return ["node-1", "node-2"]


SECRET = secrets.token_bytes(32)  # every master of this module: node credentials derive from it


class _NodeHeaders:
    """NODE_HEADERS[node_id]: a header with that node's credential."""

    def __getitem__(self, node_id: str) -> pb.RequestHeader:
        return pb.RequestHeader(client_id=node_id, token=node_credential(SECRET, node_id))


NODE_HEADERS = _NodeHeaders()


def header(tenant: str = "") -> pb.RequestHeader:
    return admin_header(tenant)  # the session's admin token acts as any tenant


def put(stub: pb_grpc.MasterStub, keys: list[str], size: int = 4096, tenant: str = "", **kw: Any) -> list[int]:
    started = stub.PutStart(pb.PutStartRequest(header=header(tenant),
                                               items=[pb.PutItem(key=k, size_bytes=size, **kw) for k in keys]))
    assert [r.status for r in started.results] == [pb.OK] * len(keys), started.results
    ended = stub.PutEnd(pb.PutEndRequest(header=header(tenant), items=[
        pb.PutEndItem(key=k, put_id=r.put_id, checksum=len(k),
                      receipts=receipts_for(SECRET, r, len(k))) for k, r in zip(keys, started.results, strict=True)
    ]))
    assert [r.status for r in ended.results] == [pb.OK] * len(keys)
    return [r.put_id for r in started.results]


def snapshot(stub: pb_grpc.MasterStub) -> tuple[Any, ...]:
    status = stub.ClusterStatus(pb.ClusterStatusRequest(header=header()))
    return (
        status.object_count, status.used_bytes,
        tuple((t.name, t.used_bytes, t.object_count) for t in status.tenants),
        tuple((s.info.segment_id, s.used_bytes, s.object_count) for s in status.segments),
    )


def raw_call(channel: grpc.Channel, method: str, payload: bytes, reply_cls: Any) -> Any:
    call = channel.unary_unary(f"/cellar.v1.Master/{method}", request_serializer=lambda b: b,
                               response_deserializer=reply_cls.FromString)
    return call(payload, timeout=10)


def test_put_get_unpin_flow(master: MasterProcess, stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    started = stub.PutStart(pb.PutStartRequest(header=header(), items=[
        pb.PutItem(key="flow/a", size_bytes=10_000, replicas=2),
        pb.PutItem(key="flow/b", size_bytes=5_000),
    ]))
    assert started.header.epoch == master.epoch and started.header.master_time_ms > 0
    a, b = started.results
    assert {r.node_id for r in a.replicas} == set(nodes)
    assert {s.segment_id for s in started.segments} == {101, 102}  # each segment once
    for replica in a.replicas:
        g = replica.grant
        grant = Grant(g.op, replica.segment_id, replica.offset, replica.length, g.alloc_id, g.epoch,
                      g.expiry_ms, g.key_tag, g.mac)
        verify(master.secret, grant, op=GRANT_OP_WRITE, segment_id=replica.segment_id,
               offset=replica.offset, length=10_000, now_ms=started.header.master_time_ms,
               min_epoch=master.epoch)
    # WRITING is invisible
    assert stub.Exists(pb.KeysRequest(header=header(), keys=["flow/a"])).statuses == [pb.NOT_READY]
    got = stub.GetReplicas(pb.GetReplicasRequest(header=header(), keys=["flow/a"]))
    assert got.results[0].status == pb.NOT_READY
    ended = stub.PutEnd(pb.PutEndRequest(header=header(), items=[
        pb.PutEndItem(key="flow/a", put_id=a.put_id, checksum=0xABC,
                      receipts=receipts_for(SECRET, a, 0xABC)),
        pb.PutEndItem(key="flow/b", put_id=b.put_id, checksum=0xDEF,
                      receipts=receipts_for(SECRET, b, 0xDEF)),
    ]))
    assert [r.status for r in ended.results] == [pb.OK, pb.OK]
    got = stub.GetReplicas(pb.GetReplicasRequest(header=header(), keys=["flow/a", "flow/b", "flow/none"]))
    ra, rb, rnone = got.results
    assert (ra.status, ra.size_bytes, ra.checksum, len(ra.replicas)) == (pb.OK, 10_000, 0xABC, 2)
    assert (rb.status, rb.checksum) == (pb.OK, 0xDEF)
    assert rnone.status == pb.NOT_FOUND and rnone.message
    replica = ra.replicas[0]
    g = replica.grant
    verify(master.secret, Grant(g.op, replica.segment_id, replica.offset, replica.length, g.alloc_id,
                                g.epoch, g.expiry_ms, g.key_tag, g.mac),
           op=GRANT_OP_READ, segment_id=replica.segment_id, offset=replica.offset, length=10_000,
           now_ms=got.header.master_time_ms)
    assert stub.PrefixLen(pb.KeysRequest(header=header(), keys=["flow/a", "flow/b", "flow/c"])).prefix_len == 2
    unpinned = stub.Unpin(pb.UnpinRequest(header=header(), pin_ids=[ra.pin_id, rb.pin_id, 999]))
    assert unpinned.released == 2
    removed = stub.Remove(pb.KeysRequest(header=header(), keys=["flow/a", "flow/a"]))
    assert [r.status for r in removed.results] == [pb.OK, pb.NOT_FOUND]
    assert stub.RemovePrefix(pb.RemovePrefixRequest(header=header(), prefix="flow/")).removed == 1


def test_existing_key_revoke_and_upsert(stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    put(stub, ["dup/k"])
    again = stub.PutStart(pb.PutStartRequest(header=header(), items=[pb.PutItem(key="dup/k", size_bytes=10)]))
    assert again.results[0].status == pb.ALREADY_EXISTS
    upsert = stub.PutStart(pb.PutStartRequest(header=header(), items=[
        pb.PutItem(key="dup/k", size_bytes=20, upsert=True)]))
    assert upsert.results[0].status == pb.OK
    revoked = stub.PutRevoke(pb.PutRevokeRequest(header=header(), items=[
        pb.PutRef(key="dup/k", put_id=upsert.results[0].put_id)]))
    assert revoked.results[0].status == pb.OK
    got = stub.GetReplicas(pb.GetReplicasRequest(header=header(), keys=["dup/k"]))
    assert got.results[0].size_bytes == 4096  # the old version stayed
    stub.Unpin(pb.UnpinRequest(header=header(), pin_ids=[got.results[0].pin_id]))
    stub.Remove(pb.KeysRequest(header=header(), keys=["dup/k"]))


# ---- bad input: each gets a per-key status or INVALID_ARGUMENT, and changes nothing else ----


def test_bad_keys_and_sizes_are_per_key_invalid(stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    put(stub, ["bad/keep"])
    before = snapshot(stub)
    items = [
        pb.PutItem(key="", size_bytes=10),
        pb.PutItem(key="x" * 1025, size_bytes=10),
        pb.PutItem(key="bad/zero", size_bytes=0),
        pb.PutItem(key="bad/negative", size_bytes=2**64 - 1),  # -1 on the wire
        pb.PutItem(key="bad/huge", size_bytes=256 * MiB + 1),
        pb.PutItem(key="bad/replicas", size_bytes=10, replicas=9),
        pb.PutItem(key="bad/keep", size_bytes=10),
    ]
    reply = stub.PutStart(pb.PutStartRequest(header=header(), items=items))
    statuses = [r.status for r in reply.results]
    assert statuses == [pb.INVALID] * 6 + [pb.ALREADY_EXISTS]
    assert all(r.message for r in reply.results)
    assert "largest segment" in reply.results[3].message
    for call, request in [
        (stub.GetReplicas, pb.GetReplicasRequest(header=header(), keys=["", "x" * 1025])),
        (stub.Remove, pb.KeysRequest(header=header(), keys=["", "x" * 1025])),
    ]:
        assert [r.status for r in call(request).results] == [pb.INVALID, pb.INVALID]
    assert list(stub.Exists(pb.KeysRequest(header=header(), keys=["", "x" * 1025])).statuses) == [pb.INVALID] * 2
    assert snapshot(stub) == before


def test_non_utf8_key_is_invalid_argument(channel: grpc.Channel, stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    before = snapshot(stub)
    for method, request, reply_cls in [
        ("PutStart", pb.PutStartRequest(header=header(), items=[pb.PutItem(key="@@", size_bytes=10)]), pb.PutStartReply),
        ("GetReplicas", pb.GetReplicasRequest(header=header(), keys=["@@"]), pb.GetReplicasReply),
        ("Exists", pb.KeysRequest(header=header(), keys=["@@"]), pb.ExistsReply),
    ]:
        payload = request.SerializeToString().replace(b"@@", b"\xff\xfe")
        with pytest.raises(grpc.RpcError) as info:
            raw_call(channel, method, payload, reply_cls)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "UTF-8" in (info.value.details() or "")
    assert snapshot(stub) == before


def test_batch_over_limit_and_unknown_tenant(stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    before = snapshot(stub)
    too_many = [pb.PutItem(key=f"many/{i}", size_bytes=10) for i in range(1025)]
    with pytest.raises(grpc.RpcError) as info:
        stub.PutStart(pb.PutStartRequest(header=header(), items=too_many))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_batch_keys" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        stub.GetReplicas(pb.GetReplicasRequest(header=header(), keys=[f"k{i}" for i in range(2000)]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for call, request in [
        (stub.PutStart, pb.PutStartRequest(header=header("nobody"), items=[pb.PutItem(key="k", size_bytes=1)])),
        (stub.GetReplicas, pb.GetReplicasRequest(header=header("nobody"), keys=["k"])),
        (stub.Exists, pb.KeysRequest(header=header("nobody"), keys=["k"])),
        (stub.RemoveAll, pb.RemoveAllRequest(header=header("nobody"))),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            call(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown tenant 'nobody'" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        stub.RemovePrefix(pb.RemovePrefixRequest(header=header(), prefix=""))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert snapshot(stub) == before


def test_put_end_not_writing_or_wrong_writer(stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    started = stub.PutStart(pb.PutStartRequest(header=header(), items=[pb.PutItem(key="pe/k", size_bytes=10)]))
    put_id = started.results[0].put_id
    before = snapshot(stub)
    reply = stub.PutEnd(pb.PutEndRequest(header=header(), items=[
        pb.PutEndItem(key="pe/k", put_id=put_id + 1, checksum=1),  # another writer
        pb.PutEndItem(key="pe/never", put_id=put_id, checksum=1),  # not WRITING
        pb.PutEndItem(key="", put_id=put_id, checksum=1),
    ]))
    assert [r.status for r in reply.results] == [pb.INVALID, pb.NOT_FOUND, pb.INVALID]
    assert "not the writer" in reply.results[0].message
    assert snapshot(stub) == before
    assert stub.Exists(pb.KeysRequest(header=header(), keys=["pe/k"])).statuses == [pb.NOT_READY]
    stub.PutRevoke(pb.PutRevokeRequest(header=header(), items=[pb.PutRef(key="pe/k", put_id=put_id)]))


def test_reply_stays_under_the_message_limit(stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    keys = [f"big/{i:04}-" + "k" * 900 for i in range(1024)]  # ~1 MiB of keys, max batch
    reply = stub.PutStart(pb.PutStartRequest(header=header(), items=[
        pb.PutItem(key=k, size_bytes=64, replicas=2) for k in keys]))
    assert all(r.status == pb.OK for r in reply.results)
    assert reply.ByteSize() < 4 * MiB
    stub.PutRevoke(pb.PutRevokeRequest(header=header(), items=[
        pb.PutRef(key=k, put_id=r.put_id) for k, r in zip(keys, reply.results, strict=True)]))


def test_unmount_and_heartbeat_contract(stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    mounted = stub.MountSegment(pb.MountSegmentRequest(header=NODE_HEADERS["temp-node"], node_id="temp-node", incarnation=5, segments=[
        pb.SegmentInfo(segment_id=999, size_bytes=MiB, host_id="tmp")]))
    assert mounted.results[0].status == pb.OK
    dup = stub.MountSegment(pb.MountSegmentRequest(header=NODE_HEADERS["thief"], node_id="thief", incarnation=1, segments=[
        pb.SegmentInfo(segment_id=999, size_bytes=MiB)]))
    assert dup.results[0].status == pb.INVALID
    started = stub.PutStart(pb.PutStartRequest(header=header(), items=[
        pb.PutItem(key="tmp/k", size_bytes=100, avoid_node_ids=nodes)]))
    assert started.results[0].replicas[0].node_id == "temp-node"
    stub.PutRevoke(pb.PutRevokeRequest(header=header(), items=[
        pb.PutRef(key="tmp/k", put_id=started.results[0].put_id)]))
    beat = stub.Heartbeat(pb.HeartbeatRequest(header=NODE_HEADERS["temp-node"], node_id="temp-node", incarnation=5, freed_ack_seq=0))
    assert not beat.remount and len(beat.freed) == 1
    assert beat.freed[0].alloc_id == started.results[0].replicas[0].grant.alloc_id
    assert beat.freed_seq > 0
    acked = stub.Heartbeat(pb.HeartbeatRequest(header=NODE_HEADERS["temp-node"], node_id="temp-node", incarnation=5, freed_ack_seq=beat.freed_seq))
    assert list(acked.freed) == []
    assert stub.Heartbeat(pb.HeartbeatRequest(header=NODE_HEADERS["temp-node"], node_id="temp-node", incarnation=6)).remount
    gone = stub.UnmountSegment(pb.UnmountSegmentRequest(header=NODE_HEADERS["temp-node"], node_id="temp-node", segment_ids=[999, 999]))
    assert [r.status for r in gone.results] == [pb.OK, pb.NOT_FOUND]
    assert stub.Heartbeat(pb.HeartbeatRequest(header=NODE_HEADERS["temp-node"], node_id="temp-node", incarnation=5)).remount


# ---- HTTP ----


def http_get(master: MasterProcess, path: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(master.http_url + path, timeout=10) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read().decode()


def test_health_status_and_metrics(master: MasterProcess, stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    put(stub, ["http/a"])
    assert http_get(master, "/health")[:1] == (200,) and http_get(master, "/health")[2].strip() == "ok"
    code, kind, body = http_get(master, "/api/v1/status")
    status = json.loads(body)
    assert code == 200 and kind == "application/json"
    assert status["role"] == "single" and status["epoch"] == master.epoch
    assert {s["id"] for s in status["segments"]} >= {101, 102}
    segment = next(s for s in status["segments"] if s["id"] == 101)
    assert set(segment) >= {"id", "node", "state", "capacity", "used", "objects", "endpoints"}
    assert segment["endpoints"] == [{"transport": "tcp", "address": "127.0.0.1:9001"}]
    assert status["objects"] >= 1 and status["capacity"] >= 512 * MiB
    assert status["limits"]["max_key_bytes"] == 1024
    assert any(t["name"] == "default" for t in status["tenants"])
    code, kind, metrics = http_get(master, "/metrics")
    assert code == 200 and kind.startswith("text/plain")
    for name in (
        "master_key_count ", "master_allocated_bytes ", "master_total_capacity_bytes ",
        "master_put_start_requests_total ", "master_put_start_failures_total ",
        "master_get_replica_list_requests_total ", "master_evicted_key_count ",
        "master_evicted_size_bytes ", "master_attempted_evictions_total ",
        'master_tenant_used_bytes{tenant="default"}', 'master_segment_used_bytes{node="node-1",segment="101"}',
        'master_rpc_latency_seconds_bucket{le="0.001",rpc="PutStart"}',
    ):
        assert name in metrics, name
    assert "cellar master" in http_get(master, "/")[2]
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(master.http_url + "/nope", timeout=10)
    assert info.value.code == 404


def test_tenant_admin_api(master: MasterProcess, stub: pb_grpc.MasterStub, nodes: list[str]) -> None:
    def send(method: str, body: Any) -> tuple[int, Any]:
        request = urllib.request.Request(master.http_url + "/api/v1/tenants", method=method,
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {TEST_ADMIN_TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    code, created = send("POST", {"name": "team-a", "quota_bytes": "8KiB", "quota_objects": 2,
                                  "hard_pin": True})
    assert code == 200 and created["quota_bytes"] == 8192 and created["quota_objects"] == 2
    assert send("PUT", {"name": "bad name", "quota_bytes": 1})[0] == 400
    assert send("PUT", {"name": "team-a", "quota_bytes": "lots"})[0] == 400
    _, _, body = http_get(master, "/api/v1/tenants")
    assert any(t["name"] == "team-a" for t in json.loads(body))
    put(stub, ["q/1"], size=4096, tenant="team-a", hard_pin=True)
    put(stub, ["q/2"], size=4096, tenant="team-a", hard_pin=True)
    refused = stub.PutStart(pb.PutStartRequest(header=header("team-a"), items=[pb.PutItem(key="q/3", size_bytes=10)]))
    assert refused.results[0].status == pb.QUOTA_EXCEEDED
    assert send("PUT", {"name": "team-a", "quota_bytes": 0, "quota_objects": 0, "hard_pin": True})[0] == 200
    put(stub, ["q/3"], size=10, tenant="team-a")
    assert stub.RemoveAll(pb.RemoveAllRequest(header=header("team-a"))).removed == 3


def test_eviction_under_pressure() -> None:
    # A dedicated small node: puts keep succeeding by evicting the least recently used objects.
    # No background eviction (both watermarks 1.0): every eviction is a put's, so the segment is
    # still full when the last PutStart comes (CI once saw the tick free room after the last
    # put, and that PutStart placed its object).
    no_background = ("--eviction-high-watermark", "1.0", "--eviction-low-watermark", "1.0")
    with running_master(*FLAGS, *no_background, secret=SECRET) as small, \
            grpc.insecure_channel(small.grpc_address) as ch:
        s = pb_grpc.MasterStub(ch)
        s.MountSegment(pb.MountSegmentRequest(header=NODE_HEADERS["tiny"], node_id="tiny", incarnation=1, segments=[
            pb.SegmentInfo(segment_id=7, size_bytes=8 * MiB)]))
        for i in range(24):
            put(s, [f"evict/{i}"], size=MiB)
        status = s.ClusterStatus(pb.ClusterStatusRequest(header=header()))
        assert status.object_count <= 8 and status.used_bytes <= 8 * MiB
        assert status.used_bytes + MiB > 8 * MiB  # full: the next put must evict or fail
        exists = s.Exists(pb.KeysRequest(header=header(), keys=[f"evict/{i}" for i in range(24)])).statuses
        assert list(exists[-status.object_count:]) == [pb.OK] * status.object_count  # newest kept
        pins = s.GetReplicas(pb.GetReplicasRequest(header=header(), keys=[f"evict/{i}" for i in range(24)]))
        assert sum(1 for r in pins.results if r.status == pb.OK) == status.object_count
        refused = s.PutStart(pb.PutStartRequest(header=header(), items=[pb.PutItem(key="evict/x", size_bytes=MiB)]))
        assert refused.results[0].status == pb.NO_SPACE  # everything is pinned now
        _, _, metrics = http_get(small, "/metrics")
        evicted = next(line for line in metrics.splitlines() if line.startswith("master_evicted_key_count "))
        assert float(evicted.split()[1]) >= 16
