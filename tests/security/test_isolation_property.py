"""Issue 19, the property: random interleavings of put, remove, evict, late write and late
commit from two tenants never let one tenant read or destroy the other's bytes.

One real cluster (a master and two 16 MiB nodes) for the module; hypothesis drives a state
machine over it, a bounded number of examples (derandomized, ~1 minute), each step one of:
- `put` / `remove`: a tenant's SDK call on one of its few keys (the model keeps what it put);
- `evict`: a tenant puts a burst of large objects, so the master evicts (its own objects past
  its default quota, or any tenant's LRU objects when space is short);
- `start`: a raw put of a `raw/` key: PutStart, maybe part of the bytes, then a PutEnd without
  receipts, a PutRevoke, or nothing (the writer "dies"); its write grants are kept;
- `late_write` / `late_commit`: an attacker replays a kept write grant (an old allocation's):
  a WRITE of junk claiming the whole object, a zero-byte WRITE claiming it, or a COMMIT over
  TCP naming the segment file (not a secret).
After every step: every key the model holds either does not exist (evicted) or its node serves
exactly the bytes its tenant put to the read grant the master gives (a destroyed object is
still listed but its node refuses the read; a clobbered one serves other bytes); reads are raw
(GetReplicas, a READ frame, Unpin at once), so pins never outlive a step and stop eviction.
No `raw/` key ever became readable (no receipt, no COMPLETE object, so no read grant over
bytes nobody wrote).
Steps are shrinkable: a failure reports the shortest sequence hypothesis finds.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from identity_kit import SecurityCluster, running
from test_write_receipts import _read_granted, _send

import cellar
from cellar.client.session_state import grant_from_replica
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.proto.grant import GRANT_OP_WRITE
from cellar.transfer.frame import (
    OP_COMMIT,
    OP_WRITE,
    RequestHeader,
    WriteMeta,
    pack_commit_meta,
)

KiB = 1024
MiB = 1024 * KiB
TENANTS = ("alice", "bob")
SIZES = (4 * KiB, 64 * KiB, 512 * KiB)
KEYS = 4
MAX_KEPT_GRANTS = 32
STATS: Counter[str] = Counter()  # what the examples did (asserted: the test proves something)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SecurityCluster]:
    with running(SecurityCluster(2, "16MiB")) as c:
        yield c


class World:
    """What lives for the module: a client and a raw stub per tenant, the segment file ids."""

    def __init__(self, cluster: SecurityCluster) -> None:
        self.tokens = {t: cluster.token_for(t, unlimited=False) for t in TENANTS}  # default quota
        self.clients = {t: cellar.connect(cluster.address, tenant=t, token=self.tokens[t])
                        for t in TENANTS}
        self.channel = grpc.insecure_channel(cluster.address)
        self.stub = pb_grpc.MasterStub(self.channel)
        trusted = cluster.token_for("alice", shm=True)
        status = self.stub.ClusterStatus(pb.ClusterStatusRequest(
            header=pb.RequestHeader(tenant="alice", token=trusted)))
        self.files = {}
        for s in status.segments:
            st_ = os.stat(next(e.address for e in s.info.endpoints if e.transport == "shm"))
            self.files[s.info.segment_id] = (st_.st_dev, st_.st_ino)
        self.tcp = {s.info.segment_id: next(e.address for e in s.info.endpoints
                                            if e.transport == "tcp") for s in status.segments}
        self.serial = 0

    def header(self, tenant: str) -> pb.RequestHeader:
        return pb.RequestHeader(tenant=tenant, client_id=f"prop-{tenant}",
                                token=self.tokens[tenant])

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.channel.close()


@pytest.fixture(scope="module")
def world(cluster: SecurityCluster) -> Iterator[World]:
    w = World(cluster)
    try:
        yield w
    finally:
        w.close()


def _read_all(world: World, tenant: str, keys: list[str]) -> list[bytes | None]:
    """Each key's bytes as its first replica's node serves them to a read grant (None: no such
    key); b"" when the node refused the read (the allocation is not held: destroyed)."""
    header = world.header(tenant)
    got = world.stub.GetReplicas(pb.GetReplicasRequest(header=header, keys=keys))
    assert {r.status for r in got.results} <= {pb.OK, pb.NOT_FOUND}, got.results
    out = _read_granted(got)
    world.stub.Unpin(pb.UnpinRequest(header=header,
                                     pin_ids=[r.pin_id for r in got.results if r.pin_id]))
    return out


def make_machine(world: World) -> type[RuleBasedStateMachine]:
    class Isolation(RuleBasedStateMachine):
        @initialize()
        def clean(self) -> None:
            for client in world.clients.values():
                client.remove_all()
            self.model: dict[str, dict[str, bytes]] = {t: {} for t in TENANTS}
            self.kept: list[tuple[str, str, Any, int]] = []  # tenant, key, replica, size
            self.raw_keys: dict[str, set[str]] = {t: set() for t in TENANTS}

        @rule(tenant=st.sampled_from(TENANTS), k=st.integers(0, KEYS - 1),
              size=st.sampled_from(SIZES))
        def put(self, tenant: str, k: int, size: int) -> None:
            key = f"obj/{k}"
            value = os.urandom(size)
            try:
                world.clients[tenant].upsert(key, value)
            except (cellar.NoSpace, cellar.QuotaExceeded, cellar.Unavailable):
                self.model[tenant].pop(key, None)  # the old value may be gone (evicted) or not
                return
            self.model[tenant][key] = value
            STATS["put"] += 1

        @rule(tenant=st.sampled_from(TENANTS), k=st.integers(0, KEYS - 1))
        def remove(self, tenant: str, k: int) -> None:
            world.clients[tenant].remove(f"obj/{k}")
            self.model[tenant].pop(f"obj/{k}", None)

        @rule(tenant=st.sampled_from(TENANTS), count=st.integers(6, 9))  # 9 x 2 MiB > its quota
        def evict(self, tenant: str, count: int) -> None:
            blob = os.urandom(2 * MiB)
            for _ in range(count):
                world.serial += 1
                try:
                    world.clients[tenant].put(f"burst/{world.serial}", blob)
                except (cellar.NoSpace, cellar.QuotaExceeded) as exc:
                    STATS[f"burst:{type(exc).__name__}"] += 1
                    return
                STATS["burst"] += 1

        @rule(tenant=st.sampled_from(TENANTS), size=st.sampled_from(SIZES),
              written=st.sampled_from([0, 1, 2]), end=st.sampled_from(["end", "revoke", "die"]))
        def start(self, tenant: str, size: int, written: int, end: str) -> None:
            world.serial += 1
            key = f"raw/{world.serial}"
            header = world.header(tenant)
            started = world.stub.PutStart(pb.PutStartRequest(header=header, items=[
                pb.PutItem(key=key, size_bytes=size)]))
            result = started.results[0]
            if result.status != pb.OK:
                return
            rep = result.replicas[0]
            self.kept = [*self.kept, (tenant, key, rep, size)][-MAX_KEPT_GRANTS:]
            STATS["start"] += 1
            self.raw_keys[tenant].add(key)
            if written:  # part of the bytes (1/2), or all of them with a lying checksum (2)
                length = size // 2 if written == 1 else size
                meta = WriteMeta(0, size, tenant, key).pack()
                frame = RequestHeader(OP_WRITE, 1, rep.segment_id, rep.offset, length,
                                      len(meta), grant=grant_from_replica(rep, GRANT_OP_WRITE)
                                      ).pack() + meta + os.urandom(length)
                _send(world.tcp[rep.segment_id], frame)
            if end == "end":  # no receipts: refused, the put revoked
                world.stub.PutEnd(pb.PutEndRequest(header=header, items=[
                    pb.PutEndItem(key=key, put_id=result.put_id, checksum=0)]))
            elif end == "revoke":
                world.stub.PutRevoke(pb.PutRevokeRequest(header=header, items=[
                    pb.PutRef(key=key, put_id=result.put_id)]))

        # a kept grant is picked by index (modulo): what is kept depends on the cluster's
        # answers, and a strategy must not, or hypothesis cannot replay and shrink a failure
        @rule(pick=st.integers(0, MAX_KEPT_GRANTS - 1), claim_only=st.booleans())
        def late_write(self, pick: int, claim_only: bool) -> None:
            if not self.kept:
                return
            tenant, key, rep, size = self.kept[pick % len(self.kept)]
            meta = WriteMeta(0, size, tenant, key).pack()
            length = 0 if claim_only else size
            frame = RequestHeader(OP_WRITE, 1, rep.segment_id, rep.offset, length, len(meta),
                                  grant=grant_from_replica(rep, GRANT_OP_WRITE)).pack()
            status = _send(world.tcp[rep.segment_id], frame + meta + b"\xee" * length)
            STATS[f"late_write:{status}"] += 1

        @rule(pick=st.integers(0, MAX_KEPT_GRANTS - 1))
        def late_commit(self, pick: int) -> None:
            if not self.kept:
                return
            tenant, key, rep, size = self.kept[pick % len(self.kept)]
            dev, ino = world.files[rep.segment_id]
            meta = pack_commit_meta(WriteMeta(0, size, tenant, key), dev, ino)
            frame = RequestHeader(OP_COMMIT, 1, rep.segment_id, rep.offset, size, len(meta),
                                  grant=grant_from_replica(rep, GRANT_OP_WRITE)).pack() + meta
            STATS[f"late_commit:{_send(world.tcp[rep.segment_id], frame)}"] += 1

        @invariant()
        def every_object_is_its_writers_or_gone(self) -> None:
            for tenant in TENANTS:
                keys = list(self.model[tenant])
                if keys:  # raw reads, unpinned at once (an SDK get's pin would outlive a step)
                    for key, data in zip(keys, _read_all(world, tenant, keys), strict=True):
                        if data is None:  # evicted is allowed; destroyed or clobbered is not
                            del self.model[tenant][key]
                            STATS["gone"] += 1
                        else:
                            assert data == self.model[tenant][key], (tenant, key)
                            STATS["checked"] += 1
                raw = sorted(self.raw_keys[tenant])
                if raw:
                    got = world.stub.GetReplicas(pb.GetReplicasRequest(
                        header=world.header(tenant), keys=raw))
                    assert pb.OK not in {r.status for r in got.results}, \
                        "an object no node sealed became readable"
                    world.stub.Unpin(pb.UnpinRequest(header=world.header(tenant), pin_ids=[
                        r.pin_id for r in got.results if r.pin_id]))

    return Isolation


def test_two_tenants_never_read_or_destroy_each_others_bytes(world: World) -> None:
    run_state_machine_as_test(make_machine(world), settings=settings(
        max_examples=int(os.environ.get("CELLAR_PROPERTY_EXAMPLES", "60")),
        stateful_step_count=25, derandomize=True, deadline=None,
        suppress_health_check=list(HealthCheck)))
    print(dict(sorted(STATS.items())))
    late = sum(n for what, n in STATS.items() if what.startswith(("late_write", "late_commit")))
    assert STATS["checked"] and STATS["gone"] and late, STATS  # it did check, evict and attack
