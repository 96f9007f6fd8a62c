"""ControlLoop follows the leader (issue 6): etcd lookups through a fake discovery, redirects
from a standby (trailing metadata or details only), failover to a new leader with the rebuild
protocol, a fixed address that falls back to the configured master, and the fencing that
follows a remount on a newer epoch (old-epoch grants refused by NodeAccess)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from test_node_master_link import FakeMaster, start_master, until

from cellar.coord.link import LinkState, node_failure
from cellar.coord.redirect import LEADER_METADATA, leader_from, redirect_details
from cellar.coord.target import LeaderRecord
from cellar.errors import ConfigError, Unavailable
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE, key_tag, sign
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.config import NodeConfig
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.master_link import ControlLoop
from cellar.storage_node.segment import Segment
from cellar.transfer.frame import ST_STALE_EPOCH, FrameError, RequestHeader, WriteMeta

pytestmark = pytest.mark.timeout(60)

URL = "etcd://127.0.0.1:1/c1"
SECRET = bytes(range(32))


class HaMaster(FakeMaster):
    """FakeMaster that reports objects and, as a standby, redirects like master/ does."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch
        self.leader = ""           # set: act as a standby naming this leader
        self.metadata = True       # standby: send `cellar-leader` trailing metadata too
        self.reports: list[pb.ReportObjectsRequest] = []

    async def _refuse_if_standby(self, context: Any) -> None:
        if self.leader:
            if self.metadata:
                context.set_trailing_metadata(((LEADER_METADATA, self.leader),))
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                redirect_details("m-standby", "standby", self.leader, 7))

    async def MountSegment(self, request: Any, context: Any) -> pb.MountSegmentReply:
        await self._refuse_if_standby(context)
        return await super().MountSegment(request, context)

    async def Heartbeat(self, request: Any, context: Any) -> pb.HeartbeatReply:
        await self._refuse_if_standby(context)
        return await super().Heartbeat(request, context)

    async def ReportObjects(self, request: Any, context: Any) -> pb.ReportObjectsReply:
        await self._refuse_if_standby(context)
        self.reports.append(request)
        return pb.ReportObjectsReply(header=self.header(), status=pb.OK)


class FakeDiscovery:
    """Stands in for LeaderDiscovery: names `record`, or raises Unavailable when `down`."""

    def __init__(self) -> None:
        self.record: LeaderRecord | None = None
        self.down = False
        self.calls = 0
        self.closed = False
        self._lock = threading.Lock()

    def leader(self, timeout_s: float = 2.0) -> LeaderRecord | None:
        with self._lock:
            self.calls += 1
            if self.down:
                raise Unavailable("etcd unreachable for cluster 'c1' (fake)")
            return self.record

    def close(self) -> None:
        self.closed = True


def record(master_id: str, port: int, epoch: int) -> LeaderRecord:
    return LeaderRecord(master_id, f"127.0.0.1:{port}", "", epoch)


def seal(index: ObjectIndex, alloc: int, offset: int, epoch: int) -> None:
    index.admit_write(alloc_id=alloc, segment_id=11, object_offset=offset, object_size=10,
                      tenant="default", key=f"k{alloc}", checksum=alloc, epoch=epoch,
                      grant_expiry_ms=wall_ms() + 60_000)
    index.record_written(alloc, 0, 10)


Body = Callable[[ControlLoop], Awaitable[None]]


def run_loop(master: str | Callable[[], Awaitable[str]], body: Body,
             discovery: FakeDiscovery | None = None, index: ObjectIndex | None = None,
             clock: MasterClock | None = None) -> None:
    """Run a ControlLoop on `master` (or the address `master()` returns, once it set up its
    fake masters on this event loop) while `body` runs."""
    async def main() -> None:
        if not isinstance(master, str):
            address = await master()
        else:
            address = master
        segments = [Segment.in_memory(11, 1 << 20)]
        loop = ControlLoop(node_id="n1", host_id="h1", master=address, segments=segments,
                           tcp_address="127.0.0.1:9", index=index or ObjectIndex(),
                           clock=clock or MasterClock(), heartbeat_interval_s=0.05,
                           master_timeout_s=1.0, discovery=discovery)
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        try:
            await body(loop)
        finally:
            stop.set()
            await task
            await loop.unmount()
            await loop.close()

    asyncio.run(main())


