"""A copy still reading when its node remounts never lands over the put the master makes next.

Two nodes (16 MiB each); every copy waits COPY_DELAY_S between the admission of its target
range and its read of the source (a slow source, tests/faults/slow_node/sitecustomize.py).
One value V lives on node X alone; draining X makes the master order a copy of V into node Y,
Y's first range. Y is then stopped past its expiry and continued: it mounts again (the same
master, which dropped Y's ranges and starts it empty), and a shm writer puts a new value P
into Y's first range: it copies P into the segment file itself (the master flags no claim: it
freed nothing there) and then COMMITs, once Y runs no copy. P is acknowledged and must read
back byte-exact. On the copier before 2026-12-06 the old copy read on after the remount, wrote
V's bytes over P's, ended (releasing its hold, so nothing refused the COMMIT), and the put was
sealed over V's bytes: the read of P failed its checksum.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import xxhash
from faultkit import (
    FAST,
    TEST_ADMIN_TOKEN,
    FaultCluster,
    header,
    locations,
    node_states,
    node_status,
    raw_stub,
    wait_until,
)

import cellar
from cellar.client.session_state import grant_from_replica
from cellar.errors import IntegrityError
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_FLAG_COMMIT, GRANT_OP_WRITE
from cellar.transfer.frame import (
    OP_COMMIT,
    RESPONSE,
    ST_OK,
    RequestHeader,
    WriteMeta,
    decode_response,
    pack_commit_meta,
)
from tests.support.sockets import recv_exactly

MIB = 1 << 20
COPY_DELAY_S = 15.0  # covers the stop, the expiry, the remount and P's copy on a loaded machine
SLOW_NODE = Path(__file__).resolve().parent / "slow_node"
MASTER_FLAGS = {**FAST, "write_grant_ttl_s": 60,  # the copy's grants outlive its delay
                # one 1 MiB copy empties the pacing bucket for ~30 s: V is not copied again
                # (into Y's first range, before P) while the test runs
                "repair_bytes_per_s": 32 << 10}


def _copies_running(cluster: FaultCluster, index: int) -> int:
    return int(node_status(cluster, index)["copier"]["copies_running"])


def _drain(cluster: FaultCluster, node_id: str) -> None:
    request = urllib.request.Request(
        cluster.http_url + "/api/v1/nodes/drain", method="POST",
        data=json.dumps({"node_id": node_id}).encode(),
        headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert json.loads(reply.read())["draining"]


def _commit(segments: Any, rep: Any, meta: WriteMeta, segment_file: Path) -> tuple[int, bytes]:
    """The shm writer's COMMIT of `rep` (its bytes are in the file): (status, receipt)."""
    info = next(s for s in segments if s.segment_id == rep.segment_id)
    host, port = next(e.address for e in info.endpoints if e.transport == "tcp").rsplit(":", 1)
    st = os.stat(segment_file)
    trailer = pack_commit_meta(meta, st.st_dev, st.st_ino)
    frame = RequestHeader(OP_COMMIT, 1, rep.segment_id, rep.offset, rep.length, len(trailer),
                          grant=grant_from_replica(rep, GRANT_OP_WRITE)).pack() + trailer
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame)
        head = decode_response(recv_exactly(sock, RESPONSE.size), max_payload_bytes=1 << 20)
        return head.status, recv_exactly(sock, head.msg_len + head.length)


@pytest.mark.timeout(180)
def test_a_copy_reading_at_a_remount_never_lands_over_the_next_put(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(SLOW_NODE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "CELLAR_TEST_COPY_DELAY_S": str(COPY_DELAY_S)}
    cluster = FaultCluster(2, 16 * MIB, master_flags=MASTER_FLAGS, env=env,
                           node_flags={"http": "127.0.0.1:0"})
    try:
        cluster.start()
        channel, stub = raw_stub(cluster)
        old, new = os.urandom(MIB), os.urandom(MIB)
        with channel, cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
            client.put("v", old, replicas=1)
            x = locations(stub, ["v"])["v"][0].node_id
            y = "node-1" if x == "node-0" else "node-0"
            iy = int(y.rsplit("-", 1)[1])
            _drain(cluster, x)  # V's copy goes to Y: its range admitted, then the slow source
            wait_until("Y to run the copy", lambda: _copies_running(cluster, iy) == 1)

            cluster.signal_node(iy, signal.SIGSTOP)
            wait_until("Y to expire", lambda: y not in node_states(client), timeout_s=30)
            cluster.signal_node(iy, signal.SIGCONT)
            wait_until("Y to mount again", lambda: node_states(client).get(y) == "ACTIVE",
                       timeout_s=30)

            started = stub.PutStart(pb.PutStartRequest(header=header(), items=[
                pb.PutItem(key="p", size_bytes=MIB, avoid_node_ids=[x])]))
            result = started.results[0]
            assert result.status == pb.OK, result
            (rep,) = result.replicas
            assert rep.node_id == y and rep.grant.op & GRANT_FLAG_COMMIT, rep
            assert rep.offset == 0, "P is not in Y's first range, where the old copy was"
            segment_file = cluster.segment_file(iy)
            fd = os.open(segment_file, os.O_RDWR)
            try:  # the shm writer's own copy into the mapping
                assert os.pwrite(fd, new, rep.offset) == MIB
            finally:
                os.close(fd)
            wait_until("Y to run no copy", lambda: _copies_running(cluster, iy) == 0,
                       timeout_s=COPY_DELAY_S + 30)
            checksum = xxhash.xxh3_64_intdigest(new)
            status, receipt = _commit(started.segments, rep,
                                      WriteMeta(checksum, MIB, "default", "p"), segment_file)
            assert status == ST_OK, receipt
            ended = stub.PutEnd(pb.PutEndRequest(header=header(), items=[pb.PutEndItem(
                key="p", put_id=result.put_id, checksum=checksum, receipts=[receipt])]))
            assert ended.results[0].status == pb.OK, ended
            try:
                got = client.get("p")
            except IntegrityError:  # what the old copy left: V's bytes under P's checksum
                got = b"(bytes that fail P's checksum)"
            copier = node_status(cluster, iy)["copier"]
            print(f"\nY's copier: {copier}")
            assert got == new, "the old copy's bytes landed over the acknowledged put"
            assert client.get("v") == old
        cluster.check_master_invariants()
    finally:
        cluster.stop()
