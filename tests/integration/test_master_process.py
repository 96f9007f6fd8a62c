"""`cellar master` as a process: config printing and validation, signals, node expiry with
short timeouts, the stall guard under SIGSTOP, quotas from a config file."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from master_harness import running_master

from cellar.devtools.children import send_signal
from cellar.master.config import MasterConfig
from cellar.proto import cellar_pb2 as pb
from tests.support.receipts import receipts_for

MiB = 1 << 20
FAST_LIVENESS = (
    "--heartbeat-interval-s", "0.1", "--node-suspect-after-s", "0.4",
    "--node-expire-after-s", "0.8", "--tick-interval-s", "0.05",
)


def run_master_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("CELLAR_MASTER_")}
    child_env["CELLAR_CLUSTER_SECRET"] = "00" * 32
    child_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "cellar", "master", *args], capture_output=True,
                          text=True, timeout=60, env=child_env)


def test_print_config_lists_every_setting_with_default_and_unit() -> None:
    result = run_master_cli("--print-config")
    assert result.returncode == 0, result.stderr
    lines = {line.split(" = ")[0]: line for line in result.stdout.splitlines()}
    for field in dataclasses.fields(MasterConfig):
        assert field.name in lines, field.name
        assert "default" in lines[field.name]
    assert "[bytes]" in lines["max_key_bytes"] and "1KiB" in lines["max_key_bytes"]
    assert "[s]" in lines["pin_ttl_s"] and "[s]" in lines["node_expire_after_s"]
    assert "4MiB" in lines["grpc_max_message_bytes"]
    assert "0.9" in lines["eviction_high_watermark"]


def test_print_config_shows_layers() -> None:
    result = run_master_cli("--print-config", "--max-key-bytes", "2KiB",
                            env={"CELLAR_MASTER_PIN_TTL_S": "5s"})
    assert result.returncode == 0
    assert "max_key_bytes = 2KiB" in result.stdout and "from flag" in result.stdout
    assert "pin_ttl_s = 5.0" in result.stdout and "from env CELLAR_MASTER_PIN_TTL_S" in result.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--max-key-bytes", "4XB"), "max_key_bytes"),
        (("--eviction-high-watermark", "0.8", "--eviction-low-watermark", "0.85"), "eviction_high_watermark"),
        (("--listen", "not-an-address"), "listen"),
    ],
)
def test_invalid_config_exits_non_zero_naming_the_field(args: tuple[str, ...], field: str) -> None:
    result = run_master_cli(*args)
    assert result.returncode != 0
    assert field in result.stderr
    assert "listening" not in result.stdout


def test_invalid_config_file_and_secret(tmp_path: Path) -> None:
    bad = tmp_path / "master.yaml"
    bad.write_text("tenants:\n  team: {quota_bytes: 12 parsecs}\n")
    result = run_master_cli("--config", str(bad))
    assert result.returncode != 0 and "tenants" in result.stderr
    unknown = tmp_path / "typo.toml"
    unknown.write_text("max_key_byte = 10\n")
    result = run_master_cli("--config", str(unknown))
    assert result.returncode != 0 and "max_key_byte" in result.stderr
    result = run_master_cli(env={"CELLAR_CLUSTER_SECRET": "short"})
    assert result.returncode != 0 and "CELLAR_CLUSTER_SECRET" in result.stderr


def test_port_in_use_exits_non_zero() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_master_cli("--listen", f"127.0.0.1:{port}", "--http", "127.0.0.1:0")
    assert result.returncode == 1 and "cannot listen" in result.stderr


def test_sigint_and_sigterm_stop_cleanly() -> None:
    with running_master() as master:
        master.proc.send_signal(signal.SIGINT)
        assert master.proc.wait(10) == 0
    with running_master() as master:
        pass
    assert master.proc.returncode == 0


class Heartbeater:
    """A simulated node: mounts a segment, then heartbeats until told to stop."""

    def __init__(self, stub: Any, node_id: str, segment_id: int, size: int = 64 * MiB) -> None:
        self.stub = stub
        self.node_id = node_id
        reply = stub.MountSegment(pb.MountSegmentRequest(node_id=node_id, incarnation=1, segments=[
            pb.SegmentInfo(segment_id=segment_id, size_bytes=size, host_id=node_id)]))
        assert reply.results[0].status == pb.OK
        self.interval_s = reply.heartbeat_interval_ms / 1000
        self.remounts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ack = 0
        while not self._stop.wait(self.interval_s):
            try:
                reply = self.stub.Heartbeat(pb.HeartbeatRequest(node_id=self.node_id, incarnation=1,
                                                                freed_ack_seq=ack), timeout=30)
            except grpc.RpcError:
                continue
            ack = reply.freed_seq
            self.remounts += reply.remount

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def segment_states(stub: Any) -> dict[str, int]:
    status = stub.ClusterStatus(pb.ClusterStatusRequest())
    return {s.info.node_id: s.state for s in status.segments}


def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_silent_node_goes_suspect_then_expires() -> None:
    with running_master(*FAST_LIVENESS) as master, grpc.insecure_channel(master.grpc_address) as ch:
        stub = master.stub(ch)
        alive = Heartbeater(stub, "alive", 1)
        quiet = Heartbeater(stub, "quiet", 2)
        started = stub.PutStart(pb.PutStartRequest(items=[
            pb.PutItem(key="on-both", size_bytes=1000, replicas=2),
            pb.PutItem(key="on-quiet", size_bytes=1000, avoid_node_ids=["alive"]),
        ]))
        stub.PutEnd(pb.PutEndRequest(items=[
            pb.PutEndItem(key="on-both", put_id=started.results[0].put_id,
                          receipts=receipts_for(master.secret, started.results[0], 0)),
            pb.PutEndItem(key="on-quiet", put_id=started.results[1].put_id,
                          receipts=receipts_for(master.secret, started.results[1], 0)),
        ]))
        quiet.stop()
        wait_for(lambda: segment_states(stub).get("quiet") == pb.NODE_STATE_SUSPECT)
        # SUSPECT: no new placements, replicas still served
        assert stub.GetReplicas(pb.GetReplicasRequest(keys=["on-quiet"])).results[0].status == pb.OK
        two = stub.PutStart(pb.PutStartRequest(items=[pb.PutItem(key="two", size_bytes=10, replicas=2)]))
        assert two.results[0].status == pb.UNAVAILABLE
        wait_for(lambda: "quiet" not in segment_states(stub))
        exists = stub.Exists(pb.KeysRequest(keys=["on-both", "on-quiet"])).statuses
        assert list(exists) == [pb.OK, pb.NOT_FOUND]
        both = stub.GetReplicas(pb.GetReplicasRequest(keys=["on-both"])).results[0]
        assert [r.node_id for r in both.replicas] == ["alive"]
        beat = stub.Heartbeat(pb.HeartbeatRequest(node_id="quiet", incarnation=1))
        assert beat.remount
        assert segment_states(stub) == {"alive": pb.NODE_STATE_ACTIVE}
        assert alive.remounts == 0
        alive.stop()


def test_stopped_master_does_not_expire_nodes_for_its_own_stall() -> None:
    with running_master(*FAST_LIVENESS) as master, grpc.insecure_channel(master.grpc_address) as ch:
        stub = master.stub(ch)
        node = Heartbeater(stub, "steady", 1)
        time.sleep(0.3)
        send_signal(master.proc, signal.SIGSTOP)  # returns once every thread has stopped
        time.sleep(1.5)  # longer than node_expire_after_s
        master.proc.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        assert segment_states(stub) == {"steady": pb.NODE_STATE_ACTIVE}
        assert node.remounts == 0
        node.stop()


def test_quota_from_config_file(tmp_path: Path) -> None:
    config = tmp_path / "master.toml"
    config.write_text(
        "node_suspect_after_s = 600\nnode_expire_after_s = 1200\n"
        '[tenants.small]\nquota_bytes = "2MiB"\n'
    )
    with running_master("--config", str(config)) as master, grpc.insecure_channel(master.grpc_address) as ch:
        stub = master.stub(ch)
        stub.MountSegment(pb.MountSegmentRequest(node_id="n", incarnation=1, segments=[
            pb.SegmentInfo(segment_id=1, size_bytes=64 * MiB)]))
        small = pb.RequestHeader(tenant="small", client_id="c")
        started = stub.PutStart(pb.PutStartRequest(header=small, items=[
            pb.PutItem(key=f"k{i}", size_bytes=MiB) for i in range(3)]))
        # each put fits on its own; the third evicts nothing (the first two are still WRITING)
        assert [r.status for r in started.results] == [pb.OK, pb.OK, pb.QUOTA_EXCEEDED]
        assert "small" in started.results[2].message
        status = stub.ClusterStatus(pb.ClusterStatusRequest())
        tenant = next(t for t in status.tenants if t.name == "small")
        assert (tenant.used_bytes, tenant.quota_bytes, tenant.object_count) == (2 * MiB, 2 * MiB, 2)
        stub.PutEnd(pb.PutEndRequest(header=small, items=[
            pb.PutEndItem(key=f"k{i}", put_id=started.results[i].put_id,
                          receipts=receipts_for(master.secret, started.results[i], 0)) for i in range(2)]))
        again = stub.PutStart(pb.PutStartRequest(header=small, items=[pb.PutItem(key="k2", size_bytes=MiB)]))
        assert again.results[0].status == pb.OK  # its own LRU object made room
        assert list(stub.Exists(pb.KeysRequest(header=small, keys=["k0", "k1"])).statuses) == [
            pb.NOT_FOUND, pb.OK]
