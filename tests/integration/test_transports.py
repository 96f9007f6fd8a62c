"""The data-plane correctness suite, run over every transport this machine has.

Parametrised over "tcp" and "shm" (and "rdma" where `ibv_devices` lists a device; see also
test_rdma_device.py): real clusters (`make_cluster` / `module_cluster`: master and nodes as
subprocesses on 127.0.0.1) and a client forced onto one transport with
`cellar.connect(..., transport=name)`. Checked for each:
- exact bytes for sizes from 1 B to 32 MiB, including objects cut into several frames and
  striped over connections (tcp: 4 MiB frames; shm: the two-thread copy);
- batches come back in input order with per-key results (misses included);
- a connection broken mid-transfer fails that item cleanly and the retry succeeds (in process:
  a node's real NodeAccess and TcpDataServer behind a cutting proxy; for shm the cut hits the
  COMMIT connection);
- shm only: a node that restarted (same node id, new process, new segment file) has its mapping
  dropped and remapped, and reads return the new bytes; a COMMIT under a forged or expired
  grant is refused and the op fails; "auto" picks shm for same-host nodes (counted by the
  transports and by the node's data server, not by timing).
"""

from __future__ import annotations

import mmap
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto.grant import GRANT_OP_WRITE_COMMIT, key_tag, sign
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer import make_transport, verbs
from cellar.transfer.base import ST_CONNECTION_LOST, ST_TIMEOUT, SegmentRoute, TransferOp
from cellar.transfer.frame import ST_BAD_GRANT, ST_EXPIRED, WriteMeta
from cellar.transfer.tcp_server import TcpDataServer
from tests.integration.cut_proxy import CutProxy

TRANSPORTS = ["tcp", "shm"] + (["rdma"] if verbs.list_devices() else [])
SIZES = [1, 4095, 4096, 65537, (1 << 20) + 3, 4 << 20, (9 << 20) + 1, 32 << 20]


def _transport(client: cellar.Client, name: str) -> Any:
    return next(t for t in client._transports.transports if t.name == name)


