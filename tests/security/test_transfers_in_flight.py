"""A transfer that stalls after its grant was checked never touches another tenant's object.

Real processes (one master, one node with one small segment, so a freed range is the next
one handed out) and raw frames. The node holds every admitted transfer on its allocation
until it ends (storage_node/inflight.py): a seal waits for the allocation's other writes, and
no newer allocation is admitted over a range with transfers in flight. Nothing here waits
for a clock: each step happens after the previous one answered.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import cellar
from cellar.client.session_state import grant_from_replica
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE
from cellar.transfer._sockio import PAYLOAD_FLUSH_PARTS
from cellar.transfer.frame import (
    OP_PING,
    OP_READ,
    OP_WRITE,
    RESPONSE,
    ST_BUSY,
    ST_OK,
    RequestHeader,
    WriteMeta,
    decode_response,
)
from tests.support.sockets import recv_exactly

SIZE = 256 * 1024


@pytest.fixture(scope="module")
def one_node() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB") as cluster:
        yield cluster


def _tcp_address(segments: Any, segment_id: int) -> tuple[str, int]:
    info = next(s for s in segments if s.segment_id == segment_id)
    host, port = next(e.address for e in info.endpoints if e.transport == "tcp").rsplit(":", 1)
    return host, int(port)


def _reply(sock: socket.socket) -> tuple[int, bytes]:
    """(status, payload or message) of the next reply on `sock`."""
    head = decode_response(recv_exactly(sock, RESPONSE.size), max_payload_bytes=1 << 20)
    return head.status, recv_exactly(sock, head.msg_len + head.length)


def test_a_stalled_second_write_cannot_overwrite_the_next_tenants_object(
        one_node: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: Bob admits a second WRITE of his allocation on C2 and stalls mid-payload, seals
    the allocation with C1, ends and removes it (the range is freed at once), Alice's object
    takes the range, then C2's payload lands over it, and the node answers OK. Now C1's seal
    is refused (ST_BUSY) while C2 is in flight, so Bob's object never completes, and Alice's
    object reads back byte-exact after C2 finished."""
    monkeypatch.setenv("CELLAR_PUT_AHEAD", "0")  # Alice's put takes a freshly freed range
    bob = pb.RequestHeader(tenant="bob", client_id="bob", token=one_node.token_for("bob"))
    junk = b"\xee" * SIZE
    with grpc.insecure_channel(one_node.address) as channel, \
            cellar.connect(one_node.address, tenant="alice",
                           token=one_node.token_for("alice")) as alice:
        stub = pb_grpc.MasterStub(channel)
        started = stub.PutStart(pb.PutStartRequest(header=bob, items=[
            pb.PutItem(key="atk", size_bytes=SIZE)]))
        result = started.results[0]
        rep = result.replicas[0]
        meta = WriteMeta(0, SIZE, "bob", "atk").pack()
        frame = RequestHeader(OP_WRITE, 1, rep.segment_id, rep.offset, SIZE, len(meta),
                              grant=grant_from_replica(rep, GRANT_OP_WRITE)).pack() + meta
        address = _tcp_address(started.segments, rep.segment_id)
        with socket.create_connection(address, timeout=10) as c2, \
                socket.create_connection(address, timeout=10) as c1:
            _admit_and_stall(c2, frame, junk[:SIZE // 2])
            c1.sendall(frame + junk)
            status, body = _reply(c1)
            receipts = [body] if status == ST_OK else []
            ended = stub.PutEnd(pb.PutEndRequest(header=bob, items=[
                pb.PutEndItem(key="atk", put_id=result.put_id, checksum=0, receipts=receipts)]))
            stub.Remove(pb.KeysRequest(header=bob, keys=["atk"]))
            victim = os.urandom(SIZE)
            alice.put("victim", victim)
            c2.sendall(junk[SIZE // 2:])  # C2 ends: before, over Alice's object
            late, _ = _reply(c2)
            assert alice.get("victim") == victim, "Bob's stalled write landed in Alice's object"
        assert status == ST_BUSY, f"C1 sealed Bob's allocation with C2 in flight ({status})"
        assert ended.results[0].status != pb.OK
        del late  # refused, or OK for a range no longer Bob's: Alice's object is whole


BIG = 16 << 20  # over what the kernel buffers between a node and a reader that stops reading


@pytest.fixture(scope="module")
def tight_node() -> Iterator[LocalCluster]:
    """One node, a small segment: a BIG object put after a remove overlaps the freed range
    (the allocator coalesces the free space and places it first)."""
    with LocalCluster(1, "32MiB") as cluster:
        yield cluster


def test_a_stalled_read_never_delivers_the_next_tenants_bytes(
        tight_node: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug: Alice sends a READ of her whole object and stops reading her socket; the node's
    reply (a view of segment memory) waits in sendmsg. She unpins and removes the object
    (freed at once), Bob's object is written into the range, and the rest of her reply
    carried Bob's bytes. Now the reply holds the allocation until it is with the kernel:
    Bob's writes over the range are refused (ST_BUSY; his put fails or goes elsewhere), and
    every byte Alice receives is her own."""
    monkeypatch.setenv("CELLAR_PUT_AHEAD", "0")
    alice_h = pb.RequestHeader(tenant="alice", client_id="alice-raw",
                               token=tight_node.token_for("alice"))
    mine = os.urandom(BIG)
    with grpc.insecure_channel(tight_node.address) as channel, \
            cellar.connect(tight_node.address, tenant="alice",
                           token=tight_node.token_for("alice")) as alice, \
            cellar.connect(tight_node.address, tenant="bob",
                           token=tight_node.token_for("bob")) as bob:
        stub = pb_grpc.MasterStub(channel)
        alice.put("mine", mine)
        got = stub.GetReplicas(pb.GetReplicasRequest(header=alice_h, keys=["mine"]))
        rep = got.results[0].replicas[0]
        frame = RequestHeader(OP_READ, 1, rep.segment_id, rep.offset, BIG,
                              grant=grant_from_replica(rep, GRANT_OP_READ)).pack()
        reader = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
        reader.settimeout(30)
        reader.connect(_tcp_address(got.segments, rep.segment_id))
        with reader:
            reader.sendall(frame)
            status, _ = decode_response(_exactly(reader, RESPONSE.size), max_payload_bytes=BIG)\
                .status, None
            assert status == ST_OK
            head = _exactly(reader, 64 << 10)  # the reply began; the node now waits on us
            stub.Unpin(pb.UnpinRequest(header=alice_h, pin_ids=[got.results[0].pin_id]))
            alice.remove("mine")
            theirs = os.urandom(BIG)
            try:
                bob.put("theirs", theirs)
            except cellar.CellarError:
                pass  # refused while Alice's reply is in flight: nothing of his in the range
            try:
                rest = _exactly(reader, BIG - len(head))
            except (ConnectionError, TimeoutError):
                rest = b""  # closed: whatever arrived is checked below
        received = head + rest
        assert received == mine[:len(received)], "Alice's reply carried bytes that are not hers"
        assert len(received) == BIG


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        got = sock.recv(min(n - len(data), 1 << 20))
        if not got:
            raise ConnectionError("node closed")
        data += got
    return bytes(data)


def _admit_and_stall(sock: socket.socket, frame: bytes, part: bytes) -> None:
    """Send `frame` (a WRITE header) and `part` of its payload on `sock`, and return once the
    node admitted the write and waits for the rest. No clock: PAYLOAD_FLUSH_PARTS PINGs go
    just before the header (one small send, read by the node at once); the node holds their
    replies until it waits in the middle of a payload (_sockio.Inbox), i.e. after admission."""
    pings = b"".join(RequestHeader(OP_PING, 100 + i, 0, 0, 0).pack()
                     for i in range(PAYLOAD_FLUSH_PARTS))
    sock.sendall(pings + frame)
    sock.sendall(part)
    for _ in range(PAYLOAD_FLUSH_PARTS):
        status, _ = _reply(sock)
        assert status == ST_OK
