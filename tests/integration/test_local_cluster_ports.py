"""`LocalCluster(ha=True)` picks its masters' ports free before they start; a port another
process takes in between must not fail the cluster (a clean-clone CI run hit exactly that)."""

from __future__ import annotations

import socket

import pytest

import cellar
from cellar.devtools import local_cluster
from cellar.devtools.local_cluster import LocalCluster


def test_an_ha_master_whose_free_port_was_taken_starts_on_another(monkeypatch, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    real = local_cluster.free_port
    handed = []

    def first_a_busy_one(host: str = "127.0.0.1") -> int:
        port = busy if not handed else real(host)
        handed.append(port)
        return port

    monkeypatch.setattr(local_cluster, "free_port", first_a_busy_one)
    cluster = LocalCluster(1, "32MiB", ha=True, masters=2, lease_ttl_s=3, run_dir=tmp_path)
    try:
        cluster.start()
        assert handed[0] == busy                      # master-0 was given the taken port
        assert all(f":{busy}" not in m.address for m in cluster.masters)
        assert (tmp_path / "master-0.1.log").exists()  # its first try's log is kept
        with cellar.connect(cluster.etcd_url, timeout_s=20) as client:
            client.put("ports/k", b"v")
            assert client.get("ports/k") == b"v"
    finally:
        cluster.stop()
        taken.close()


def test_a_port_the_caller_fixed_is_never_moved(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cluster = LocalCluster(1, "32MiB", ha=True, masters=1, lease_ttl_s=3, run_dir=tmp_path,
                           port=taken.getsockname()[1])
    try:
        with pytest.raises(local_cluster.ClusterError, match="cannot listen"):
            cluster.start()
    finally:
        cluster.stop()
        taken.close()