@pytest.fixture(scope="module")
def cluster(module_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    return module_cluster(nodes=2, segment_size="160MiB")


@pytest.mark.parametrize("name", TRANSPORTS)
def test_exact_bytes_every_size(cluster: LocalCluster, connect_to: Callable[..., cellar.Client],
                                name: str) -> None:
    client = connect_to(cluster, transport=name)
    values = {f"{name}/size/{n}": os.urandom(n) for n in SIZES}
    for key, value in values.items():
        client.put(key, value, replicas=2 if len(value) < (1 << 20) else 1)
    for key, value in values.items():
        assert client.get(key) == value
        buf = cellar.alloc_buffer(len(value))
        assert client.get_into(key, buf) == len(value) and bytes(buf[:len(value)]) == value
    # zero-copy batch into misaligned buffers (bytearray) and page-aligned ones
    keys = list(values)
    outs: list[Any] = [bytearray(len(v)) if i % 2 else cellar.alloc_buffer(len(v))
                       for i, v in enumerate(values.values())]
    assert client.get_many_into(keys, outs) == [len(v) for v in values.values()]
    for out, value in zip(outs, values.values(), strict=True):
        assert bytes(out[:len(value)]) == value
    stats = getattr(_transport(client, name), "stats", None)
    if stats is not None:  # shm/rdma count what they moved: nothing went by tcp
        assert stats["writes"] >= len(SIZES) and stats["reads"] >= 3 * len(SIZES)
    client.remove_prefix(f"{name}/size/")


@pytest.mark.parametrize("name", TRANSPORTS)
def test_batches_in_input_order_with_per_key_results(
        cluster: LocalCluster, connect_to: Callable[..., cellar.Client], name: str) -> None:
    client = connect_to(cluster, transport=name)
    items = [(f"{name}/batch/{i}", os.urandom(1 + (i * 7919) % 300_000)) for i in range(40)]
    assert all(s == cellar.Status.OK for s in client.put_many(items))
    statuses = client.put_many(items[:3] + [(f"{name}/batch/new", b"n")])
    assert statuses[:3] == [cellar.Status.ALREADY_EXISTS] * 3
    assert statuses[3] == cellar.Status.OK
    asked = [k for k, _ in reversed(items)]
    asked.insert(5, f"{name}/batch/missing")
    got = client.get_many(asked)
    expect = dict(items)
    assert got[5] is None
    assert [g for i, g in enumerate(got) if i != 5] == [expect[k] for k in asked if k in expect]
    client.remove_prefix(f"{name}/batch/")


def test_auto_picks_shm_for_same_host_nodes(cluster: LocalCluster,
                                            connect_to: Callable[..., cellar.Client]) -> None:
    client = connect_to(cluster)  # transport="auto"
    names = [t.name for t in client._transports.transports]
    assert names[0] == "shm" and names[-1] == "tcp"
    shm = _transport(client, "shm")
    before = dict(shm.stats)
    client.put_many({f"auto/{i}": os.urandom(70_000) for i in range(8)}, replicas=2)
    assert len(client.get_many([f"auto/{i}" for i in range(8)])) == 8
    assert shm.stats["writes"] - before["writes"] == 16  # 8 keys x 2 replicas, all by shm
    assert shm.stats["reads"] - before["reads"] == 8
    status = client.status()
    assert {n["host_id"] for n in status["nodes"]} == {shm.host_id}
    forced = connect_to(cluster, transport="tcp")
    assert [t.name for t in forced._transports.transports] == ["tcp"]
    assert forced.get("auto/0") is not None
    client.remove_prefix("auto/")


def test_rdma_without_a_device_is_refused_clearly(cluster: LocalCluster) -> None:
    if verbs.list_devices():
        pytest.skip("this machine has an RDMA device")
    with pytest.raises(cellar.InvalidArgument, match="rdma"):
        cellar.connect(cluster.address, transport="rdma")


def _route_of(client: cellar.Client) -> SegmentRoute:
    seg = client.status()["segments"][0]
    return SegmentRoute(seg["segment_id"], seg["node_id"], seg["host_id"], seg["endpoints"])


def test_shm_commit_with_forged_or_expired_grant_is_refused(
        cluster: LocalCluster, connect_to: Callable[..., cellar.Client]) -> None:
    client = connect_to(cluster, transport="shm")
    route = _route_of(client)
    secret = bytes.fromhex(cluster.secret)
    offset = 150 << 20  # far from anything the tests above placed
    status = client.status()
    epoch = status["epoch"]

    def op(secret_: bytes, expiry_ms: int, key: str) -> TransferOp:
        g = sign(secret_, op=GRANT_OP_WRITE_COMMIT, segment_id=route.segment_id, offset=offset,
                 length=4096, alloc_id=(1 << 62) + len(key), epoch=epoch, expiry_ms=expiry_ms,
                 tag=key_tag("default", key))
        return TransferOp(route, g, offset, memoryview(b"f" * 4096),
                          WriteMeta(1, 4096, "default", key))

    shm = make_transport("shm")
    try:
        res = shm.write([op(os.urandom(32), wall_ms() + 60_000, "forged"),
                         op(secret, wall_ms() - 120_000, "expired")], 10.0)
    finally:
        shm.close()
    assert [r.status for r in res] == [ST_BAD_GRANT, ST_EXPIRED]


def test_shm_mapping_of_restarted_node_is_remapped(
        make_cluster: Callable[..., LocalCluster],
        connect_to: Callable[..., cellar.Client]) -> None:
    cluster = make_cluster(nodes=1, segment_size="32MiB")
    client = connect_to(cluster, transport="shm", timeout_s=20)
    shm = _transport(client, "shm")
    first = os.urandom(3 << 20)
    client.put("restart/a", first)
    assert client.get("restart/a") == first
    path = _route_of(client).endpoints["shm"]
    inode = os.stat(path).st_ino
    assert shm.stats["maps"] == 1
    cluster.kill_node(0, signal.SIGTERM)  # a clean stop unlinks the segment file
    cluster.add_node(node_id="node-0")    # same node id, same path, a new file
    assert os.stat(path).st_ino != inode
    second = os.urandom(3 << 20)
    deadline = time.monotonic() + 15
    while True:  # until the master has the restarted node's segment again
        try:
            client.upsert("restart/a", second)
            break
        except (cellar.NoSpace, cellar.Unavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert client.get("restart/a") == second
    assert shm.stats["remaps"] == 1 and shm.stats["maps"] == 2
    with open(path, "rb") as f:  # the bytes are in the new file, not the orphaned old one
        data = f.read()
    assert second in data


# ---- broken connections, in process ------------------------------------------------------

SECRET = bytes(range(32))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Segment, NodeAccess, TcpDataServer, CutProxy]]:
    segment = Segment.create(tmp_path, "cut", 0, 16 << 20)
    clock = MasterClock()
    access = NodeAccess({segment.segment_id: segment}, ObjectIndex(), SECRET, clock)
    server = TcpDataServer(access, "127.0.0.1", 0)
    server.start()
    proxy = CutProxy(("127.0.0.1", server.port))
    try:
        yield segment, access, server, proxy
    finally:
        proxy.close()
        server.stop()
        segment.close(unlink=True)


