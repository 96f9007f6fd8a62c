"""Scatter-gather puts whose checksum the shm transport computes as it copies
(`TransferOp.want_checksum` on writes): the plan leaves it to the transport only when every
replica's transport hashes writes; the digests the transport returns become the checksum the
master is told; replicas that disagree fail the key; an op that ends up on a transport that
does not hash gets its checksum from `session_state.plan_round` before it leaves."""

from __future__ import annotations

import xxhash

from cellar.client import puts, session_state
from cellar.client.puts import PutBatch
from cellar.client.session_state import NodeHealth, TransportSet
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.base import SegmentRoute, TransferResult, Transport

HEADER = pb.RequestHeader(tenant="t", client_id="c")
PARTS = (memoryview(b"ab" * 100), memoryview(b"c" * 7), memoryview(b"d" * 50))
DIGEST = xxhash.xxh3_64_intdigest(b"".join(PARTS))
RECEIPT = b"r" * 68  # what a node returns once it sealed; only the master checks it


def _placed(request: pb.PutStartRequest, nodes: list[str]) -> pb.PutStartReply:
    reps = [pb.Replica(node_id=n, segment_id=i + 1, offset=0, length=request.items[0].size_bytes,
                       grant=pb.Grant(op=1, alloc_id=7, epoch=1, expiry_ms=99, key_tag=5,
                                      mac=b"m" * 16))
            for i, n in enumerate(nodes)]
    segs = [pb.SegmentInfo(segment_id=i + 1, node_id=n, size_bytes=1 << 20, host_id="h",
                           endpoints=[pb.Endpoint(transport="tcp", address=f"{n}:1")])
            for i, n in enumerate(nodes)]
    return pb.PutStartReply(results=[pb.PutStartResult(status=0, put_id=9, replicas=reps)],
                            segments=segs)


def _batch(hashing_nodes: set[str]) -> PutBatch:
    return PutBatch(puts.parts_entries([("k", PARTS)]), tenant="t", replicas=2, soft_pin=False,
                    upsert=False, health=NodeHealth(),
                    hashes_writes=lambda route: route.node_id in hashing_nodes)


def test_left_to_the_transport_when_every_replica_hashes_writes() -> None:
    batch = _batch({"n1", "n2"})
    ops = batch.on_start_reply(_placed(batch.start_request(HEADER), ["n1", "n2"]))
    assert [op.want_checksum for op in ops] == [True, True]
    assert batch.entries[0].checksum is None  # not hashed beforehand
    end, revoke = batch.on_write_results([TransferResult(checksum=DIGEST, receipt=RECEIPT)] * 2, may_retry=True)
    assert revoke is None and [i.checksum for i in end] == [DIGEST]


def test_hashed_before_the_copy_when_one_replica_cannot() -> None:
    batch = _batch({"n1"})
    ops = batch.on_start_reply(_placed(batch.start_request(HEADER), ["n1", "n2"]))
    assert [op.want_checksum for op in ops] == [False, False]
    assert [op.meta.checksum for op in ops] == [DIGEST, DIGEST]


def test_replicas_that_disagree_or_a_missing_digest_fail_the_write() -> None:
    for results in ([TransferResult(checksum=DIGEST, receipt=RECEIPT), TransferResult(checksum=DIGEST + 1, receipt=RECEIPT)],
                    [TransferResult(checksum=None, receipt=RECEIPT), TransferResult(checksum=DIGEST, receipt=RECEIPT)]):
        batch = _batch({"n1", "n2"})
        batch.on_start_reply(_placed(batch.start_request(HEADER), ["n1", "n2"]))
        end, revoke = batch.on_write_results(results, may_retry=False)
        assert end is None and [r.key for r in revoke] == ["k"]
        assert batch.entries[0].status is not None and batch.entries[0].status.name != "OK"


class _Plain(Transport):
    """A transport that does not hash writes (as tcp), reaching every route."""

    name = "tcp"

    def write(self, ops, timeout_s):  # pragma: no cover - never called here
        raise AssertionError

    def read(self, ops, timeout_s):  # pragma: no cover
        raise AssertionError

    def can_reach(self, route: SegmentRoute) -> bool:
        return True


def test_a_deferred_write_routed_to_a_plain_transport_is_hashed_before_it_leaves() -> None:
    batch = _batch({"n1", "n2"})  # planned for hashing transports ...
    ops = batch.on_start_reply(_placed(batch.start_request(HEADER), ["n1", "n2"]))
    rnd = session_state.plan_round(TransportSet([_Plain()]), "write", ops, deadline=1e18,
                          can_fall_back=False)  # ... but only a plain one reaches them now
    assert [op.want_checksum for op in rnd.ops] == [False, False]
    assert [op.meta.checksum for op in rnd.ops] == [DIGEST, DIGEST]
    end, _ = batch.on_write_results([TransferResult(receipt=b"r" * 68)] * 2, may_retry=True)
    assert [i.checksum for i in end] == [DIGEST]
