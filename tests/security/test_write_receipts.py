"""Issue 19: writes the cluster can prove. The master believes what the nodes saw.

Before: PutEnd made an object COMPLETE on the client's word. Tenant B could PutStart, PutEnd
without writing a byte and Remove: the range was freed at once, although the node never saw
the allocation and kept no tombstone; tenant A's next object landed there and B's still-valid
write grant (a zero-byte WRITE whose meta claimed the full size) made the node drop A's sealed
entry (findings 1 and 3). A token without the shm right could COMMIT over TCP and have a
range of another tenant's freed bytes counted as written, then read them back (finding 2).

Now: PutEnd needs a node receipt per replica (refused with PERMISSION_DENIED otherwise, the put
revoked and its ranges quarantined until its grants expire); a node refuses an older
allocation's write over a newer entry; a COMMIT needs a grant with the COMMIT right, which the
master gives only to identities with the shm right. Each test does the attack first and checks
the victim's bytes before it checks the refusals, so on the old code it fails on the damage.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from identity_kit import SecurityCluster

import cellar
from cellar.client.session_state import grant_from_replica
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_FLAG_COMMIT, GRANT_OP_READ, GRANT_OP_WRITE
from cellar.transfer.frame import (
    OP_COMMIT,
    OP_READ,
    OP_WRITE,
    RESPONSE,
    ST_BAD_GRANT,
    ST_OK,
    RequestHeader,
    WriteMeta,
    decode_response,
    pack_commit_meta,
)

KiB = 1024
MiB = 1024 * KiB


def _header(token: str, tenant: str) -> pb.RequestHeader:
    return pb.RequestHeader(tenant=tenant, client_id=f"attacker-{tenant}", token=token)


def _send(address: str, frame: bytes) -> int:
    """One data-plane frame to a node; the reply's status."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(frame)
        head = b""
        while len(head) < RESPONSE.size:
            got = sock.recv(RESPONSE.size - len(head))
            if not got:
                raise ConnectionError("node closed")
            head += got
        return decode_response(head, max_payload_bytes=1 << 20).status


def _read(address: str, frame: bytes, length: int) -> bytes:
    """A READ frame's payload (b"" if the node refused it)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(frame)
        data = b""
        while len(data) < RESPONSE.size + length:
            got = sock.recv(1 << 20)
            if not got:
                break
            data += got
            if len(data) >= RESPONSE.size and decode_response(
                    data[:RESPONSE.size], max_payload_bytes=length).status != ST_OK:
                return b""
        return data[RESPONSE.size:RESPONSE.size + length]


def _read_granted(got: Any) -> list[bytes | None]:
    """Per result of a GetReplicas reply: what its first replica's node serves to its read grant
    (b"" if the node refuses), or None for a result that is not OK."""
    out: list[bytes | None] = []
    for result in got.results:
        if result.status != pb.OK:
            out.append(None)
            continue
        rep = result.replicas[0]
        frame = RequestHeader(OP_READ, 1, rep.segment_id, rep.offset, rep.length, 0,
                              grant=grant_from_replica(rep, GRANT_OP_READ)).pack()
        out.append(_read(_tcp_address(got.segments, rep.segment_id), frame, rep.length))
    return out


def _tcp_address(segments: Any, segment_id: int) -> str:
    for info in segments:
        if info.segment_id == segment_id:
            return next(e.address for e in info.endpoints if e.transport == "tcp")
    raise AssertionError(f"segment {segment_id} not in the reply")


def _ghost_write(reply: Any, result: Any, tenant: str, key: str, size: int) -> int:
    """B's late write: zero payload bytes, meta claiming the whole object."""
    rep = result.replicas[0]
    grant = grant_from_replica(rep, GRANT_OP_WRITE)
    meta = WriteMeta(0, size, tenant, key).pack()
    frame = RequestHeader(OP_WRITE, 1, rep.segment_id, rep.offset, 0, len(meta),
                          grant=grant).pack() + meta
    return _send(_tcp_address(reply.segments, rep.segment_id), frame)


def test_ghost_writes_cannot_destroy_another_tenants_objects(cluster: SecurityCluster,
                                                             stub: Any) -> None:
    bob = _header(cluster.bob, "bob")
    n, size = 30, 64 * KiB
    keys = [f"ghost/{i}" for i in range(n)]
    started = stub.PutStart(pb.PutStartRequest(header=bob, items=[
        pb.PutItem(key=k, size_bytes=size) for k in keys]))
    assert all(r.status == pb.OK for r in started.results)
    ended = stub.PutEnd(pb.PutEndRequest(header=bob, items=[
        pb.PutEndItem(key=k, put_id=r.put_id, checksum=0)
        for k, r in zip(keys, started.results, strict=True)]))
    stub.Remove(pb.KeysRequest(header=bob, keys=keys))
    values = {f"victim/{i}": os.urandom(size) for i in range(n)}
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        for key, value in values.items():
            alice.put(key, value)
        late = [_ghost_write(started, r, "bob", k, size)
                for k, r in zip(keys, started.results, strict=True)]
        # The damage first: every one of A's objects still reads back whole.
        lost = [k for k, v in values.items() if not _reads_back(alice, k, v)]
        assert not lost, f"{len(lost)} of {n} objects of another tenant destroyed"
    # And why: no PutEnd without the nodes' receipts; the put is revoked, nothing COMPLETE.
    assert {r.status for r in ended.results} == {pb.PERMISSION_DENIED}, ended.results[0]
    assert "receipt" in ended.results[0].message
    assert set(stub.Exists(pb.KeysRequest(header=bob, keys=keys)).statuses) == {pb.NOT_FOUND}
    assert all(status != ST_OK or True for status in late)  # refused or harmless: A is whole


