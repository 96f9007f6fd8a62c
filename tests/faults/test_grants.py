"""Writes the data plane must refuse without changing a byte: a forged grant, an expired grant
(properly signed), and a grant into a range that was freed and handed to another object."""

from __future__ import annotations

import dataclasses
import time

import pytest
import xxhash
from faultkit import header, locations, raw_stub, write_with

import cellar
from cellar.client.session_state import grant_from_replica
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_WRITE, sign
from tests.support.receipts import receipts_for


def put_start(stub, key: str, size: int, avoid: list[str]) -> pb.PutStartReply:
    reply = stub.PutStart(pb.PutStartRequest(header=header(), items=[
        pb.PutItem(key=key, size_bytes=size, avoid_node_ids=avoid)]))
    assert reply.results[0].status == pb.OK, reply.results[0].message
    return reply


@pytest.mark.timeout(60)
def test_forged_expired_and_reused_grants_change_nothing(fault_cluster):
    cluster = fault_cluster(nodes=1, write_grant_ttl_s=30)
    secret = bytes.fromhex(cluster.secret)
    seg_file = cluster.segment_file(0)
    channel, stub = raw_stub(cluster)
    data = bytes(range(256)) * 64
    digest = xxhash.xxh3_64_intdigest(data)
    with channel, cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        started = put_start(stub, "a", len(data), [])
        rep = started.results[0].replicas[0]
        region = slice(rep.offset, rep.offset + len(data))
        before = seg_file.read_bytes()[region]
        good = grant_from_replica(rep, GRANT_OP_WRITE)

        # forged: one bit of the MAC flipped
        forged = dataclasses.replace(good, mac=bytes([good.mac[0] ^ 1]) + good.mac[1:])
        result = write_with(rep, started.segments, "a", data, digest, grant=forged)
        assert not result.ok and "mac" in result.message.lower(), result
        # forged: a valid grant stretched to a neighbouring range
        stretched = dataclasses.replace(good, length=good.length * 2)
        assert not write_with(rep, started.segments, "a", data, digest, grant=stretched).ok
        # expired: signed with the real secret, expiry well in the past
        expired = sign(secret, op=GRANT_OP_WRITE, segment_id=good.segment_id, offset=good.offset,
                       length=good.length, alloc_id=good.alloc_id, epoch=good.epoch,
                       expiry_ms=int(time.time() * 1000) - 60_000, tag=good.key_tag)
        result = write_with(rep, started.segments, "a", data, digest, grant=expired)
        assert not result.ok and "expired" in str(result), result
        assert seg_file.read_bytes()[region] == before

        # The real grant works once; the object becomes visible.
        assert write_with(rep, started.segments, "a", data, digest).ok
        assert stub.PutEnd(pb.PutEndRequest(header=header(), items=[pb.PutEndItem(
            key="a", put_id=started.results[0].put_id, checksum=digest,
            receipts=receipts_for(secret, started.results[0], digest))])).results[0].status == pb.OK
        # Visible, checked through the raw stub and unpinned at once: a pin held by the SDK
        # (its unpin rides on a later call) would delay the free and "b" would land elsewhere.
        assert locations(stub, ["a"])["a"][0].offset == rep.offset
        assert seg_file.read_bytes()[region] == data

        # Freed and reallocated: remove "a", place "b" of the same size (one node, nothing else
        # allocated: the allocator hands the same block back), write it; the old grant of "a"
        # must not touch "b".
        client.remove("a")
        other = bytes(reversed(data))
        other_digest = xxhash.xxh3_64_intdigest(other)
        b = put_start(stub, "b", len(other), [])
        brep = b.results[0].replicas[0]
        assert write_with(brep, b.segments, "b", other, other_digest).ok
        assert stub.PutEnd(pb.PutEndRequest(header=header(), items=[pb.PutEndItem(
            key="b", put_id=b.results[0].put_id, checksum=other_digest,
            receipts=receipts_for(secret, b.results[0], other_digest))])).results[0].status == pb.OK
        assert (brep.segment_id, brep.offset) == (rep.segment_id, rep.offset), \
            "the range of a was not reused: the test would prove nothing"
        bregion = slice(brep.offset, brep.offset + len(other))
        snapshot = seg_file.read_bytes()[bregion]
        result = write_with(rep, started.segments, "a", data, digest)
        assert not result.ok, result
        assert seg_file.read_bytes()[bregion] == snapshot == other
        assert client.get("b") == other
        assert "freed" in result.message or "complete" in result.message, result
