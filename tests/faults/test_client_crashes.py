"""Clients killed mid-operation.

- A writer killed -9 between PutStart and PutEnd (after writing every byte): the object never
  becomes visible, and its space returns once its write grant has expired (writer timeout).
- A reader killed -9 while it holds a pin: the pin is released at the pin TTL, so the removal
  of the object it pinned can finish and its space returns.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from faultkit import wait_until

import cellar
from cellar.errors import Status

HERE = Path(__file__).resolve().parent

WRITER = """
import sys, time
import grpc, xxhash
sys.path.insert(0, {here!r})
from faultkit import header, write_with
from cellar.proto import cellar_pb2 as pb, cellar_pb2_grpc as pb_grpc
stub = pb_grpc.MasterStub(grpc.insecure_channel({address!r}))
data = b"orphan!" * 100_000
reply = stub.PutStart(pb.PutStartRequest(header=header(), items=[
    pb.PutItem(key="orphan", size_bytes=len(data), replicas=2)]))
assert reply.results[0].status == pb.OK, reply.results[0].message
ok = all(write_with(rep, reply.segments, "orphan", data, xxhash.xxh3_64_intdigest(data)).ok
         for rep in reply.results[0].replicas)
print("written", ok, flush=True)
time.sleep(600)
"""

READER = """
import sys, time
import grpc
sys.path.insert(0, {here!r})
from faultkit import header
from cellar.proto import cellar_pb2 as pb, cellar_pb2_grpc as pb_grpc
stub = pb_grpc.MasterStub(grpc.insecure_channel({address!r}))
reply = stub.GetReplicas(pb.GetReplicasRequest(header=header(), keys=["pinned"]))
print("pinned", reply.results[0].pin_id, flush=True)
time.sleep(600)
"""


def spawn(script: str, address: str) -> subprocess.Popen[str]:
    code = textwrap.dedent(script).format(here=str(HERE), address=address)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def metric(cluster, name: str) -> float:
    with urllib.request.urlopen(f"{cluster.http_url}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


@pytest.mark.timeout(60)
def test_writer_killed_before_put_end(fault_cluster):
    cluster = fault_cluster(nodes=2, write_grant_ttl_s=3)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        client.put("other", b"x" * 1000)
        baseline = client.status()
        writer = spawn(WRITER, cluster.address)
        try:
            assert writer.stdout is not None
            assert writer.stdout.readline().strip() == "written True"
            writing = client.status()
            assert writing["used_bytes"] > baseline["used_bytes"]
            writer.kill()
            writer.wait(10)
        finally:
            if writer.poll() is None:
                writer.kill()
        assert client.exists("orphan") is False
        assert client.get_many(["orphan"]) == [None]
        # After the write grant TTL (+ skew) the master revokes the put and frees its space.
        wait_until("the orphan's space to return",
                   lambda: client.status()["used_bytes"] == baseline["used_bytes"], timeout_s=20)
        assert client.status()["tenants"] == baseline["tenants"]
        assert client.get_many(["orphan"]) == [None]
        client.put("orphan", b"second writer")
        assert client.get("orphan") == b"second writer"


@pytest.mark.timeout(60)
def test_reader_killed_while_pinned(fault_cluster):
    cluster = fault_cluster(nodes=1, pin_ttl_s=2)
    with cellar.connect(cluster.address, timeout_s=20, transport="tcp") as client:
        baseline = client.status()["used_bytes"]
        assert client.put_many({"pinned": b"p" * 100_000}) == [Status.OK]
        reader = spawn(READER, cluster.address)
        try:
            assert reader.stdout is not None
            line = reader.stdout.readline().split()
            assert line[0] == "pinned" and int(line[1]) > 0
            reader.kill()
            reader.wait(10)
        finally:
            if reader.poll() is None:
                reader.kill()
        assert metric(cluster, "master_pin_count") >= 1
        client.remove("pinned")  # gone from the table; its range waits for the pin
        assert client.get_many(["pinned"]) == [None]
        assert client.status()["used_bytes"] > baseline
        wait_until("the dead reader's pin to expire and the range to be freed",
                   lambda: client.status()["used_bytes"] == baseline, timeout_s=20)
        assert metric(cluster, "master_pin_count") == 0
        assert metric(cluster, "master_pin_expired_total") >= 1
