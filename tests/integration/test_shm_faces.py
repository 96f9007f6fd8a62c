"""shm with scatter-gather, its deadline, and its asyncio face, against a storage node's real
segment file, `NodeAccess` (grant checks, index) and `TcpDataServer` (COMMITs) in this process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from xxhash import xxh3_64_intdigest

from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE_COMMIT, key_tag, sign
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer import make_async_transport, open_async_transports
from cellar.transfer.base import ST_TIMEOUT, SegmentRoute, TransferOp, local_host_id
from cellar.transfer.frame import ST_BAD_GRANT, WriteMeta
from cellar.transfer.shm import ShmTransport
from cellar.transfer.tcp_server import TcpDataServer

SECRET = bytes(range(32))
SEGMENT_BYTES = 32 << 20


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Segment, NodeAccess, SegmentRoute]]:
    segment = Segment.create(tmp_path, "faces", 0, SEGMENT_BYTES)
    access = NodeAccess({segment.segment_id: segment}, ObjectIndex(), SECRET, MasterClock())
    server = TcpDataServer(access, "127.0.0.1", 0)
    server.start()
    route = SegmentRoute(segment.segment_id, "faces", local_host_id(),
                         {"tcp": f"127.0.0.1:{server.port}", "shm": str(segment.path)})
    try:
        yield segment, access, route
    finally:
        server.stop()
        segment.close(unlink=True)


def _write(route: SegmentRoute, offset: int, parts: list[bytes], key: str, alloc: int,
           secret: bytes = SECRET) -> TransferOp:
    n = sum(len(p) for p in parts)
    g = sign(secret, op=GRANT_OP_WRITE_COMMIT, segment_id=route.segment_id, offset=offset, length=n,
             alloc_id=alloc, epoch=0, expiry_ms=wall_ms() + 60_000, tag=key_tag("t", key))
    return TransferOp(route, g, offset, parts=tuple(memoryview(p) for p in parts),
                      meta=WriteMeta(xxh3_64_intdigest(b"".join(parts)), n, "t", key))


def _read(route: SegmentRoute, offset: int, parts: list[bytearray], key: str) -> TransferOp:
    n = sum(len(p) for p in parts)
    g = sign(SECRET, op=GRANT_OP_READ, segment_id=route.segment_id, offset=offset, length=n,
             alloc_id=0, epoch=0, expiry_ms=wall_ms() + 60_000, tag=key_tag("t", key))
    return TransferOp(route, g, offset, parts=tuple(memoryview(p) for p in parts),
                      want_checksum=True)


def test_sync_shm_parts_write_commit_and_read(node: tuple[Segment, NodeAccess,
                                                          SegmentRoute]) -> None:
    segment, access, route = node
    parts = [os.urandom(n) for n in (10, 0, 70_000, 5 << 20, 3)]
    data = b"".join(parts)
    shm = ShmTransport()
    try:
        res = shm.write([_write(route, 4096, parts, "k", 21)], 10)
        assert res[0].ok, res[0]
        assert bytes(segment.view(4096, len(data))) == data
        entry = access.index.get(21)
        assert entry is not None and entry.state.value == "sealed"
        dst = [bytearray(n) for n in (1, 4 << 20, len(data) - (4 << 20) - 1)]
        got = shm.read([_read(route, 4096, dst, "k")], 10)
        assert got[0].ok and b"".join(dst) == data
        assert got[0].checksum == xxh3_64_intdigest(data)
    finally:
        shm.close()


def test_a_batch_commits_in_groups_while_it_copies(
        node: tuple[Segment, NodeAccess, SegmentRoute], monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's COMMITs go EARLY_COMMIT_BYTES of copied ops at a time while the rest is still
    being copied (transfer/shm_commits.py `EarlyCommits`), and each reply lands on its own op: the
    first group is sent before the last op's bytes are in the segment; an op under a forged
    grant in the middle fails alone; ops that left their checksum to the copy commit the
    digest of what was copied; every other op is sealed with its receipt."""
    from cellar.transfer import control, shm_commits

    segment, access, route = node
    monkeypatch.setattr(shm_commits, "EARLY_COMMIT_BYTES", 2 << 20)
    size, count, forged = 1 << 20, 8, 3
    values = [os.urandom(size) for _ in range(count)]
    ops = [_write(route, i * size, [v], f"k{i}", 100 + i,
                  secret=bytes(32) if i == forged else SECRET) for i, v in enumerate(values)]
    for op in ops[::2]:  # these leave their checksum to the copy
        op.want_checksum = True
        op.meta = WriteMeta(0, size, "t", op.meta.key)  # type: ignore[union-attr]
    last = segment.view((count - 1) * size, size)
    sends: list[tuple[int, bool]] = []  # (frames in the group, the last op's bytes landed)
    real_send = control.ControlStream.send

    def recorded_send(self: control.ControlStream, calls: dict) -> None:  # type: ignore[type-arg]
        sends.append((sum(len(c) for c in calls.values()), bytes(last) == values[-1]))
        real_send(self, calls)

    monkeypatch.setattr(control.ControlStream, "send", recorded_send)
    # every copy and hash on the calling thread: which group goes when is then deterministic
    # (with the hashing on the helper, tests/unit/test_memcopy.py)
    shm = ShmTransport(parallel_min_bytes=1 << 40)
    try:
        results = shm.write(ops, 10)
    finally:
        shm.close()
    assert len(sends) >= 3 and sum(n for n, _ in sends) == count
    assert shm.stats["early_commit_groups"] == len(sends) - 1  # all but the rest after the copy
    assert sends[0] == (2, False)  # two ops' commits went while the last was not copied yet
    for i, (result, value) in enumerate(zip(results, values, strict=True)):
        entry = access.index.get(100 + i)
        if i == forged:
            assert result.status == ST_BAD_GRANT and entry is None
            continue
        assert result.ok and result.receipt, (i, result)
        assert entry is not None and entry.state.value == "sealed"
        assert entry.checksum == xxh3_64_intdigest(value)
        assert bytes(segment.view(i * size, size)) == value