def test_etcd_leader_found_then_followed_on_failover() -> None:
    discovery = FakeDiscovery()

    async def body(loop: ControlLoop) -> None:
        a, b = HaMaster(epoch=100), HaMaster(epoch=200)
        server_a, port_a = await start_master(a)
        server_b, port_b = await start_master(b)
        b.leader = f"127.0.0.1:{port_a}"  # b starts as a standby
        try:
            assert loop.master == "" and not loop.mounted
            await asyncio.sleep(0.3)  # no leader yet: the loop waits, politely
            assert not loop.mounted and discovery.calls <= 3
            discovery.record = record("ma", port_a, 100)
            await asyncio.wait_for(loop.first_mount.wait(), 5)
            status = loop.status()
            assert status["master"] == f"127.0.0.1:{port_a}" and status["epoch"] == 100
            assert status["master_source"] == URL and status["leader_id"] == "ma"
            assert status["leader_epoch"] == 100 and status["configured_master"] == URL
            seal(loop.index, 1, 0, 100)
            seal(loop.index, 2, 100, 100)

            # the leader dies; etcd still names it until its lease lapses
            await server_a.stop(None)
            await until(lambda: not loop.connected)
            calls = discovery.calls
            await asyncio.sleep(0.5)
            assert loop.master == f"127.0.0.1:{port_a}"
            assert discovery.calls - calls <= 4  # at most a few lookups a second
            b.leader = ""
            discovery.record = record("mb", port_b, 200)
            await until(lambda: loop.mounted and loop.master == f"127.0.0.1:{port_b}")
            mount = b.mounts[-1]
            assert mount.report_follows is True and mount.previous_epoch == 100
            reported = sorted(e.alloc_id for r in b.reports for e in r.entries)
            assert reported == [1, 2] and b.reports[-1].last
            status = loop.status()
            assert status["epoch"] == 200 and status["leader_id"] == "mb"
            assert status["master_changes"] == 2 and loop.mount_count == 2
        finally:
            await server_b.stop(None)

    run_loop(URL, body, discovery)
    assert discovery.closed


def test_etcd_unreachable_keeps_retrying_without_spamming() -> None:
    discovery = FakeDiscovery()
    discovery.down = True

    async def body(loop: ControlLoop) -> None:
        fake = HaMaster(epoch=5)
        server, port = await start_master(fake)
        try:
            await asyncio.sleep(1.0)
            assert not loop.mounted and discovery.calls <= 6
            assert "etcd unreachable" in loop.status()["last_error"]
            discovery.down = False
            discovery.record = record("m1", port, 5)
            await asyncio.wait_for(loop.first_mount.wait(), 5)
            assert fake.mounts[0].report_follows is False  # nothing to report yet
            # a healthy master is never looked up again
            calls = discovery.calls
            await asyncio.sleep(0.3)
            assert discovery.calls == calls
        finally:
            await server.stop(None)

    run_loop(URL, body, discovery)


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "details-only"])
def test_fixed_address_at_a_standby_follows_the_redirect(metadata: bool) -> None:
    leader, standby = HaMaster(epoch=9), HaMaster(epoch=0)
    started: dict[str, Any] = {}

    async def body(loop: ControlLoop) -> None:
        await asyncio.wait_for(loop.first_mount.wait(), 5)
        port_l = started["port_l"]
        status = loop.status()
        assert status["master"] == f"127.0.0.1:{port_l}" and status["epoch"] == 9
        assert status["master_source"] == f"redirect from 127.0.0.1:{started['port_s']}"
        assert standby.mounts == [] and len(leader.mounts) == 1

    async def setup() -> str:
        started["server_l"], started["port_l"] = await start_master(leader)
        started["server_s"], started["port_s"] = await start_master(standby)
        standby.leader = f"127.0.0.1:{started['port_l']}"
        standby.metadata = metadata
        return f"127.0.0.1:{started['port_s']}"

    async def checked(loop: ControlLoop) -> None:
        try:
            await body(loop)
        finally:
            await started["server_l"].stop(None)
            await started["server_s"].stop(None)

    run_loop(setup, checked)


