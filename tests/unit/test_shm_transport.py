"""ShmTransport in one process: the mapping cache, remap detection, COMMIT against a real
NodeAccess behind a TcpDataServer, and the checks made before any byte is copied.

The "node" here is a file-backed `Segment` in a temporary directory, a real `NodeAccess` (grant
checks, index) and a real `TcpDataServer` for the COMMIT frames; the client maps the same file.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE_COMMIT, Grant, key_tag, sign
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.config import default_host_id
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer import make_transport
from cellar.transfer.base import ST_CONNECT_FAILED, SegmentRoute, TransferOp
from cellar.transfer.frame import (
    ST_BAD_GRANT,
    ST_EXPIRED,
    ST_OUT_OF_RANGE,
    ST_SEALED,
    ST_UNKNOWN_SEGMENT,
    ST_UNSUPPORTED,
    WriteMeta,
)
from cellar.transfer.shm import Mapping, ShmTransport, buffer_address, local_host_id
from cellar.transfer.tcp_server import TcpDataServer

SECRET = bytes(range(32))
EPOCH = 3
SEG_BYTES = 8 << 20
HOST = "host-under-test"


class Node:
    def __init__(self, shm_dir: Path, node_id: str = "n1") -> None:
        self.shm_dir = shm_dir
        self.node_id = node_id
        self.segment = Segment.create(shm_dir, node_id, 0, SEG_BYTES)
        clock = MasterClock()
        clock.epoch = EPOCH
        self.access = NodeAccess({self.segment.segment_id: self.segment},
                                 ObjectIndex(allowed_skew_ms=1000), SECRET, clock)
        self.server = TcpDataServer(self.access, "127.0.0.1", 0)
        self.server.start()

    @property
    def route(self) -> SegmentRoute:
        return SegmentRoute(self.segment.segment_id, self.node_id, HOST,
                            {"tcp": self.server.address, "shm": str(self.segment.path)})

    def close(self) -> None:
        self.server.stop()
        self.segment.close(unlink=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def shm() -> Iterator[ShmTransport]:
    t = ShmTransport(host_id=HOST)
    try:
        yield t
    finally:
        t.close()


_next_alloc = [100]


def grant(node: Node, op: int, offset: int, length: int, *, key: str = "k",
          expiry_ms: int | None = None, secret: bytes = SECRET) -> Grant:
    _next_alloc[0] += 1
    return sign(secret, op=op, segment_id=node.segment.segment_id, offset=offset, length=length,
                alloc_id=_next_alloc[0], epoch=EPOCH,
                expiry_ms=wall_ms() + 60_000 if expiry_ms is None else expiry_ms,
                tag=key_tag("t", key))


def write_op(node: Node, offset: int, data: bytes | memoryview, *, key: str = "k",
             g: Grant | None = None) -> TransferOp:
    g = g or grant(node, GRANT_OP_WRITE_COMMIT, offset, len(data), key=key)
    return TransferOp(node.route, g, offset, memoryview(data), WriteMeta(1, len(data), "t", key))


def read_op(node: Node, offset: int, out: bytearray) -> TransferOp:
    return TransferOp(node.route, grant(node, GRANT_OP_READ, offset, len(out)), offset,
                      memoryview(out))


def test_host_id_matches_the_nodes() -> None:
    assert local_host_id() == default_host_id()


def test_registered_in_the_factory() -> None:
    t = make_transport("shm")
    try:
        assert isinstance(t, ShmTransport) and t.name == "shm"
    finally:
        t.close()


def test_write_commits_and_read_back(node: Node, shm: ShmTransport) -> None:
    data = os.urandom(300_000)
    op = write_op(node, 4096, data)
    assert [r.ok for r in shm.write([op], 5.0)] == [True]
    entry = node.access.index.get(op.grant.alloc_id)
    assert entry is not None and entry.state.value == "sealed"  # the node saw the commit
    assert bytes(node.segment.view(4096, len(data))) == data
    out = bytearray(len(data))
    assert [r.ok for r in shm.read([read_op(node, 4096, out)], 5.0)] == [True]
    assert out == data
    assert shm.stats["maps"] == 1 and shm.stats["writes"] == 1 and shm.stats["reads"] == 1
    requests = node.server.stats.snapshot()["requests"]
    assert requests["commit"] == 1 and requests["write"] == 0


def test_batch_results_in_order_and_parallel_copy(node: Node) -> None:
    shm = ShmTransport(host_id=HOST, parallel_min_bytes=1)  # every batch takes the 2-thread path
    try:
        blobs = [os.urandom(n) for n in (1, 4095, 65536, 1 << 20, 3 * 1000 + 7)]
        offsets, pos = [], 0
        for b in blobs:
            offsets.append(pos)
            pos += (len(b) + 4095) // 4096 * 4096
        ops = [write_op(node, off, b, key=f"k{i}") for i, (off, b) in
               enumerate(zip(offsets, blobs, strict=True))]
        ops[2] = write_op(node, offsets[2], blobs[2], key="k2",
                          g=grant(node, GRANT_OP_WRITE_COMMIT, offsets[2], 10, key="k2"))  # too small
        results = shm.write(ops, 5.0)
        assert [r.ok for r in results] == [True, True, False, True, True]
        assert results[2].status == ST_OUT_OF_RANGE
        outs = [bytearray(len(b)) for b in blobs]
        results = shm.read([read_op(node, off, o) for off, o in zip(offsets, outs, strict=True)],
                           5.0)
        assert all(r.ok for r in results)
        for i in (0, 1, 3, 4):
            assert outs[i] == blobs[i]
    finally:
        shm.close()


def test_forged_expired_and_sealed_commits_are_refused(node: Node, shm: ShmTransport) -> None:
    data = b"z" * 1000
    forged = write_op(node, 0, data, g=grant(node, GRANT_OP_WRITE_COMMIT, 0, 1000, secret=b"x" * 32))
    expired = write_op(node, 8192, data, g=grant(node, GRANT_OP_WRITE_COMMIT, 8192, 1000,
                                                 expiry_ms=wall_ms() - 60_000))
    wrong_key = write_op(node, 16384, data, key="other",
                         g=grant(node, GRANT_OP_WRITE_COMMIT, 16384, 1000, key="k"))
    results = shm.write([forged, expired, wrong_key], 5.0)
    assert [r.status for r in results] == [ST_BAD_GRANT, ST_EXPIRED, ST_BAD_GRANT]
    assert shm.stats["commits_refused"] == 3
    # flagged for a claim (the master's Replica.claim): refused at the CLAIM, before a byte
    # is copied (WritePlan), and no COMMIT is sent
    flagged = [dataclasses.replace(op, claim=True) for op in (forged, expired, wrong_key)]
    for op in flagged:
        node.segment.view(op.offset, 1000)[:] = bytes(1000)
    results = shm.write(flagged, 5.0)
    assert [r.status for r in results] == [ST_BAD_GRANT, ST_EXPIRED, ST_BAD_GRANT]
    assert (shm.stats["claims_refused"], shm.stats["commits_refused"]) == (3, 3)
    assert all(bytes(node.segment.view(op.offset, 1000)) == bytes(1000) for op in flagged)
    for op in (forged, expired, wrong_key):
        assert node.access.index.get(op.grant.alloc_id) is None  # the index never saw them
    ok = write_op(node, 32768, data)
    first = shm.write([ok], 5.0)[0]
    assert first.ok
    # the same commit again (its reply lost): the node resends the receipt (issue 19); a
    # commit of another object under the sealed allocation is refused
    again = shm.write([TransferOp(ok.route, ok.grant, ok.offset, memoryview(data), ok.meta)], 5.0)
    assert again[0].ok and again[0].receipt == first.receipt
    other = WriteMeta(ok.meta.checksum ^ 1, ok.meta.object_size, ok.meta.tenant, ok.meta.key)
    again = shm.write([TransferOp(ok.route, ok.grant, ok.offset, memoryview(data), other)], 5.0)
    assert again[0].status in (ST_SEALED, ST_BAD_GRANT)


def test_replaced_file_is_remapped_and_stale_commit_refused(
        tmp_path: Path, shm: ShmTransport, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path)
    try:
        first = os.urandom(5000)
        assert shm.write([write_op(node, 0, first)], 5.0)[0].ok
        old_route = node.route
        stale = write_op(node, 8192, b"q" * 100)
        node.close()
        node = Node(tmp_path)  # same node id: same path and segment id, a new file
        route = node.route
        assert (route.segment_id, route.endpoints["shm"]) == (old_route.segment_id,
                                                              old_route.endpoints["shm"])
        assert shm.read([read_op(node, 0, bytearray(10))], 5.0)[0].ok  # remaps
        assert shm.stats["remaps"] == 1 and shm.stats["maps"] == 2
        second = os.urandom(5000)
        assert shm.write([write_op(node, 0, second)], 5.0)[0].ok
        out = bytearray(5000)
        assert shm.read([read_op(node, 0, out)], 5.0)[0].ok and out == second
        assert bytes(node.segment.view(0, 5000)) == second
        # the commit check itself: a commit naming another file than the node's is refused
        mapping = shm._maps[str(node.segment.path)]
        mapping.ino += 1  # as if we still held the old file's mapping (node restarted after
        monkeypatch.setattr(Mapping, "current", lambda self: True)  # our stat)
        res = shm.write([TransferOp(route, grant(node, GRANT_OP_WRITE_COMMIT, 8192, 100), 8192,
                                    memoryview(b"q" * 100), stale.meta)], 5.0)
        assert res[0].status == ST_UNKNOWN_SEGMENT
        assert str(node.segment.path) not in shm._maps  # dropped after the refusal
    finally:
        node.close()


def test_unreachable_routes(node: Node, shm: ShmTransport, tmp_path: Path) -> None:
    route = node.route
    assert shm.can_reach(route)
    other_host = SegmentRoute(route.segment_id, route.node_id, "elsewhere", route.endpoints)
    assert not shm.can_reach(other_host)
    no_file = SegmentRoute(route.segment_id, route.node_id, HOST,
                           {"tcp": route.endpoints["tcp"], "shm": str(tmp_path / "missing.seg")})
    assert not shm.can_reach(no_file)
    out = bytearray(10)
    g = grant(node, GRANT_OP_READ, 0, 10)
    res = shm.read([TransferOp(no_file, g, 0, memoryview(out)),
                    TransferOp(other_host, g, 0, memoryview(out)),
                    TransferOp(route, g, 0, memoryview(out))], 5.0)
    assert [r.status for r in res[:2]] == [ST_CONNECT_FAILED, ST_UNSUPPORTED] and res[2].ok


def test_forget_drops_a_mapping_of_a_replaced_file(tmp_path: Path, shm: ShmTransport) -> None:
    node = Node(tmp_path)
    try:
        path = str(node.segment.path)
        assert shm.read([read_op(node, 0, bytearray(8))], 5.0)[0].ok
        shm.forget(node.route)
        assert path in shm._maps  # still the node's file: still its memory, kept
        node.close()
        node = Node(tmp_path)
        shm.forget(node.route)
        assert path not in shm._maps  # replaced: dropped
        assert shm.read([read_op(node, 0, bytearray(8))], 5.0)[0].ok
        assert shm.stats["maps"] == 2 and shm.stats["remaps"] == 0
    finally:
        node.close()


def test_checks_before_copy(node: Node, shm: ShmTransport) -> None:
    node.segment.view(0, 64)[:] = b"\x07" * 64
    g = grant(node, GRANT_OP_WRITE_COMMIT, 0, 64)
    past_grant = TransferOp(node.route, g, 32, memoryview(b"x" * 64), WriteMeta(1, 64, "t", "k"))
    no_meta = TransferOp(node.route, g, 0, memoryview(b"x" * 64))
    readonly_dst = TransferOp(node.route, grant(node, GRANT_OP_READ, 0, 4), 0, memoryview(b"abcd"))
    res = shm.write([past_grant, no_meta], 5.0)
    assert [r.ok for r in res] == [False, False] and res[0].status == ST_OUT_OF_RANGE
    assert bytes(node.segment.view(0, 64)) == b"\x07" * 64  # nothing copied
    assert not shm.read([readonly_dst], 5.0)[0].ok


def test_buffer_address_of_readonly_and_slices() -> None:
    raw = bytearray(b"0123456789")
    view = memoryview(raw)
    assert buffer_address(view[3:]) == buffer_address(view) + 3
    assert buffer_address(memoryview(b"immutable")) != 0


def test_a_node_that_died_is_not_served_from_its_leftover_file(tmp_path: Path,
                                                               shm: ShmTransport) -> None:
    node = Node(tmp_path)
    route = node.route
    assert shm.read([read_op(node, 0, bytearray(8))], 5.0)[0].ok
    node.server.stop()
    node.segment.close(unlink=False)  # like kill -9: the file stays, its flock is gone
    res = shm.read([read_op(node, 0, bytearray(8))], 5.0)
    assert res[0].status == ST_CONNECT_FAILED and "not running" in res[0].message
    assert shm.can_reach(route)  # reachable in principle: a restarted node takes it over
    os.unlink(route.endpoints["shm"])


@pytest.mark.parametrize("parallel_min_bytes", [1 << 62, 1])
def test_reads_hashed_as_they_land(node: Node, parallel_min_bytes: int) -> None:
    import xxhash

    if "want_checksum" not in TransferOp.__dataclass_fields__:
        pytest.skip("TransferOp has no want_checksum here")
    shm = ShmTransport(host_id=HOST, parallel_min_bytes=parallel_min_bytes)
    try:
        sizes = [1, 300_000, (1 << 20) + 5, 4096]
        offsets = [0, 4096, 1 << 20, 3 << 20]
        for off, n in zip(offsets, sizes, strict=True):
            node.segment.view(off, n)[:] = os.urandom(n)
        outs = [bytearray(n) for n in sizes]
        ops = [read_op(node, off, out) for off, out in zip(offsets, outs, strict=True)]
        for k, op in enumerate(ops):
            op.want_checksum = k != 2  # type: ignore[attr-defined,unused-ignore]
        results = shm.read(ops, 5.0)
        assert all(r.ok for r in results)
        for k, (off, n) in enumerate(zip(offsets, sizes, strict=True)):
            assert outs[k] == bytes(node.segment.view(off, n))
            want = None if k == 2 else xxhash.xxh3_64_intdigest(outs[k])
            assert getattr(results[k], "checksum", None) == want
    finally:
        shm.close()


@pytest.mark.parametrize("parallel_min_bytes", [1 << 62, 1])
def test_writes_hashed_as_they_are_copied_commit_the_digest(node: Node,
                                                            parallel_min_bytes: int) -> None:
    """A write that wants its checksum: the node records the digest of the bytes copied (not
    the placeholder in the op's meta), and the result carries it."""
    import xxhash

    shm = ShmTransport(host_id=HOST, parallel_min_bytes=parallel_min_bytes)
    try:
        parts = [os.urandom(n) for n in (65536, 3, 300_001, 65536)]
        size = sum(map(len, parts))
        op = write_op(node, 8192, bytes(size))  # meta checksum 1: a placeholder
        op.parts = tuple(memoryview(p) for p in parts)
        op.want_checksum = True
        (result,) = shm.write([op], 5.0)
        want = xxhash.xxh3_64_intdigest(b"".join(parts))
        assert result.ok and result.checksum == want
        entry = node.access.index.get(op.grant.alloc_id)
        assert entry is not None and entry.checksum == want
        assert bytes(node.segment.view(8192, size)) == b"".join(parts)
    finally:
        shm.close()


def _filesystem_of(path: Path) -> str:
    best, fstype = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) >= len(best):
            best, fstype = parts[1], parts[2]
    return fstype


