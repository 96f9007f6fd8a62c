"""Issue 19: a tenant nobody set a quota for cannot take the cluster, and no tenant reads another
tenant's freed bytes (after eviction, after a failed put; after a remove is in
test_write_receipts.py).

The cluster (conftest.py) has two 64 MiB nodes; alice and bob were created by the admin API
without a quota (`LocalCluster.token_for(..., unlimited=False)`), as is carol, so each gets
`default_tenant_quota_fraction` (0.5) of the 128 MiB. Before: such a tenant was unlimited, and
carol's real writes of twice the capacity evicted every object of alice's; and bob's puts
refused at PutEnd (no receipt) held their ranges in quarantine on nobody's account, so a loop
of them could hold every free byte.
"""

from __future__ import annotations

import os
from typing import Any

from identity_kit import SecurityCluster
from test_write_receipts import _header, _read, _read_granted, _reads_back, _send, _tcp_address

import cellar
from cellar.client.session_state import grant_from_replica
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE
from cellar.transfer.frame import OP_READ, OP_WRITE, ST_OK, RequestHeader, WriteMeta

KiB = 1024
MiB = 1024 * KiB


def _status_tenant(stub: Any, token: str, tenant: str) -> Any:
    reply = stub.ClusterStatus(pb.ClusterStatusRequest(header=_header(token, tenant)))
    return next(t for t in reply.tenants if t.name == tenant), reply.capacity_bytes


def test_a_tenant_without_a_quota_cannot_fill_the_cluster(cluster: SecurityCluster,
                                                          stub: Any) -> None:
    """Real writes of twice the capacity by carol, a tenant nobody set a quota for."""
    values = {f"stay/{i}": os.urandom(512 * KiB) for i in range(40)}  # 20 MiB of alice's
    carol_token = cluster.token_for("carol", unlimited=False)  # the admin gave no quota
    blob = os.urandom(MiB)
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        for key, value in values.items():
            alice.put(key, value)
        with cellar.connect(cluster.address, tenant="carol", token=carol_token) as carol:
            for i in range(256):
                carol.put(f"fill/{i}", blob)  # carol evicts her own objects, nobody else's
            assert carol.get("fill/255") == blob
            tenant, capacity = _status_tenant(stub, carol_token, "carol")
            lost = [k for k, v in values.items() if not _reads_back(alice, k, v)]
            carol.remove_all()  # room for the tests below
        alice.remove_all()
    assert not lost, f"{len(lost)} of {len(values)} of alice's objects evicted by carol"
    assert tenant.quota_bytes == capacity // 2  # default_tenant_quota_fraction 0.5
    assert 0 < tenant.used_bytes <= tenant.quota_bytes


def _attack(stub: Any, bob: pb.RequestHeader, keys: list[str], size: int,
            secrets: dict[str, bytes]) -> list[str]:
    """bob places objects (likely over alice's freed ranges), writes one byte of each, ends the
    puts with whatever receipts he has (none), then reads: with the SDK's path (GetReplicas)
    and raw (his write grant presented for a READ). The secrets he saw."""
    started = stub.PutStart(pb.PutStartRequest(header=bob, items=[
        pb.PutItem(key=k, size_bytes=size) for k in keys]))
    seen: list[str] = []
    for key, result in zip(keys, started.results, strict=True):
        if result.status != pb.OK:
            continue
        rep = result.replicas[0]
        address = _tcp_address(started.segments, rep.segment_id)
        meta = WriteMeta(0, size, "bob", key).pack()
        frame = RequestHeader(OP_WRITE, 1, rep.segment_id, rep.offset, 1, len(meta),
                              grant=grant_from_replica(rep, GRANT_OP_WRITE)).pack() + meta + b"b"
        _send(address, frame)
        as_read = RequestHeader(OP_READ, 1, rep.segment_id, rep.offset, rep.length, 0,
                                grant=grant_from_replica(rep, GRANT_OP_READ)).pack()
        data = _read(address, as_read, rep.length)
        seen += [k for k, v in secrets.items() if data and v[1:] in data]
    ended = stub.PutEnd(pb.PutEndRequest(header=bob, items=[
        pb.PutEndItem(key=k, put_id=r.put_id, checksum=0)
        for k, r in zip(keys, started.results, strict=True) if r.status == pb.OK]))
    assert all(r.status != pb.OK for r in ended.results), "PutEnd without a receipt"
    got = stub.GetReplicas(pb.GetReplicasRequest(header=bob, keys=keys))
    seen += [k for data in _read_granted(got) if data
             for k, v in secrets.items() if v[1:] in data]
    return seen


