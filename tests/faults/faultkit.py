"""Helpers for fault tests: real clusters whose processes the tests kill, stop and restart.

    def test_something(fault_cluster):          # the fixture is in conftest.py
        cluster = fault_cluster(nodes=2, node_expire_after_s=3)
        cluster.restart_master()        # kill -9, then a new master on the same ports
        cluster.restart_node(0)         # kill -9, then the same --node-id and shm dir
        cluster.signal_node(0, signal.SIGSTOP)

`FaultCluster` is a `LocalCluster` (the class behind `cellar up`, which pins its master's ports
after the first start so a restarted master is found at the same address). `raw_stub(cluster)`
is a gRPC stub on the master for tests that need grants (PutStart without the SDK).
Every wait is a poll with a generous deadline (`wait_until`), never a fixed sleep: these tests
must hold on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

import cellar
from cellar.client.session_state import grant_from_replica
from cellar.devtools.local_cluster import LocalCluster
from cellar.http_fetch import fetch_json
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.proto.grant import GRANT_OP_WRITE, Grant
from cellar.storage_node.segment import segment_path
from cellar.tokens import new_token
from cellar.transfer.base import SegmentRoute, TransferOp, TransferResult
from cellar.transfer.frame import WriteMeta
from cellar.transfer.tcp import TcpTransport

FAST = {
    "node_suspect_after_s": 1, "node_expire_after_s": 3, "pin_ttl_s": 2,
    "write_grant_ttl_s": 3, "heartbeat_interval_s": 0.3, "new_node_ramp_s": 0,
}


# One admin token for the whole test session (and the scripts it spawns, which inherit the
# environment): every fault cluster accepts it, so raw-stub requests (`header()`) need no cluster.
TEST_ADMIN_TOKEN = os.environ.setdefault("CELLAR_TEST_ADMIN_TOKEN", new_token()[1])


class FaultCluster(LocalCluster):
    """A `LocalCluster` (restart_master, restart_node, signal_node, signal_master live there,
    shared with `cellar soak`) plus a few test conveniences; it accepts `TEST_ADMIN_TOKEN`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("admin_tokens", [TEST_ADMIN_TOKEN])
        super().__init__(*args, **kwargs)

    def node_log(self, index: int) -> str:
        return self.nodes[index].log_path.read_text(errors="replace")

    def check_master_invariants(self) -> None:
        """The master's full O(n) table check (GET /api/v1/invariants, cellar.master.state.audit);
        the fixture runs it after every passing test whose master is still up."""
        try:
            body = fetch_json(self.master_http, "/api/v1/invariants", timeout_s=10, ca_file=self.http_ca,
                              headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"})
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        assert body.get("ok"), f"master invariants broken: {body}"

    def segment_file(self, index: int) -> Path:
        return segment_path(self.shm_dir, f"node-{index}", 0)


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 20.0,
               interval_s: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (cellar.Unavailable, cellar.Timeout) as exc:
            last = exc
        if last:
            return last
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:g}s waiting for {what} (last: {last!r})")


def node_status(cluster: LocalCluster, index: int) -> dict[str, Any]:
    """Node `index`'s /api/v1/status, {} when it serves none (start it with node_flags
    {"http": "127.0.0.1:0"}: its ready line in the log names the port)."""
    log = cluster.nodes[index].log_path.read_text(errors="replace")
    found = re.findall(r"serving tcp \S+ \(http (\S+?),", log)
    if not found or found[-1] == "off":
        return {}
    with urllib.request.urlopen(f"http://{found[-1]}/api/v1/status", timeout=10) as reply:
        return dict(json.loads(reply.read()))


def node_states(client: cellar.Client) -> dict[str, str]:
    return {n["node_id"]: n["state"] for n in client.status()["nodes"]}


def raw_stub(cluster: LocalCluster) -> tuple[grpc.Channel, pb_grpc.MasterStub]:
    channel = grpc.insecure_channel(cluster.address)
    return channel, pb_grpc.MasterStub(channel)


def header(tenant: str = "default") -> pb.RequestHeader:
    return pb.RequestHeader(tenant=tenant, client_id="fault-test", token=TEST_ADMIN_TOKEN)


def locations(stub: pb_grpc.MasterStub, keys: list[str]) -> dict[str, list[Any]]:
    """key -> its replicas (node_id, segment_id, offset, length, grant), unpinned at once."""
    reply = stub.GetReplicas(pb.GetReplicasRequest(header=header(), keys=keys))
    out = {k: list(r.replicas) for k, r in zip(keys, reply.results, strict=True) if r.status == pb.OK}
    pins = [r.pin_id for r in reply.results if r.pin_id]
    if pins:
        stub.Unpin(pb.UnpinRequest(header=header(), pin_ids=pins))
    return out


def write_with(grant_replica: Any, segments: Any, key: str, data: bytes, checksum: int,
               grant: Grant | None = None) -> TransferResult:
    """Write `data` with the grant of one PutStart replica through a bare TcpTransport."""
    seg = next(s for s in segments if s.segment_id == grant_replica.segment_id)
    route = SegmentRoute(seg.segment_id, seg.node_id, seg.host_id,
                         {ep.transport: ep.address for ep in seg.endpoints})
    grant = grant if grant is not None else grant_from_replica(grant_replica, GRANT_OP_WRITE)
    transport = TcpTransport(connections_per_node=1)
    try:
        op = TransferOp(route, grant, grant_replica.offset, memoryview(data),
                        WriteMeta(checksum, len(data), "default", key))
        (result,) = transport.write([op], 10.0)
        return result
    finally:
        transport.close()


