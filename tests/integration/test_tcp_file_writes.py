"""TCP writes into a disk-backed segment file (a node's disk tier): through a bounce buffer and
pwrite (`TcpDataServer`'s `receive_file`), never by stores into the mapping.

The server runs in this process in front of `TransferNode` (the storage node's own gate), whose
`receiver` here answers a `FileRange` into a real file under the test's temp folder, as the
node's answers for its disk tier. What must hold: the payload lands byte-exact at its offset in
the file across bounce-buffer boundaries; the segment's memory is not written; a pwrite that
fails refuses that one write (ST_INTERNAL, not recorded as written) and the connection stays in
sync for the next one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellar.transfer.base import FileRange
from cellar.transfer.frame import ST_INTERNAL, RequestHeader, WriteMeta
from cellar.transfer.tcp import TcpTransport
from cellar.transfer.tcp_server import FILE_CHUNK_BYTES, TcpDataServer
from tests.support.transfer_node import TransferNode, route_to, wop

FILE_BYTES = 8 << 20


class FileNode(TransferNode):
    """A node whose writes go to `fd` (a disk-tier file) as FileRanges; `fd` may be swapped
    for one that refuses writes."""

    def __init__(self, fd: int) -> None:
        super().__init__(FILE_BYTES)
        self.fd = fd

    def receiver(self, request: RequestHeader, meta: WriteMeta) -> memoryview | FileRange:
        self.writable(request, meta)  # every check of a WRITE, as the node's receiver runs
        return FileRange(self.fd, request.offset, request.length)


@pytest.fixture
def disk_file(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "disk-tier.seg"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, FILE_BYTES)
    yield path, fd
    os.close(fd)


def test_a_write_lands_in_the_file_across_bounce_buffers(disk_file: tuple[Path, int]) -> None:
    path, fd = disk_file
    node = FileNode(fd)
    offset = 4096 + 7
    payload = os.urandom(2 * FILE_CHUNK_BYTES + 123)  # three chunks, the last one short
    small = os.urandom(100)
    with TcpDataServer(node, "127.0.0.1", 0) as server:
        transport = TcpTransport(connections_per_node=1)
        try:
            route = route_to(server.address)
            results = transport.write([wop(route, offset, payload, key="big"),
                                       wop(route, 0, small, key="small")], 10)
        finally:
            transport.close()
    assert [r.status for r in results] == [0, 0]
    data = path.read_bytes()
    assert data[offset:offset + len(payload)] == payload
    assert data[:len(small)] == small
    assert data[len(small):offset] == bytes(offset - len(small))  # nothing else was written
    assert bytes(node.view[offset:offset + len(payload)]) == bytes(len(payload))  # not memory
    assert [(c[1], c[2]) for c in node.written_calls] == [(offset, len(payload)),
                                                          (0, len(small))]


def test_a_failed_file_write_refuses_that_write_only(disk_file: tuple[Path, int],
                                                     tmp_path: Path) -> None:
    path, fd = disk_file
    read_only = os.open(path, os.O_RDONLY)  # pwrite on it fails (EBADF)
    node = FileNode(read_only)
    try:
        with TcpDataServer(node, "127.0.0.1", 0) as server:
            transport = TcpTransport(connections_per_node=1)
            try:
                route = route_to(server.address)
                refused = transport.write([wop(route, 0, os.urandom(FILE_CHUNK_BYTES + 5),
                                               key="refused")], 10)
                node.fd = fd
                after = transport.write([wop(route, 0, b"after" * 10, key="after")], 10)
                connections = server.stats.snapshot()["connections_total"]
            finally:
                transport.close()
    finally:
        os.close(read_only)
    assert refused[0].status == ST_INTERNAL
    assert "write into the segment file" in refused[0].message
    assert after[0].status == 0 and path.read_bytes()[:50] == b"after" * 10
    assert connections == 1  # the payload was drained: the same connection served the next
    assert [c[3] for c in node.written_calls] == ["after"]  # the refused one never recorded