def test_fixed_address_goes_back_to_the_configured_master_when_the_leader_dies() -> None:
    old, configured = HaMaster(epoch=10), HaMaster(epoch=0)
    started: dict[str, Any] = {}

    async def body(loop: ControlLoop) -> None:
        await asyncio.wait_for(loop.first_mount.wait(), 5)
        assert loop.master == f"127.0.0.1:{started['port_old']}"
        seal(loop.index, 1, 0, 10)
        # the leader dies; the configured master takes over with a higher epoch
        await started["server_old"].stop(None)
        configured.leader = ""
        configured.epoch = 20
        await until(lambda: loop.mounted and loop.master == started["configured"])
        assert loop.status()["master_source"] == "config" and loop.clock.epoch == 20
        mount = configured.mounts[-1]
        assert mount.report_follows and mount.previous_epoch == 10
        assert [e.alloc_id for r in configured.reports for e in r.entries] == [1]

    async def setup() -> str:
        started["server_old"], started["port_old"] = await start_master(old)
        started["server_c"], port_c = await start_master(configured)
        started["configured"] = f"127.0.0.1:{port_c}"
        configured.leader = f"127.0.0.1:{started['port_old']}"
        return str(started["configured"])

    async def checked(loop: ControlLoop) -> None:
        try:
            await body(loop)
        finally:
            await started["server_c"].stop(None)
            await started["server_old"].stop(None)

    run_loop(setup, checked)


def test_a_standby_still_naming_the_lost_leader_is_waited_on_not_bounced() -> None:
    old, configured = HaMaster(epoch=10), HaMaster(epoch=0)
    started: dict[str, Any] = {}

    async def body(loop: ControlLoop) -> None:
        await asyncio.wait_for(loop.first_mount.wait(), 5)
        changes = loop.master_changes
        await started["server_old"].stop(None)
        await asyncio.sleep(0.8)  # the standby names the dead leader until its lease lapses
        assert loop.master == started["configured"] and not loop.mounted
        assert loop.master_changes == changes + 1  # went back once, did not bounce
        configured.leader = ""
        configured.epoch = 20
        await until(lambda: loop.mounted and loop.clock.epoch == 20, timeout_s=2.0)

    async def setup() -> str:
        started["server_old"], port_old = await start_master(old)
        started["server_c"], port_c = await start_master(configured)
        started["configured"] = f"127.0.0.1:{port_c}"
        configured.leader = f"127.0.0.1:{port_old}"
        return str(started["configured"])

    async def checked(loop: ControlLoop) -> None:
        try:
            await body(loop)
        finally:
            await started["server_c"].stop(None)
            await started["server_old"].stop(None)

    run_loop(setup, checked)


def test_deposed_leader_redirect_moves_a_mounted_node() -> None:
    discovery = FakeDiscovery()

    async def body(loop: ControlLoop) -> None:
        a, b = HaMaster(epoch=100), HaMaster(epoch=200)
        server_a, port_a = await start_master(a)
        server_b, port_b = await start_master(b)
        try:
            discovery.record = record("ma", port_a, 100)
            await asyncio.wait_for(loop.first_mount.wait(), 5)
            calls = discovery.calls
            # a is deposed and redirects to b; etcd agrees
            discovery.record = record("mb", port_b, 200)
            a.leader = f"127.0.0.1:{port_b}"
            await until(lambda: loop.mounted and loop.master == f"127.0.0.1:{port_b}")
            # etcd is the authority (cellar.coord.follow): the redirect is checked, once
            assert discovery.calls == calls + 1
            assert b.mounts[-1].previous_epoch == 100 and loop.clock.epoch == 200
        finally:
            await server_a.stop(None)
            await server_b.stop(None)

    run_loop(URL, body, discovery)


