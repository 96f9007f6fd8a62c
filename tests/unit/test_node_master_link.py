"""ControlLoop against an in-process fake master: mount, freed ranges + ack, remount rules."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.heartbeat_cargo import HeartbeatCargo
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.master_link import ControlLoop
from cellar.storage_node.segment import Segment

pytestmark = pytest.mark.timeout(60)


class FakeMaster(pb_grpc.MasterServicer):
    def __init__(self) -> None:
        self.epoch = 3
        self.mounts: list[pb.MountSegmentRequest] = []
        self.heartbeats: list[pb.HeartbeatRequest] = []
        self.unmounts: list[pb.UnmountSegmentRequest] = []
        self.next_reply: list[pb.HeartbeatReply] = []
        self.known = False
        self.interval_ms = 20
        self.heartbeat_at: list[float] = []  # loop time of each heartbeat

    def header(self) -> pb.ReplyHeader:
        return pb.ReplyHeader(epoch=self.epoch, master_time_ms=wall_ms() + 5_000)

    async def MountSegment(self, request: Any, context: Any) -> pb.MountSegmentReply:
        self.mounts.append(request)
        self.known = True
        return pb.MountSegmentReply(header=self.header(), heartbeat_interval_ms=self.interval_ms,
                                    results=[pb.KeyResult(status=pb.OK) for _ in request.segments])

    async def Heartbeat(self, request: Any, context: Any) -> pb.HeartbeatReply:
        self.heartbeats.append(request)
        self.heartbeat_at.append(asyncio.get_running_loop().time())
        if self.next_reply:
            reply = self.next_reply.pop(0)
            reply.header.CopyFrom(self.header())
            return reply
        return pb.HeartbeatReply(header=self.header(), remount=not self.known)

    async def UnmountSegment(self, request: Any, context: Any) -> pb.UnmountSegmentReply:
        self.unmounts.append(request)
        return pb.UnmountSegmentReply(header=self.header())


async def start_master(fake: FakeMaster, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    pb_grpc.add_MasterServicer_to_server(fake, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def run(body: Callable[[FakeMaster, ControlLoop, grpc.aio.Server, int], Awaitable[None]],
        interval_ms: int = 20) -> None:
    async def main() -> None:
        fake = FakeMaster()
        fake.interval_ms = interval_ms
        server, port = await start_master(fake)
        segments = [Segment.in_memory(11, 1 << 20), Segment.in_memory(12, 1 << 20, index=1)]
        loop = ControlLoop(node_id="n1", host_id="h1", master=f"127.0.0.1:{port}",
                           segments=segments, tcp_address="127.0.0.1:9", index=ObjectIndex(),
                           clock=MasterClock(), heartbeat_interval_s=1.0, master_timeout_s=1.0)
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        try:
            await asyncio.wait_for(loop.first_mount.wait(), 5)
            await body(fake, loop, server, port)
        finally:
            stop.set()
            await task
            await loop.unmount()
            await loop.close()
            await server.stop(None)

    asyncio.run(main())


def admit(index: ObjectIndex, alloc: int, offset: int) -> None:
    index.admit_write(alloc_id=alloc, segment_id=11, object_offset=offset, object_size=10,
                      tenant="", key=f"k{alloc}", checksum=0, epoch=3,
                      grant_expiry_ms=wall_ms() + 60_000)


def test_mount_request_and_clock() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        request = fake.mounts[0]
        assert request.node_id == "n1" and request.incarnation == loop.incarnation
        assert request.header.client_id == "n1" and request.header.tenant == ""
        assert [s.segment_id for s in request.segments] == [11, 12]
        info = request.segments[0]
        assert info.host_id == "h1" and info.size_bytes == 1 << 20 and info.node_id == "n1"
        assert [(e.transport, e.address) for e in info.endpoints][0] == ("tcp", "127.0.0.1:9")
        assert loop.clock.epoch == 3 and loop.heartbeat_interval_s == pytest.approx(0.02)
        assert 4_000 < loop.clock.offset_ms < 6_000  # learned from master_time_ms
        await until(lambda: len(fake.heartbeats) >= 3)
        assert all(h.incarnation == loop.incarnation for h in fake.heartbeats)
        assert loop.connected and loop.mounted

    run(body)


def test_freed_applied_then_acked() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        admit(loop.index, 1, 0)
        admit(loop.index, 2, 100)
        fake.next_reply.append(pb.HeartbeatReply(
            freed=[pb.FreedRange(segment_id=11, alloc_id=1, offset=0, length=10)], freed_seq=41))
        await until(lambda: any(h.freed_ack_seq == 41 for h in fake.heartbeats))
        assert loop.index.get(1) is None and loop.index.is_tombstoned(1)
        assert loop.index.get(2) is not None
        # an empty reply (freed_seq 0) never lowers the ack
        n = len(fake.heartbeats)
        await until(lambda: len(fake.heartbeats) >= n + 3)
        assert fake.heartbeats[-1].freed_ack_seq == 41

    run(body)


def test_freed_ranges_are_not_acknowledged_while_one_still_drains() -> None:
    """A freed allocation with a transfer in flight (a READ reply not yet with the kernel)
    keeps its notice unacknowledged, so the master keeps asking shm writers to claim its
    range (which the node refuses meanwhile); acknowledged once the transfer ends."""
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        admit(loop.index, 1, 0)
        loop.index.hold(1)  # a transfer in flight on allocation 1
        fake.next_reply.append(pb.HeartbeatReply(
            freed=[pb.FreedRange(segment_id=11, alloc_id=1, offset=0, length=10)], freed_seq=41))
        await until(lambda: loop.index.get(1) is None)
        n = len(fake.heartbeats)
        await until(lambda: len(fake.heartbeats) >= n + 3)
        assert all(h.freed_ack_seq < 41 for h in fake.heartbeats)
        assert loop.index.draining() == 1
        loop.index.release(1)
        await until(lambda: any(h.freed_ack_seq == 41 for h in fake.heartbeats))

    run(body)


def test_freed_ranges_are_acknowledged_soon_not_an_interval_later() -> None:
    """Heartbeats every 2 s: the heartbeat after one that brought freed ranges comes within
    freed_acks.ACK_SOON_S, so the master soon stops asking shm writers to claim those ranges
    (master/state/read_frees.py); the one after that waits the interval again."""
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        admit(loop.index, 1, 0)
        fake.next_reply.append(pb.HeartbeatReply(
            freed=[pb.FreedRange(segment_id=11, alloc_id=1, offset=0, length=10)], freed_seq=7))
        await until(lambda: any(h.freed_ack_seq == 7 for h in fake.heartbeats), timeout_s=10)
        acked = next(i for i, h in enumerate(fake.heartbeats) if h.freed_ack_seq == 7)
        assert fake.heartbeat_at[acked] - fake.heartbeat_at[acked - 1] < 1.0
        await until(lambda: len(fake.heartbeats) > acked + 1, timeout_s=10)
        assert fake.heartbeat_at[acked + 1] - fake.heartbeat_at[acked] > 1.0

    run(body, interval_ms=2000)


def test_remount_when_master_forgets_and_clears_index() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        admit(loop.index, 1, 0)
        fake.known = False
        await until(lambda: len(fake.mounts) == 2)
        await until(lambda: loop.mounted)
        assert loop.mount_count == 2 and len(loop.index) == 0 and loop.index.is_tombstoned(1)

    run(body)


def test_remount_on_epoch_change() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        fake.epoch = 4
        await until(lambda: len(fake.mounts) == 2 and loop.mounted)
        assert loop.clock.epoch == 4

    run(body)


class MountGate(HeartbeatCargo):
    """Cargo whose mover says `busy` times that a move is still writing (disk_tier.py)."""

    def __init__(self, fake: FakeMaster, busy: int) -> None:
        super().__init__(None, None)
        self.fake = fake
        self.busy = busy
        self.calls: list[int] = []  # mounts the master had seen at each call

    async def begin_mount(self) -> bool:
        self.calls.append(len(self.fake.mounts))
        self.busy -= 1
        return self.busy < 0


def test_every_mount_first_voids_the_tier_moves_and_waits_for_the_one_writing() -> None:
    """Before a mount sends the index (a new master treats what it lacks as free), the mover
    drops the moves an earlier master ordered; while one is still writing the mount waits."""
    async def body(fake: FakeMaster, loop: ControlLoop, *_: Any) -> None:
        gate = loop.cargo = MountGate(fake, busy=2)
        fake.epoch = 4  # a new master: mount again
        await until(lambda: len(fake.mounts) == 2 and loop.mounted)
        assert gate.calls == [1, 1, 1]  # twice refused (no mount sent), then the mount

    run(body)


def test_master_restart_on_same_port() -> None:
    async def body(fake: FakeMaster, loop: ControlLoop, server: grpc.aio.Server, port: int) -> None:
        await server.stop(None)
        await until(lambda: not loop.connected)
        assert loop.last_error
        fresh = FakeMaster()
        fresh.epoch = 9
        new_server, _ = await start_master(fresh, port)
        try:
            await until(lambda: len(fresh.mounts) == 1 and loop.mounted, timeout_s=10)
            assert loop.connected and loop.clock.epoch == 9
        finally:
            await new_server.stop(None)

    run(body)
