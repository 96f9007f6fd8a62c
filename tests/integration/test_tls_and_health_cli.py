"""`cellar tls create` (a private CA and one certificate for a cluster's names, in the file
names of a kubernetes.io/tls Secret) and `cellar health` (the image's HEALTHCHECK), run as the
commands they are against a real TLS cluster (LocalCluster(tls=True): every HTTP port over TLS)."""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cellar.devtools.health_cli import probe_address
from cellar.devtools.local_cluster import LocalCluster
from cellar.http_fetch import host_port
from tests.support.tls_handshake import handshake as tls_handshake


def cellar(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cellar", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def handshake(directory: Path, server_name: str) -> None:
    """A loopback TLS handshake with tls.crt/tls.key, verified with ca.crt as `server_name`."""
    tls_handshake(directory / "tls.crt", directory / "tls.key", directory / "ca.crt", server_name)


def test_tls_create_writes_a_secret_shaped_ca_and_certificate_for_its_names(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    made = cellar("tls", "create", "--dir", str(out), "master-0", "*.cellar-node.kv.svc",
                  "10.1.2.3", "--days", "7")
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    for name in ("master-0", "cellar-node-3.cellar-node.kv.svc", "10.1.2.3", "127.0.0.1",
                 "localhost"):
        handshake(out, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(out, "master-1")
    again = cellar("tls", "create", "--dir", str(tmp_path / "plain"), "node-0", "--no-loopback",
                   "--readable-key")
    assert again.returncode == 0, again.stderr
    assert stat.S_IMODE((tmp_path / "plain" / "tls.key").stat().st_mode) == 0o644
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tmp_path / "plain", "127.0.0.1")
    assert cellar("tls", "create", "--dir", str(tmp_path / "x"), "a", "--days", "0").returncode == 2
    assert cellar("tls").returncode == 2


def test_probe_address_upgrades_to_https_only_when_the_server_serves_tls() -> None:
    url = "http://127.0.0.1:9400/health"
    assert probe_address(url, {}) == ("http://127.0.0.1:9400", "/health")
    assert probe_address(url, {"CELLAR_NODE_HTTP_TLS": "true"}) == ("https://127.0.0.1:9400", "/health")
    assert probe_address(url, {"CELLAR_MASTER_HTTP_TLS": "false"})[0].startswith("http://")
    assert probe_address("https://localhost:1/health", {})[0] == "https://localhost:1"
    with pytest.raises(ValueError):
        probe_address("127.0.0.1:9400/health", {})


def test_health_probes_a_tls_cluster_as_the_image_runs_it(tmp_path: Path) -> None:
    other = tmp_path / "other-ca"
    assert cellar("tls", "create", "--dir", str(other), "127.0.0.1").returncode == 0
    with LocalCluster(1, "64MiB", tls=True) as cluster:
        assert cluster.http_ca is not None
        url = f"http://{host_port(cluster.master_http)}/health"
        tls_env = {"CELLAR_HEALTH_URL": url, "CELLAR_TLS_CA": cluster.http_ca}
        # the master's own container: it serves TLS, so the probe asks https and verifies
        ok = cellar("health", env={**tls_env, "CELLAR_MASTER_HTTP_TLS": "true"})
        assert ok.returncode == 0, ok.stderr
        # plaintext to a TLS port is no answer; a CA that did not sign it is refused
        plain = cellar("health", env=tls_env)
        assert plain.returncode == 1 and "cellar health" in plain.stderr
        wrong = cellar("health", env={**tls_env, "CELLAR_MASTER_HTTP_TLS": "true",
                                      "CELLAR_TLS_CA": str(other / "ca.crt")})
        assert wrong.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in wrong.stderr
        # nothing listening
        down = cellar("health", "http://127.0.0.1:9/health")
        assert down.returncode == 1
    assert cellar("health", env={"CELLAR_HEALTH_URL": ""}).returncode == 2