def test_old_epoch_grants_refused_after_remount_on_a_new_leader() -> None:
    """After the node mounted on the new leader, a write grant and a read grant signed by the
    old leader (older epoch) are refused; the new leader's are served."""
    discovery = FakeDiscovery()
    index, clock = ObjectIndex(), MasterClock()
    segment = Segment.in_memory(11, 1 << 20)
    access = NodeAccess({11: segment}, index, SECRET, clock)

    def grant(op: int, epoch: int, alloc: int, offset: int) -> RequestHeader:
        g = sign(SECRET, op=op, segment_id=11, offset=offset, length=10, alloc_id=alloc,
                 epoch=epoch, expiry_ms=clock.now_ms() + 30_000, tag=key_tag("default", "k"))
        return RequestHeader(g.op, 1, 11, offset, 10, grant=g)

    meta = WriteMeta(7, 10, "default", "k")

    async def body(loop: ControlLoop) -> None:
        a, b = HaMaster(epoch=100), HaMaster(epoch=200)
        server_a, port_a = await start_master(a)
        server_b, port_b = await start_master(b)
        try:
            discovery.record = record("ma", port_a, 100)
            await asyncio.wait_for(loop.first_mount.wait(), 5)
            access.writable(grant(GRANT_OP_WRITE, 100, 1, 0), meta)  # the leader's: served
            access.written(grant(GRANT_OP_WRITE, 100, 1, 0), meta)
            access.readable(grant(GRANT_OP_READ, 100, 1, 0))
            await server_a.stop(None)
            discovery.record = record("mb", port_b, 200)
            await until(lambda: loop.mounted and loop.clock.epoch == 200)
            for request, call in (
                (grant(GRANT_OP_WRITE, 100, 2, 4096), lambda r: access.writable(r, meta)),
                (grant(GRANT_OP_READ, 100, 1, 0), access.readable),
            ):
                with pytest.raises(FrameError) as exc:
                    call(request)
                assert exc.value.status == ST_STALE_EPOCH
            access.readable(grant(GRANT_OP_READ, 200, 1, 0))  # adopted object, new epoch
            access.writable(grant(GRANT_OP_WRITE, 200, (200 << 22) + 1, 8192), meta)
        finally:
            await server_a.stop(None)
            await server_b.stop(None)

    # master_timeout_s is 1 s and the fake master's clock runs 5 s ahead: grants above use
    # the node's estimate of it, so they are issued after the mount (write floor)
    run_loop(URL, body, discovery, index=index, clock=clock)


def test_the_one_redirect_reader_reads_grpc_aio_errors() -> None:
    """The node reads a refusal with coord/redirect.py's `leader_from`, as both SDK faces do;
    a redirect only counts when the status is UNAVAILABLE (`coord.link.node_failure`)."""
    def err(code: grpc.StatusCode, details: str,
            trailing: tuple[tuple[str, str], ...] = ()) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing),
                                    details)

    def read(exc: grpc.aio.AioRpcError) -> str:
        return leader_from(exc.trailing_metadata(), exc.details() or "")

    unavailable = grpc.StatusCode.UNAVAILABLE
    details = redirect_details("m2", "standby", "10.0.0.1:7000", 3)
    assert read(err(unavailable, details)) == "10.0.0.1:7000"
    assert read(err(unavailable, "x", ((LEADER_METADATA, "10.0.0.2:1"),))) == "10.0.0.2:1"
    assert read(err(unavailable, redirect_details("m2", "standby", "", 0))) == ""
    assert read(err(unavailable, "connection refused")) == ""
    assert read(err(unavailable, "leader=not-an-address")) == ""
    internal = node_failure(LinkState("m:1"), unavailable=False, unreachable=False,
                            details=details, hint="10.0.0.1:7000", now=1.0)
    assert internal.redirect == "" and not internal.unreachable


def test_config_accepts_etcd_urls_and_names_the_field_of_a_bad_one(tmp_path: Any) -> None:
    def cfg(master: str) -> NodeConfig:
        return NodeConfig(master=master, shm_dir=str(tmp_path), node_id="n1", host_id="h")

    cfg("etcd://127.0.0.1:2379/c1").validate()
    cfg("etcd://127.0.0.1:2379,127.0.0.1:2380/c1").validate()
    cfg("127.0.0.1:50051").validate()
    for bad in ("etcd://127.0.0.1:2379", "etcd:///c1", "etcd://host/c1", "etcd://h:1/bad name",
                "nohost"):
        with pytest.raises(ConfigError) as exc:
            cfg(bad).validate()
        assert exc.value.field == "master", bad