def test_no_tenant_reads_anothers_evicted_bytes(cluster: SecurityCluster, stub: Any) -> None:
    size = 256 * KiB
    secrets = {f"evicted/{i}": os.urandom(size) for i in range(16)}
    alice_h = _header(cluster.alice, "alice")
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        for key, value in secrets.items():
            alice.put(key, value)
        # alice fills her own quota: her oldest objects (the secrets) are evicted
        blob = os.urandom(MiB)
        for i in range(80):
            alice.put(f"push/{i}", blob)
    statuses = stub.Exists(pb.KeysRequest(header=alice_h, keys=list(secrets))).statuses
    evicted = [k for k, s in zip(secrets, statuses, strict=True) if s == pb.NOT_FOUND]
    assert evicted, "nothing was evicted: the test proves nothing"
    seen = _attack(stub, _header(cluster.bob, "bob"), [f"scan/e/{i}" for i in range(48)],
                   size, {k: secrets[k] for k in evicted})
    assert not seen, f"bob read alice's evicted bytes of {seen}"


def test_no_tenant_reads_the_bytes_of_anothers_failed_put(cluster: SecurityCluster,
                                                          stub: Any) -> None:
    size = 256 * KiB
    alice_h = _header(cluster.alice, "alice")
    keys = [f"failed/{i}" for i in range(16)]
    secrets = {k: os.urandom(size) for k in keys}
    started = stub.PutStart(pb.PutStartRequest(header=alice_h, items=[
        pb.PutItem(key=k, size_bytes=size) for k in keys]))
    for key, result in zip(keys, started.results, strict=True):
        rep = result.replicas[0]
        meta = WriteMeta(0, size, "alice", key).pack()
        half = secrets[key][:size // 2]  # half written, then the put fails and is revoked
        frame = RequestHeader(OP_WRITE, 1, rep.segment_id, rep.offset, len(half), len(meta),
                              grant=grant_from_replica(rep, GRANT_OP_WRITE)).pack() + meta + half
        assert _send(_tcp_address(started.segments, rep.segment_id), frame) == ST_OK
    stub.PutRevoke(pb.PutRevokeRequest(header=alice_h, items=[
        pb.PutRef(key=k, put_id=r.put_id) for k, r in zip(keys, started.results, strict=True)]))
    halves = {k: v[:size // 2] for k, v in secrets.items()}
    seen = _attack(stub, _header(cluster.bob, "bob"), [f"scan/f/{i}" for i in range(48)],
                   size, halves)
    assert not seen, f"bob read the bytes of alice's failed put of {seen}"


def test_a_metadata_only_fill_is_charged_to_its_tenant(cluster: SecurityCluster,
                                                       stub: Any) -> None:
    """bob, no quota set: PutStart + PutEnd without a byte, 6 rounds of 64 MiB. His refused
    puts' ranges wait in quarantine until their grants expire, on his account (WRITING cap and
    byte quota), so the loop stops at his share. Last in the module: bob's account stays full
    for write_grant_ttl_s.

    alice starts from nothing but these 20 MiB: a quota caps a tenant, it reserves nothing, so
    with alice at her whole share too (the 64 MiB test_no_tenant_reads_anothers_evicted_bytes
    leaves) the cluster is full, the watermark evicts the least recently used objects of
    anyone, and which of alice's goes first is the sampled LRU's choice (eviction.py)."""
    values = {f"keep/{i}": os.urandom(512 * KiB) for i in range(40)}
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        alice.remove_all()
        for key, value in values.items():
            alice.put(key, value)
        bob_h = _header(cluster.bob, "bob")
        refused = 0
        for round_ in range(6):
            keys = [f"meta/{round_}/{i}" for i in range(64)]
            started = stub.PutStart(pb.PutStartRequest(header=bob_h, items=[
                pb.PutItem(key=k, size_bytes=MiB) for k in keys]))
            refused += sum(1 for r in started.results if r.status == pb.QUOTA_EXCEEDED)
            stub.PutEnd(pb.PutEndRequest(header=bob_h, items=[
                pb.PutEndItem(key=k, put_id=r.put_id, checksum=0)
                for k, r in zip(keys, started.results, strict=True) if r.status == pb.OK]))
        held, _ = _status_tenant(stub, cluster.bob, "bob")
        lost = [k for k, v in values.items() if not _reads_back(alice, k, v)]
        assert not lost, f"{len(lost)} of {len(values)} of alice's objects evicted by bob"
    # what an operator sees: bob's share held by ranges, not objects (`cellar status` HELD)
    assert held.used_bytes == 0 and held.quarantined_bytes > 0, held
    assert held.quarantined_bytes <= held.quota_bytes, held
    assert refused >= 5 * 64, refused  # before: every round placed, quarantine on nobody