def test_only_memory_backed_files_are_prefaulted(tmp_path: Path) -> None:
    """A disk-tier file mapped with MAP_POPULATE would be read in whole into the page cache
    (a 512 MiB one took its first put 0.9 s): only tmpfs/hugetlbfs files are populated."""
    from cellar.transfer.shm import _memory_backed

    candidates = [Path("/dev/shm"), tmp_path, Path(__file__).resolve().parent]
    seen = set()
    for directory in candidates:
        if not directory.is_dir():
            continue
        fd = os.open(directory, os.O_RDONLY)
        try:
            memory = _filesystem_of(directory.resolve()) in ("tmpfs", "hugetlbfs")
            assert _memory_backed(fd) is memory, directory
            seen.add(memory)
        finally:
            os.close(fd)
    assert seen == {True, False}, "no tmpfs and disk directory to compare on this machine"


def test_a_disk_backed_mapping_reads_ahead_on_request() -> None:
    """Mapping.will_need starts the device reading a cold range (what a shm read of a disk-tier
    object of up to WILLNEED_MAX_OP_BYTES asks before its copy)."""
    from cellar.devtools.page_cache import cached_bytes, evict
    from cellar.transfer.shm import _memory_backed

    directory = Path(__file__).resolve().parent  # the clone: on a disk, not tmpfs
    size = 1 << 20
    path = directory / f".willneed-{os.getpid()}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if _memory_backed(fd):
            pytest.skip(f"{directory} is on a memory filesystem")
        os.pwrite(fd, os.urandom(size), 0)
        evict(fd)
        if cached_bytes(fd):
            pytest.skip("this kernel kept the file's pages cached after POSIX_FADV_DONTNEED")
        mapping = Mapping(str(path))  # unmapped when dropped (Mapping.__del__)
        assert not mapping.memory_backed and cached_bytes(fd) == 0  # mapping reads nothing
        mapping.will_need(4096 + 100, size - 8192)  # unaligned: rounded down to a page
        deadline = time.monotonic() + 10
        while cached_bytes(fd) < size - 8192 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cached_bytes(fd) >= size - 8192
        del mapping
    finally:
        os.close(fd)
        path.unlink()