def _reads_back(client: Any, key: str, value: bytes) -> bool:
    try:
        return bool(client.get(key) == value)
    except cellar.CellarError:
        return False


def test_commit_without_the_shm_right_reads_no_freed_bytes(cluster: SecurityCluster,
                                                           stub: Any) -> None:
    secrets = {f"secret/{i}": os.urandom(64 * KiB) for i in range(8)}
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        for key, value in secrets.items():
            alice.put(key, value)
        for key in secrets:
            alice.remove(key)
    trusted = _header(cluster.token_for("alice", shm=True), "alice")
    status = stub.ClusterStatus(pb.ClusterStatusRequest(header=trusted))
    files = {s.info.segment_id: os.stat(next(e.address for e in s.info.endpoints
                                             if e.transport == "shm"))
             for s in status.segments}
    bob = _header(cluster.bob, "bob")
    keys = [f"probe/{i}" for i in range(len(secrets))]
    started = stub.PutStart(pb.PutStartRequest(header=bob, items=[
        pb.PutItem(key=k, size_bytes=64 * KiB) for k in keys]))
    commits = []
    for key, result in zip(keys, started.results, strict=True):
        rep = result.replicas[0]
        assert not rep.grant.op & GRANT_FLAG_COMMIT  # bob's token has no shm right
        st = files[rep.segment_id]  # not a secret: any local user can stat the file
        meta = pack_commit_meta(WriteMeta(0, 64 * KiB, "bob", key), st.st_dev, st.st_ino)
        frame = RequestHeader(OP_COMMIT, 1, rep.segment_id, rep.offset, 64 * KiB, len(meta),
                              grant=grant_from_replica(rep, GRANT_OP_WRITE)).pack() + meta
        commits.append(_send(_tcp_address(started.segments, rep.segment_id), frame))
    ended = stub.PutEnd(pb.PutEndRequest(header=bob, items=[
        pb.PutEndItem(key=k, put_id=r.put_id, checksum=0)
        for k, r in zip(keys, started.results, strict=True)]))
    # Read raw (the SDK would refuse the checksum 0; an attacker reads the frame itself).
    got = stub.GetReplicas(pb.GetReplicasRequest(header=bob, keys=keys))
    leaked = [k for data in _read_granted(got) if data is not None
              for k, v in secrets.items() if data == v]
    assert not leaked, f"bob read alice's removed bytes of {leaked}"
    assert commits == [ST_BAD_GRANT] * len(keys)
    assert {r.status for r in ended.results} == {pb.PERMISSION_DENIED}


def test_the_master_sets_the_commit_right_only_for_shm_identities(cluster: SecurityCluster,
                                                                  stub: Any) -> None:
    for token, want in ((cluster.alice, False), (cluster.token_for("alice", shm=True), True)):
        header = _header(token, "alice")
        started = stub.PutStart(pb.PutStartRequest(header=header, items=[
            pb.PutItem(key=f"right/{want}", size_bytes=4096)]))
        result = started.results[0]
        assert bool(result.replicas[0].grant.op & GRANT_FLAG_COMMIT) is want
        stub.PutRevoke(pb.PutRevokeRequest(header=header, items=[
            pb.PutRef(key=f"right/{want}", put_id=result.put_id)]))


def test_metadata_only_fill_evicts_nobody(cluster: SecurityCluster, stub: Any) -> None:
    values = {f"keep/{i}": os.urandom(256 * KiB) for i in range(40)}
    with cellar.connect(cluster.address, tenant="alice", token=cluster.alice) as alice:
        for key, value in values.items():
            alice.put(key, value)
        bob = _header(cluster.bob, "bob")
        filled = []
        for round_ in range(6):
            keys = [f"fill/{round_}/{i}" for i in range(16)]
            started = stub.PutStart(pb.PutStartRequest(header=bob, items=[
                pb.PutItem(key=k, size_bytes=MiB) for k in keys]))
            placed = [(k, r) for k, r in zip(keys, started.results, strict=True)
                      if r.status == pb.OK]
            stub.PutEnd(pb.PutEndRequest(header=bob, items=[
                pb.PutEndItem(key=k, put_id=r.put_id, checksum=0) for k, r in placed]))
            filled += [k for k, _ in placed]
        lost = [k for k, v in values.items() if not _reads_back(alice, k, v)]
        assert not lost, f"{len(lost)} of {len(values)} objects evicted by a metadata-only fill"
    exists = stub.Exists(pb.KeysRequest(header=bob, keys=filled)).statuses if filled else []
    assert pb.OK not in exists, "objects no node holds became COMPLETE"