def test_shm_zero_budget_touches_nothing_and_commits_nothing(
        node: tuple[Segment, NodeAccess, SegmentRoute]) -> None:
    segment, access, route = node
    shm = ShmTransport()
    try:
        res = shm.write([_write(route, 0, [b"x" * 1000], "z", 31)], 0)
        assert res[0].status == ST_TIMEOUT
        assert access.index.get(31) is None  # never committed
        assert bytes(segment.view(0, 1000)) == bytes(1000)
        dst = [bytearray(b"\xa5" * 100)]
        assert shm.read([_read(route, 0, dst, "z")], 0)[0].status == ST_TIMEOUT
        assert dst == [bytearray(b"\xa5" * 100)]
    finally:
        shm.close()


def test_async_shm_parts_roundtrip_commit_on_the_loop_and_refusal(
        node: tuple[Segment, NodeAccess, SegmentRoute]) -> None:
    segment, access, route = node

    async def main() -> None:
        shm = make_async_transport("shm")
        try:
            assert shm.can_reach(route)
            parts = [os.urandom(n) for n in (5, 65_536, 1)]
            data = b"".join(parts)
            forged = _write(route, 1 << 20, [b"f" * 64], "f", 42, secret=os.urandom(32))
            res = await shm.write([_write(route, 0, parts, "a", 41), forged], 10)
            assert res[0].ok and res[1].status == ST_BAD_GRANT
            assert access.index.get(41) is not None and access.index.get(42) is None
            dst = [bytearray(7), bytearray(len(data) - 7)]
            got = await shm.read([_read(route, 0, dst, "a")], 10)
            assert got[0].ok and b"".join(dst) == data
            assert got[0].checksum == xxh3_64_intdigest(data)
        finally:
            await shm.aclose()

    asyncio.run(main())


def test_auto_opens_shm_then_tcp_for_the_loop() -> None:
    assert [t.name for t in open_async_transports("auto")] == ["shm", "tcp"]