@pytest.mark.parametrize("name", [n for n in TRANSPORTS if n != "rdma"])
def test_connection_broken_mid_transfer_fails_that_item_and_retry_succeeds(
        node: tuple[Segment, NodeAccess, TcpDataServer, CutProxy], name: str) -> None:
    segment, access, _server, proxy = node
    route = SegmentRoute(segment.segment_id, "cut", cellar_host_id(),
                         {"tcp": f"127.0.0.1:{proxy.port}", "shm": str(segment.path)})
    size = 2 << 20
    data = [os.urandom(size) for _ in range(2)]
    alloc = {"a": 11, "b": 12}

    def op(i: int, key: str) -> TransferOp:
        g = sign(SECRET, op=GRANT_OP_WRITE_COMMIT, segment_id=segment.segment_id, offset=i * size,
                 length=size, alloc_id=alloc[key], epoch=0,
                 expiry_ms=wall_ms() + 60_000, tag=key_tag("t", key))
        return TransferOp(route, g, i * size, memoryview(data[i]), WriteMeta(1, size, "t", key))

    options: dict[str, Any] = {"connections_per_node": 1} if name == "tcp" else {}
    transport = make_transport(name, **options)
    try:
        # tcp: the cut falls inside the first op's payload; shm: inside the first COMMIT frame
        proxy.arm("up", size // 2 if name == "tcp" else 40)
        res = transport.write([op(0, "a"), op(1, "b")], 10.0)
        assert proxy.cuts == 1
        assert res[0].status in (ST_CONNECTION_LOST, ST_TIMEOUT)
        first = access.index.get(alloc["a"])
        assert first is None or first.state.value != "sealed"  # never recorded as written
        retry = transport.write([op(0, "a")] + ([op(1, "b")] if not res[1].ok else []), 10.0)
        assert all(r.ok for r in retry)
        for i in range(2):
            assert bytes(segment.view(i * size, size)) == data[i]
            entry = access.index.get(alloc["ab"[i]])
            assert entry is not None and entry.state.value == "sealed"
    finally:
        transport.close()


def cellar_host_id() -> str:
    from cellar.transfer.shm import local_host_id

    return local_host_id()


def test_tcp_multi_frame_read_of_corrupt_bytes_is_refused(
        make_cluster: Callable[..., LocalCluster],
        connect_to: Callable[..., cellar.Client]) -> None:
    """A value of three 4 MiB frames, read over tcp on one lane, is hashed as its frames land
    (transfer/tcp.py `_read_span_frame`); a byte flipped in its middle frame on the node must
    fail the get (IntegrityError), whatever the transport hashed, never return the bytes."""
    cluster = make_cluster(nodes=1, segment_size="64MiB")
    client = connect_to(cluster, transport="tcp")
    value = os.urandom((9 << 20) + 1)
    client.put("span/corrupt", value)
    assert client.get("span/corrupt") == value  # read intact first: the lane's digest matches
    [segment_file] = Path(cluster.shm_dir).glob("*.seg")
    with open(segment_file, "r+b") as f, mmap.mmap(f.fileno(), 0) as mapped:
        at = mapped.find(value[:4096])
        assert at >= 0
        flip = at + (5 << 20) + 17  # inside the second 4 MiB frame
        mapped[flip] ^= 0xFF
    with pytest.raises(cellar.IntegrityError):
        client.get("span/corrupt")
    out = bytearray(len(value))
    with pytest.raises(cellar.IntegrityError):
        client.get_into("span/corrupt", out)
