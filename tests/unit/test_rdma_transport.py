"""RdmaTransport and the node's NodeRdma above a fake verbs layer.

`FakeFabric` stands in for the NIC: memory regions are real buffers found by address, a queue
pair's one-sided READ/WRITE is a memmove checked against the regions' keys, bounds and access
(as the HCA checks them), completions queue up per queue pair, and an RC queue pair that had
an error fails everything after it. Faults are injected per fabric: fail the Nth work request,
drop completions (a hung peer), refuse registrations. The node side is real: a NodeAccess with
grant checks and index, a TcpDataServer for RDMA_CONNECT and COMMIT, NodeRdma on the fake.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE_COMMIT, Grant, key_tag, sign
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.rdma import NodeRdma, attach
from cellar.storage_node.segment import Segment
from cellar.transfer import make_transport, verbs
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    ST_CONNECTION_LOST,
    ST_TIMEOUT,
    SegmentRoute,
    TransferOp,
)
from cellar.transfer.control import ControlCall, ControlChannel
from cellar.transfer.frame import (
    OP_RDMA_CONNECT,
    ST_BAD_GRANT,
    ST_EXPIRED,
    ST_OK,
    ST_OUT_OF_RANGE,
    ST_STALE_EPOCH,
    ST_UNKNOWN_SEGMENT,
    WriteMeta,
)
from cellar.transfer.rdma import (
    MrCache,
    RdmaTransport,
    SegmentKey,
    format_endpoint,
    parse_endpoint,
)
from cellar.transfer.shm import buffer_address
from cellar.transfer.tcp_server import TcpDataServer

SECRET = bytes(range(32))
EPOCH = 2
SEG_ID = 77
SEG_BYTES = 4 << 20


# ---- the fake NIC -------------------------------------------------------------------------

@dataclass
class FakeMr:
    fabric: FakeFabric
    view: memoryview
    addr: int
    length: int
    lkey: int
    rkey: int
    remote: bool
    writable: bool
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        self.fabric.regions.pop(self.lkey, None)


class FakeQp:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        fabric = device.fabric
        fabric.next_qpn += 1
        self.info = verbs.QpInfo(1, device.port, 5, fabric.next_qpn, 42, device.gid)
        fabric.qps[self.info.qpn] = self
        self.peer: FakeQp | None = None
        self.error = False
        self.closed = False
        self.completions: collections.deque[verbs.Completion] = collections.deque()

    def connect(self, remote: verbs.QpInfo) -> None:
        peer = self.device.fabric.qps.get(remote.qpn)
        if peer is None:
            raise verbs.VerbsError(f"no queue pair {remote.qpn}")
        self.peer = peer

    def post(self, wr_id: int, opcode: int, local_addr: int, length: int, lkey: int,
             remote_addr: int, rkey: int) -> None:
        fabric = self.device.fabric
        if self.closed or self.peer is None:
            raise verbs.VerbsError("queue pair not connected")
        fabric.posted += 1
        if fabric.fail_post_at == fabric.posted:
            raise verbs.VerbsError("post_send: ENOMEM")
        if self.error:
            self.completions.append(verbs.Completion(wr_id, False, "flush error"))
            return
        ok, why = True, ""
        local = fabric.regions.get(lkey)
        remote = next((r for r in fabric.regions.values() if r.rkey == rkey and r.remote), None)
        if fabric.fail_wr_at == fabric.posted:
            ok, why = False, "retry exceeded"
        elif local is None or not local.addr <= local_addr <= local_addr + length <= \
                local.addr + local.length:
            ok, why = False, "local protection error"
        elif remote is None or self.peer.closed or not remote.addr <= remote_addr <= \
                remote_addr + length <= remote.addr + remote.length:
            ok, why = False, "remote access error"
        elif opcode == verbs.OPCODE_READ and not local.writable:
            ok, why = False, "local protection error"
        if ok:
            if opcode == verbs.OPCODE_WRITE:
                ctypes.memmove(remote_addr, local_addr, length)
            else:
                ctypes.memmove(local_addr, remote_addr, length)
        else:
            self.error = True
        if not fabric.drop_completions:
            self.completions.append(verbs.Completion(wr_id, ok, why))

    def poll(self, max_n: int, timeout_s: float) -> list[verbs.Completion]:
        if not self.completions:
            time.sleep(min(timeout_s, 0.01))
        out: list[verbs.Completion] = []
        while self.completions and len(out) < max_n:
            out.append(self.completions.popleft())
        return out

    def close(self) -> None:
        self.closed = True


class FakeDevice:
    def __init__(self, fabric: FakeFabric, name: str = "fake0") -> None:
        self.fabric = fabric
        self.name = name
        self.port = 1
        self.gid = bytes(range(16))

    def register(self, buffer: memoryview, *, remote_write: bool) -> verbs.MemoryRegion:
        fabric = self.fabric
        if fabric.refuse_registration:
            raise verbs.VerbsError("reg_mr: ENOMEM")
        fabric.next_key += 1
        mr = FakeMr(fabric, buffer, buffer_address(buffer), len(buffer), fabric.next_key,
                    fabric.next_key + 1000, remote_write, not buffer.readonly)
        fabric.regions[mr.lkey] = mr
        return mr

    def create_qp(self) -> verbs.QueuePair:
        return FakeQp(self)

    def close(self) -> None:
        pass


class FakeFabric:
    def __init__(self) -> None:
        self.regions: dict[int, FakeMr] = {}
        self.qps: dict[int, FakeQp] = {}
        self.next_key = 0
        self.next_qpn = 0
        self.posted = 0
        self.fail_wr_at = 0       # the Nth posted work request completes with an error
        self.fail_post_at = 0     # the Nth post itself fails
        self.drop_completions = False
        self.refuse_registration = False


# ---- a node on the fake NIC ---------------------------------------------------------------

class Node:
    def __init__(self, fabric: FakeFabric) -> None:
        self.segment = Segment.in_memory(SEG_ID, SEG_BYTES)
        clock = MasterClock()
        clock.epoch = EPOCH
        self.access = NodeAccess({SEG_ID: self.segment}, ObjectIndex(allowed_skew_ms=1000),
                                 SECRET, clock)
        rdma = attach([self.segment], self.access, device=FakeDevice(fabric, "node0"))
        assert rdma is not None
        self.rdma = rdma
        self.server = TcpDataServer(self.access, "127.0.0.1", 0)
        self.server.start()
        address, _extra = self.rdma.endpoints()[SEG_ID]
        self.route = SegmentRoute(SEG_ID, "n1", "h", {"tcp": self.server.address,
                                                      "rdma": address})

    def close(self) -> None:
        self.server.stop()
        self.rdma.close()


@pytest.fixture
def fabric() -> FakeFabric:
    return FakeFabric()


@pytest.fixture
def node(fabric: FakeFabric) -> Iterator[Node]:
    n = Node(fabric)
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def rdma(fabric: FakeFabric) -> Iterator[RdmaTransport]:
    t = RdmaTransport(device=FakeDevice(fabric, "client0"), chunk_bytes=64 << 10,
                      max_outstanding=4)
    try:
        yield t
    finally:
        t.close()


_alloc = [0]


def grant(op: int, offset: int, length: int, *, key: str = "k",
          secret: bytes = SECRET) -> Grant:
    _alloc[0] += 1
    return sign(secret, op=op, segment_id=SEG_ID, offset=offset, length=length,
                alloc_id=_alloc[0], epoch=EPOCH, expiry_ms=wall_ms() + 60_000,
                tag=key_tag("t", key))


def wop(node: Node, offset: int, data: bytes | bytearray | memoryview, *, key: str = "k",
        g: Grant | None = None) -> TransferOp:
    g = g or grant(GRANT_OP_WRITE_COMMIT, offset, len(data), key=key)
    return TransferOp(node.route, g, offset, memoryview(data), WriteMeta(1, len(data), "t", key))


def rop(node: Node, offset: int, out: bytearray | memoryview) -> TransferOp:
    return TransferOp(node.route, grant(GRANT_OP_READ, offset, len(out)), offset, memoryview(out))


# ---- tests --------------------------------------------------------------------------------

def test_no_device_here_is_a_clear_error() -> None:
    if verbs.list_devices():
        pytest.skip("this machine has an RDMA device")
    with pytest.raises(verbs.RdmaUnavailable):
        make_transport("rdma")


def test_endpoint_round_trip_and_bad_ones() -> None:
    key = SegmentKey(rkey=7, base=0x7F00_0000_1000, size=1 << 30, file_dev=3, file_ino=99)
    address, extra = format_endpoint("mlx5_0", 1, bytes(range(16)), key)
    assert extra == key.pack()
    assert parse_endpoint(address) == ("mlx5_0", key)
    for bad in ("", "mlx5_0/1/00", "mlx5_0/x/00/" + extra.hex(), "a/1/00/abcd"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def test_node_registers_segments_and_advertises_keys(node: Node, fabric: FakeFabric) -> None:
    key = node.rdma.keys[SEG_ID]
    region = next(r for r in fabric.regions.values() if r.rkey == key.rkey)
    assert region.remote and region.length == SEG_BYTES
    assert key.base == buffer_address(node.segment.memory)
    assert parse_endpoint(node.route.endpoints["rdma"])[1] == key


def test_write_commit_read_round_trip_chunked(node: Node, rdma: RdmaTransport) -> None:
    data = os.urandom(300_000)  # 5 chunks of 64 KiB, window of 4
    op = wop(node, 8192, data)
    assert [r.ok for r in rdma.write([op], 5.0)] == [True]
    assert bytes(node.segment.view(8192, len(data))) == data
    entry = node.access.index.get(op.grant.alloc_id)
    assert entry is not None and entry.state.value == "sealed"
    out = bytearray(len(data))
    assert rdma.read([rop(node, 8192, out)], 5.0)[0].ok and out == data
    assert rdma.stats["chunks"] == 10 and rdma.stats["connects"] == 1
    assert node.rdma.queue_pairs == 1
    assert node.server.stats.snapshot()["requests"]["commit"] == 1


def test_parts_write_commit_read_round_trip(node: Node, rdma: RdmaTransport) -> None:
    parts = [os.urandom(n) for n in (3, 0, 100_000, 70_000)]
    data = b"".join(parts)
    g = grant(GRANT_OP_WRITE_COMMIT, 4096, len(data))
    op = TransferOp(node.route, g, 4096, parts=tuple(memoryview(p) for p in parts),
                    meta=WriteMeta(1, len(data), "t", "k"))
    assert [r.ok for r in rdma.write([op], 5.0)] == [True]
    assert bytes(node.segment.view(4096, len(data))) == data
    entry = node.access.index.get(g.alloc_id)
    assert entry is not None and entry.state.value == "sealed" and entry.length == len(data)
    outs = [bytearray(10), bytearray(len(data) - 10)]
    read = TransferOp(node.route, grant(GRANT_OP_READ, 4096, len(data)), 4096,
                      parts=tuple(memoryview(o) for o in outs))
    assert rdma.read([read], 5.0)[0].ok and b"".join(outs) == data


def test_batch_in_order_with_per_op_failures(node: Node, rdma: RdmaTransport) -> None:
    blobs = [os.urandom(n) for n in (1, 70_000, 5000, 4096)]
    offsets = [0, 4096, 81920, 90112]
    ops = [wop(node, off, b, key=f"k{i}") for i, (off, b) in
           enumerate(zip(offsets, blobs, strict=True))]
    ops[1] = wop(node, offsets[1], blobs[1], key="k1",
                 g=grant(GRANT_OP_WRITE_COMMIT, offsets[1], 10, key="k1"))  # range outside the grant
    ops[2] = wop(node, offsets[2], blobs[2], key="k2",
                 g=grant(GRANT_OP_WRITE_COMMIT, offsets[2], 5000, key="k2", secret=b"f" * 32))  # forged
    posted_before = rdma.stats["chunks"]
    results = rdma.write(ops, 5.0)
    assert [r.status for r in results[:3]] == [0, ST_OUT_OF_RANGE, ST_BAD_GRANT]
    assert results[3].ok
    assert rdma.stats["chunks"] - posted_before == 3  # nothing posted for the out-of-range op
    assert rdma.stats["commits_refused"] == 1
    # flagged for a claim (the master's Replica.claim), the forged op is refused before any
    # byte is posted: the node refused its CLAIM (shm_commits.WritePlan)
    claimed = [dataclasses.replace(op, claim=True) for op in ops]
    posted_before = rdma.stats["chunks"]
    refused = rdma.write(claimed[1:3], 5.0)
    assert [r.status for r in refused] == [ST_OUT_OF_RANGE, ST_BAD_GRANT]
    assert rdma.stats["chunks"] - posted_before == 0
    assert (rdma.stats["claims_refused"], rdma.stats["commits_refused"]) == (1, 1)
    assert node.access.index.get(ops[2].grant.alloc_id) is None
    again = rdma.write([TransferOp(ops[0].route, ops[0].grant, 0, memoryview(blobs[0]),
                                   ops[0].meta)], 5.0)
    # the same write again (its reply lost): the node resends the receipt (issue 19)
    assert again[0].ok and again[0].receipt == results[0].receipt


def test_mr_cache_registers_a_buffer_once(node: Node, rdma: RdmaTransport) -> None:
    import mmap

    buf = memoryview(mmap.mmap(-1, 1 << 20))  # like cellar.alloc_buffer
    buf[:] = os.urandom(1 << 20)
    for i in range(3):
        assert rdma.write([wop(node, i * (1 << 20), buf)], 5.0)[0].ok
    assert rdma.read([rop(node, 0, buf[4096:8192])], 5.0)[0].ok  # a slice: same region
    assert rdma._mrs.registrations == 1 and rdma._mrs.hits == 3


def test_mr_cache_bounded_lru(fabric: FakeFabric) -> None:
    cache = MrCache(FakeDevice(fabric), max_regions=2, max_bytes=1 << 30)
    bufs = [bytearray(100) for _ in range(3)]
    regions = [cache.lookup(memoryview(b), writable=True)[0] for b in bufs]
    assert all(isinstance(r, FakeMr) for r in regions)
    fakes = [r for r in regions if isinstance(r, FakeMr)]
    assert len(cache) == 2 and fakes[0].closed and not fakes[1].closed
    cache.lookup(memoryview(bufs[1]), writable=True)
    assert cache.registrations == 3 and cache.hits == 1
    ro = memoryview(b"read only source")
    cache.lookup(ro, writable=False)
    cache.close()
    assert len(cache) == 0 and all(r.closed for r in fakes)


def test_failed_completion_fails_its_op_breaks_the_qp_and_retry_reconnects(
        node: Node, rdma: RdmaTransport, fabric: FakeFabric) -> None:
    a, b = os.urandom(200_000), os.urandom(1000)  # a: 4 chunks
    fabric.fail_wr_at = fabric.posted + 2
    results = rdma.write([wop(node, 0, a, key="a"), wop(node, 262144, b, key="b")], 5.0)
    assert results[0].status == ST_CONNECTION_LOST
    assert results[1].status == ST_CONNECTION_LOST  # queued behind the error on the same QP
    assert rdma.stats["broken_qps"] == 1
    fabric.fail_wr_at = 0
    retry = rdma.write([wop(node, 0, a, key="a2"), wop(node, 262144, b, key="b2")], 5.0)
    assert [r.ok for r in retry] == [True, True] and rdma.stats["connects"] == 2
    assert bytes(node.segment.view(0, len(a))) == a


def test_lost_completions_time_out(node: Node, rdma: RdmaTransport,
                                   fabric: FakeFabric) -> None:
    fabric.drop_completions = True
    res = rdma.read([rop(node, 0, bytearray(1000))], 0.2)
    assert res[0].status == ST_TIMEOUT  # the outcome; how long it took is no assertion
    fabric.drop_completions = False
    assert rdma.read([rop(node, 0, bytearray(1000))], 5.0)[0].ok  # a new queue pair
    assert rdma.stats["connects"] == 2


def test_post_failure_and_registration_failure(node: Node, rdma: RdmaTransport,
                                               fabric: FakeFabric) -> None:
    fabric.fail_post_at = fabric.posted + 1
    assert rdma.read([rop(node, 0, bytearray(10))], 5.0)[0].status == ST_CONNECTION_LOST
    fabric.refuse_registration = True
    res = rdma.read([rop(node, 0, bytearray(10))], 5.0)
    assert not res[0].ok and "register" in res[0].message


def test_unreachable_node_and_routes(fabric: FakeFabric, rdma: RdmaTransport) -> None:
    key = SegmentKey(1, 4096, 1 << 20)
    address, _ = format_endpoint("x", 1, bytes(16), key)
    dead = SegmentRoute(SEG_ID, "gone", "h", {"tcp": "127.0.0.1:1", "rdma": address})
    assert rdma.can_reach(dead)
    assert not rdma.can_reach(SegmentRoute(SEG_ID, "n", "h", {"tcp": "127.0.0.1:1"}))
    assert not rdma.can_reach(SegmentRoute(SEG_ID, "n", "h", {"rdma": address}))
    g = grant(GRANT_OP_READ, 0, 10)
    assert rdma.read([TransferOp(dead, g, 0, memoryview(bytearray(10)))],
                     2.0)[0].status == ST_CONNECT_FAILED


def test_node_bounds_its_queue_pairs(fabric: FakeFabric) -> None:
    seg = Segment.in_memory(5, 1 << 16)
    node = NodeRdma(FakeDevice(fabric), [seg], max_queue_pairs=2)
    client = FakeDevice(fabric, "c")
    qps = [client.create_qp() for _ in range(3)]
    infos = [verbs.QpInfo.unpack(node.accept(qp.info.pack())) for qp in qps]
    assert node.queue_pairs == 2 and fabric.qps[infos[0].qpn].closed
    with pytest.raises(Exception, match="queue-pair info"):
        node.accept(b"short")
    node.close()
    assert not any(r.rkey == node.keys[5].rkey for r in fabric.regions.values())


def test_attach_wires_access_and_control(fabric: FakeFabric) -> None:
    import types

    seg = Segment.in_memory(9, 1 << 16)
    access = types.SimpleNamespace(rdma_acceptor=None)
    control = types.SimpleNamespace()
    node = attach([seg], access, control, device=FakeDevice(fabric))
    assert node is not None and access.rdma_acceptor == node.accept
    [ep] = control.extra_endpoints[9]
    assert ep.transport == "rdma" and ep.extra == node.keys[9].pack()
    assert parse_endpoint(ep.address) == ("fake0", node.keys[9])
    node.close()


def test_attach_without_a_device_is_off() -> None:
    if verbs.list_devices():
        pytest.skip("this machine has an RDMA device")
    assert attach([Segment.in_memory(9, 1 << 16)], object()) is None


def _connect(node: Node, fabric: FakeFabric, g: Grant | None, *, segment_id: int = SEG_ID,
             offset: int = 0, length: int = 4096) -> int:
    """The status of one raw RDMA_CONNECT to `node` under `g` (None: no grant at all)."""
    channel = ControlChannel()
    try:
        info = FakeDevice(fabric, "stranger").create_qp().info.pack()
        call = ControlCall(OP_RDMA_CONNECT, g, segment_id, offset, length, info)
        return channel.call({node.server.address: [call]}, 5.0)[node.server.address][0].status
    finally:
        channel.close()


def test_a_peer_without_a_grant_of_the_node_gets_no_queue_pair(node: Node,
                                                                fabric: FakeFabric) -> None:
    def signed(op: int, **over: int) -> Grant:
        fields = dict(op=op, segment_id=SEG_ID, offset=0, length=4096, alloc_id=9_999,
                      epoch=EPOCH, expiry_ms=wall_ms() + 60_000, tag=key_tag("t", "k"))
        fields.update(over)
        return sign(SECRET, **fields)  # type: ignore[arg-type]

    refused = {
        "no grant": (_connect(node, fabric, None), ST_BAD_GRANT),
        "forged": (_connect(node, fabric, sign(b"f" * 32, op=GRANT_OP_WRITE_COMMIT,
                                               segment_id=SEG_ID, offset=0, length=4096,
                                               alloc_id=1, epoch=EPOCH,
                                               expiry_ms=wall_ms() + 60_000,
                                               tag=key_tag("t", "k"))), ST_BAD_GRANT),
        "expired": (_connect(node, fabric, signed(GRANT_OP_READ,
                                                  expiry_ms=wall_ms() - 60_000)), ST_EXPIRED),
        "older master": (_connect(node, fabric, signed(GRANT_OP_READ, epoch=EPOCH - 1)),
                         ST_STALE_EPOCH),
        "past its grant": (_connect(node, fabric, signed(GRANT_OP_READ), length=8192),
                           ST_OUT_OF_RANGE),
        "another segment": (_connect(node, fabric, signed(GRANT_OP_READ, segment_id=5),
                                     segment_id=5), ST_UNKNOWN_SEGMENT),
    }
    assert {why: got for why, (got, _) in refused.items()} == \
        {why: want for why, (_, want) in refused.items()}
    assert node.rdma.queue_pairs == 0  # not one queue pair for any of them
    assert node.server.stats.snapshot()["requests"]["rdma_connect"] == len(refused)
    # a write grant (with the COMMIT right) and a read grant (the READ_GRANT flag) both open one
    assert _connect(node, fabric, signed(GRANT_OP_WRITE_COMMIT)) == ST_OK
    assert _connect(node, fabric, signed(GRANT_OP_READ)) == ST_OK
    assert node.rdma.queue_pairs == 2


def test_a_batch_connects_under_the_next_grant_when_the_first_is_refused(
        node: Node, rdma: RdmaTransport) -> None:
    forged_data, data = os.urandom(5000), os.urandom(7000)
    forged = wop(node, 0, forged_data, key="f",
                 g=grant(GRANT_OP_WRITE_COMMIT, 0, 5000, key="f", secret=b"f" * 32))
    results = rdma.write([forged, wop(node, 8192, data, key="g")], 5.0)
    assert [r.status for r in results] == [ST_BAD_GRANT, ST_OK]
    assert rdma.stats["connects"] == 1 and node.rdma.queue_pairs == 1
    assert bytes(node.segment.view(8192, len(data))) == data
