"""The node's copier (storage_node/copier.py) and the late-write rule: a copy's bytes land only
while the master that ordered it still owns the target range for it.

The node's real classes (NodeAccess, ObjectIndex, MasterClock, Segment, HeartbeatCargo); only
the source is a stand-in, a transport whose read lands its bytes when the test says so and,
like tcp_async, never once the read was cancelled or ran out of time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import xxhash

from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import (
    GRANT_FLAG_COMMIT,
    GRANT_OP_READ,
    GRANT_OP_WRITE,
    Grant,
    key_tag,
    sign,
)
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock
from cellar.storage_node.copier import Copier
from cellar.storage_node.heartbeat_cargo import HeartbeatCargo
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer.base import ST_TIMEOUT, AsyncTransport, TransferOp, TransferResult
from cellar.transfer.frame import OP_COMMIT, RequestHeader, WriteMeta

SECRET = bytes(range(32))
SEG, SOURCE_SEG = 7, 9
SIZE = 64 << 10
TTL_MS = 30_000
OLD_COPY, NEW_PUT = 10, 20  # alloc ids only grow, across epochs too


class SlowSource(AsyncTransport):
    """The source node: a read waits for `go`, then lands `data` in the copy's range."""

    name = "tcp"

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.go = asyncio.Event()
        self.reading = asyncio.Event()
        self.budgets_s: list[float] = []

    async def read(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        (op,) = ops
        self.budgets_s.append(timeout_s)
        self.reading.set()
        try:  # cancelled or out of time here: nothing lands (tcp_async's guarantee)
            await asyncio.wait_for(self.go.wait(), timeout_s)
        except asyncio.TimeoutError:
            return [TransferResult(ST_TIMEOUT, "the source did not answer")]
        op.buffer[:] = self.data
        return [TransferResult(checksum=xxhash.xxh3_64_intdigest(self.data))]

    async def write(self, ops: Sequence[TransferOp], timeout_s: float) -> list[TransferResult]:
        raise AssertionError("a copy only reads")

    async def aclose(self) -> None:
        pass


class Node:
    """One storage node's access gate over one in-memory segment, mounted at `epoch`."""

    def __init__(self, epoch: int = 1, ttl_ms: int = TTL_MS) -> None:
        self.ttl_ms = ttl_ms  # the master's write_grant_ttl_s: a grant's issue time is expiry - it
        self.clock = MasterClock()
        self.segment = Segment.in_memory(SEG, 1 << 20)
        self.index = ObjectIndex(allowed_skew_ms=1000)
        self.access = NodeAccess({SEG: self.segment}, self.index, SECRET, self.clock)
        self.mount(epoch)

    def mount(self, epoch: int) -> None:
        """What master_link does once MountSegment answered (the index was reported)."""
        self.clock.epoch = epoch
        self.index.set_mount(self.clock.now_ms() - 1, self.ttl_ms, self.ttl_ms)

    def grant(self, op: int, alloc_id: int, segment_id: int = SEG, key: str = "k") -> Grant:
        return sign(SECRET, op=op, segment_id=segment_id, offset=0, length=SIZE,
                    alloc_id=alloc_id, epoch=self.clock.epoch,
                    expiry_ms=self.clock.now_ms() + self.ttl_ms, tag=key_tag("t", key))

    def order(self, data: bytes) -> pb.CopyTask:
        """A copy order as the master signs it: the new replica at offset 0 of this node."""
        return pb.CopyTask(
            alloc_id=OLD_COPY, tenant="t", key="k", length=SIZE,
            checksum=xxhash.xxh3_64_intdigest(data), source_address="10.0.0.9:7000",
            source_node_id="source", source_segment_id=SOURCE_SEG, source_offset=0,
            source_grant=wire(self.grant(GRANT_OP_READ, 3, SOURCE_SEG)),
            target_grant=wire(self.grant(GRANT_OP_WRITE, OLD_COPY)),
            target_segment_id=SEG, target_offset=0, value_alloc_id=3)


def wire(g: Grant) -> pb.Grant:
    return pb.Grant(op=g.op, alloc_id=g.alloc_id, epoch=g.epoch, expiry_ms=g.expiry_ms,
                    key_tag=g.key_tag, mac=g.mac)


async def until_idle(copier: Copier) -> None:
    while copier.status()["copies_running"]:
        await asyncio.sleep(0.001)


def test_a_copy_ordered_before_a_remount_never_lands_over_the_next_masters_put() -> None:
    """Master 1 orders a copy into [0, SIZE); the source is slow. The node remounts on master 2
    (rebuilt from the report, which lacks the unsealed copy: the range is free there), which
    puts a new value into the same range over shm: the writer copies into the segment itself
    (no claim: master 2 freed nothing there) and COMMITs. The old copy's bytes must not be in
    the range the COMMIT seals. Before copies belonged to a mount, the old copy read on after
    the remount, landed its bytes over the new value and ended (releasing its hold, so nothing
    refused the COMMIT): the put sealed the old object's bytes under the new checksum."""
    old_value, new_value = b"o" * SIZE, b"n" * SIZE

    async def body() -> None:
        node = Node(epoch=1)
        source = SlowSource(old_value)
        copier = Copier(node.access, lambda: source)
        cargo = HeartbeatCargo(None, None, copier)
        copier.start([node.order(old_value)])
        await source.reading.wait()
        assert node.index.in_flight(OLD_COPY) == 1  # admitted, held, reading

        # the remount, in master_link's order: begin_mount, the report, then the mount reply
        assert await cargo.begin_mount()
        node.index.prepare_report(node.clock.now_ms())
        node.mount(epoch=2)

        grant = node.grant(GRANT_OP_WRITE | GRANT_FLAG_COMMIT, NEW_PUT, key="new")
        node.segment.memory[0:SIZE] = new_value  # the shm writer's own copy
        source.go.set()  # the slow source answers the old copy now
        await until_idle(copier)
        commit = RequestHeader(OP_COMMIT, 1, SEG, 0, SIZE, grant=grant)
        receipt = node.access.commit(commit, WriteMeta(xxhash.xxh3_64_intdigest(new_value),
                                                       SIZE, "t", "new"), 0, 0)
        assert receipt, "the new put was not sealed"
        landed = bytes(node.segment.memory[0:SIZE])
        assert landed == new_value, "the old copy's bytes landed over the new put"
        assert copier.status()["copies_stale"] == 1 and copier.take_done() == []
        assert node.index.in_flight(OLD_COPY) == 0 and node.index.draining() == 0

    asyncio.run(body())


def test_a_copy_ends_by_its_write_grant_expiry() -> None:
    """The master gives up a copy not reported by its write grant's expiry and hands the range
    out again `grant_skew_s` later: the copy's read, and its hold on the range, must be over by
    then, as the data server cuts its own transfers. Before, the read ran COPY_TIMEOUT_S (30 s)
    whatever the grant's life (`write_grant_ttl_s` may be a few seconds)."""
    async def body() -> None:
        node = Node(ttl_ms=300)
        source = SlowSource(b"o" * SIZE)  # never answers
        copier = Copier(node.access, lambda: source)
        copier.start([node.order(source.data)])
        await asyncio.wait_for(until_idle(copier), 5)
        assert source.budgets_s and 0 < source.budgets_s[0] <= 0.3
        (done,) = copier.take_done()
        assert done.status == pb.INTERNAL and copier.status()["copies_failed"] == 1
        assert node.index.in_flight(OLD_COPY) == 0

    asyncio.run(body())


def test_a_copy_whose_range_was_freed_while_it_read_reports_a_failure() -> None:
    """The master frees the target (it gave the copy up) while the source is slow; the copy's
    bytes then arrive whole and check out, but its allocation is gone: nothing is sealed, and
    the report says so (before: OK, with no receipt, counted in copies_ok)."""
    async def body() -> None:
        node = Node()
        source = SlowSource(b"o" * SIZE)
        copier = Copier(node.access, lambda: source)
        copier.start([node.order(source.data)])
        await source.reading.wait()
        freed = pb.FreedRange(segment_id=SEG, alloc_id=OLD_COPY, offset=0, length=SIZE)
        assert node.index.apply_freed([freed], node.clock.now_ms()) == 1
        assert node.index.draining() == 1  # held: the range stays blocked until the copy ends
        source.go.set()
        await until_idle(copier)
        (done,) = copier.take_done()
        assert done.status == pb.INTERNAL and not done.receipt, done
        assert copier.status()["copies_ok"] == 0 and node.index.draining() == 0

    asyncio.run(body())
