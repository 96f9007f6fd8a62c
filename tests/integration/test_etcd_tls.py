"""Every Cellar process reaches an etcd that speaks only TLS and asks for client certificates
(coord/etcd_tls.py): HA masters campaign and keep their logs there, nodes and clients find the
leader there. Real etcd (`--client-cert-auth`), two real masters, one node, a failover."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import cellar
from cellar.coord.etcd_tls import ENV_CA, ENV_CERT, ENV_KEY, EtcdTls
from cellar.devtools.local_cluster import LocalCluster
from cellar.errors import ConfigError


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def leader_of(address: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A fresh process that asks etcd for the leader, as any client does (discovery)."""
    code = ("import sys; from cellar.coord.discovery import LeaderDiscovery; "
            "from cellar.coord.target import parse_etcd_url; "
            "print(LeaderDiscovery(parse_etcd_url(sys.argv[1])).leader(2.0))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CELLAR_ETCD_")}
    return subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                          timeout=60, env={**clean, **env})


def test_a_cluster_over_an_etcd_that_wants_tls_and_client_certificates() -> None:
    with LocalCluster(1, "64MiB", ha=True, masters=2, etcd_tls=True) as cluster:
        env = cluster.etcd_env
        assert set(env) == {ENV_CA, ENV_CERT, ENV_KEY}
        assert cluster.etcd is not None and cluster.etcd.client_url.startswith("https://")
        with environment(env), cellar.connect(cluster.address, timeout_s=30) as client:
            client.put("k/over-tls-etcd", b"v" * 1000)
            assert client.get("k/over-tls-etcd") == b"v" * 1000
        found = leader_of(cluster.address, env)
        assert found.returncode == 0 and "address" in found.stdout, found.stderr
        # the same etcd refuses a caller without TLS, and one without a client certificate
        plain = leader_of(cluster.address, {})
        assert plain.returncode != 0 and "Unavailable" in plain.stderr, plain.stdout
        no_cert = leader_of(cluster.address, {ENV_CA: env[ENV_CA]})
        assert no_cert.returncode != 0, no_cert.stdout
        # a failover goes through it too: the standby wins the election over TLS
        first = cluster.leader()
        cluster.kill_master(first)
        assert cluster.leader(timeout_s=30, not_index=first) != first
        with environment(env), cellar.connect(cluster.address, timeout_s=30) as client:
            assert client.get("k/over-tls-etcd") == b"v" * 1000


def test_settings_are_checked_before_any_connection() -> None:
    assert EtcdTls.from_env({}) is None
    with pytest.raises(ConfigError, match=ENV_CA):
        EtcdTls.from_env({ENV_CERT: "/x", ENV_KEY: "/y"})
    with pytest.raises(ConfigError, match="both"):
        EtcdTls.from_env({ENV_CA: "/etc/hostname", ENV_CERT: "/x"})
    with pytest.raises(ConfigError, match="not a PEM file"):
        EtcdTls.from_env({ENV_CA: "/etc/hostname"})
    with pytest.raises(ConfigError, match=ENV_CA):
        EtcdTls.from_env({ENV_CA: "/no/such/ca.pem"})


@pytest.mark.parametrize("argv", [
    ["master", "--listen", "127.0.0.1:0", "--etcd", "127.0.0.1:9", "--cluster-secret-file", ""],
    ["node", "--master", "etcd://127.0.0.1:9/c", "--listen", "127.0.0.1:0", "--http", ""],
], ids=["master", "node"])
def test_a_bad_etcd_tls_setting_stops_the_start(argv: list[str], tmp_path: object) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELLAR_ETCD_")}
    proc = subprocess.run([sys.executable, "-m", "cellar", *argv], capture_output=True, text=True,
                          timeout=60, env={**env, ENV_CA: "/no/such/ca.pem", "HOME": str(tmp_path)})
    assert proc.returncode == 2 and ENV_CA in proc.stderr, (proc.returncode, proc.stderr)
