"""An HA cluster end to end: a real etcd, 2 masters and nodes on 127.0.0.1.

One master leads and the other stands by, both say so on /api/v1/status and /metrics, and agree
on the leader and its epoch; the standby answers ClusterStatus with the leader's address and
refuses everything else with a redirect; clients find the leader through `etcd://` or by
following a standby's redirect. `cellar up --ha` starts the same cluster and stops it (etcd
included) on SIGTERM. The failover itself is in tests/faults/test_ha_*.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

import cellar
from cellar.coord.redirect import LEADER_METADATA, leader_from_details
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from tests.integration.proc_tools import alive, children_of, read_lines_until

CELLAR = [sys.executable, "-m", "cellar"]
HA_READY = re.compile(r"^\s*connect: (etcd://\S+)")


def metric(http: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics of {http}"
    return float(match.group(1))


@pytest.fixture
def ha_cluster():
    cluster = LocalCluster(2, "32MiB", ha=True, masters=2, lease_ttl_s=3)
    try:
        cluster.start()
        yield cluster
    except BaseException:
        for path in sorted(Path(cluster.run_dir).glob("*.log")):
            print(f"---- {path.name} ----\n" + "\n".join(
                path.read_text(errors="replace").splitlines()[-30:]))
        raise
    finally:
        cluster.stop()


@pytest.mark.timeout(90)
def test_one_leader_one_standby_redirects_and_discovery(ha_cluster):
    cluster = ha_cluster
    leader = cluster.leader()
    standby = 1 - leader
    lead, stand = cluster.masters[leader], cluster.masters[standby]
    assert sorted(cluster.roles()) == ["leader", "standby"]

    st_lead = cluster.master_status(leader)
    st_stand = cluster.master_status(standby)
    assert st_lead and st_stand
    assert st_lead["epoch"] > 0 and st_lead["master_id"] == lead.name
    assert st_lead["leader"]["address"] == lead.address == st_stand["leader"]["address"]
    assert st_stand["leader"]["epoch"] == st_lead["epoch"] and st_stand["leader"]["master_id"] == lead.name
    assert st_stand["cluster"] == st_lead["cluster"] == cluster.cluster_name
    assert 0 < st_lead["lease_remaining_s"] <= cluster.lease_ttl_s
    assert metric(lead.http, "master_is_leader") == 1
    assert metric(stand.http, "master_is_leader") == 0

    # The standby: ClusterStatus names the leader; anything else is a redirect to it.
    with grpc.insecure_channel(stand.address) as channel:
        stub = pb_grpc.MasterStub(channel)
        header = pb.RequestHeader(tenant="default", client_id="ha-test", token=cluster.token)
        reply = stub.ClusterStatus(pb.ClusterStatusRequest(header=header), timeout=5)
        assert reply.role == "standby" and reply.leader_address == lead.address
        assert len(reply.segments) == 0
        with pytest.raises(grpc.RpcError) as info:
            stub.PutStart(pb.PutStartRequest(header=header, items=[
                pb.PutItem(key="k", size_bytes=10)]), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert leader_from_details(info.value.details()) == lead.address
        assert dict(info.value.trailing_metadata() or ())[LEADER_METADATA] == lead.address

    # Clients: through etcd, or pointed at the standby (they follow its redirect).
    with cellar.connect(cluster.address, timeout_s=20) as client:
        assert cluster.address.startswith("etcd://")
        assert client.master_address == lead.address
        client.put("via-etcd", b"one")
        assert client.status()["object_count"] >= 1
        with cellar.connect(stand.address, timeout_s=20) as follower:
            assert follower.get("via-etcd") == b"one"
            follower.put("via-standby", b"two")
            assert follower.master_address == lead.address
        assert client.get("via-standby") == b"two"


@pytest.mark.timeout(120)
def test_cellar_up_ha_starts_etcd_two_masters_and_nodes(tmp_path):
    proc = subprocess.Popen(
        [*CELLAR, "up", "--ha", "--nodes", "2", "--segment-size", "32MiB", "--port", "0",
         "--http-port", "0", "--etcd-port", "0", "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        lines = read_lines_until(proc.stdout, lambda line: line.startswith("Ctrl-C stops the cluster"))
        url = next((m.group(1) for line in lines if (m := HA_READY.match(line))), "")
        banner = "\n".join(lines)
        assert url, "cellar up --ha never printed its etcd:// address:\n" + banner
        assert "high availability" in banner and "<- leader" in banner
        kids = children_of(proc.pid)
        assert len(kids) == 5, f"expected etcd, 2 masters and 2 nodes, got {kids}\n{banner}"

        out = subprocess.run([sys.executable, "-c", (
            f"import cellar; c = cellar.connect({url!r}, timeout_s=20); c.put('k', b'v'); "
            "print(c.get('k'))")], capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout.decode().strip() == "b'v'"

        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, banner + rest
        assert "stopped" in rest
        leftover = [pid for pid in kids if alive(pid)]
        assert not leftover, f"children still running after SIGTERM: {leftover}"
        run_dir = tmp_path / "run"
        for name in ("etcd.log", "master-0.log", "master-1.log", "node-0.log", "node-1.log"):
            assert (run_dir / name).exists(), name
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
