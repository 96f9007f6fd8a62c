"""The HTTP port over TLS (`http_tls`): status, /metrics and the admin API without tokens in clear.

Before it, the HTTP port of a TLS cluster spoke plaintext (docs/security.md listed it as not
built): an admin token sent to the admin API crossed the network readable. A real master and
node (`LocalCluster(tls=True)` serves both HTTP ports with `--http-tls true`), the CLI tools as
subprocesses, and raw sockets for what a stranger would try. Each test checks what a
plaintext port would have failed: the scheme of the advertised address, a plaintext request
answered, an unverified peer trusted, a stalled handshake holding its slot, a refusal not
counted.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator

import pytest

pytest.importorskip("cryptography")

from cellar.devtools.local_cluster import LocalCluster  # noqa: E402
from cellar.devtools.ports import free_port  # noqa: E402
from cellar.http_fetch import fetch, fetch_json, host_port  # noqa: E402
from cellar.tls import make_dev_pki  # noqa: E402

HEADER_TIMEOUT_S = 1.0
WAIT_S = 20.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, str]]:
    node_http = f"127.0.0.1:{free_port()}"
    with LocalCluster(1, "64MiB", tls=True,
                      master_flags={"http_header_timeout_s": HEADER_TIMEOUT_S},
                      node_flags={"http": node_http, "http_header_timeout_s": HEADER_TIMEOUT_S}
                      ) as c:
        yield c, f"https://{node_http}"


def _env(c: LocalCluster, *, trusted: bool, credentials: str | None = None) -> dict[str, str]:
    """The CLI's environment: the CA in $CELLAR_TLS_CA (trusted) or not; `credentials`: a
    credentials directory of its own (an empty one knows no CA)."""
    env = {k: v for k, v in os.environ.items() if k != "CELLAR_TLS_CA"}
    if trusted:
        assert c.http_ca is not None
        env["CELLAR_TLS_CA"] = c.http_ca
    if credentials is not None:
        env["CELLAR_CREDENTIALS_DIR"] = credentials
    return env


def _plaintext_get(address: str, path: str) -> int:
    """The status of a plain HTTP GET to the port; raises if no HTTP answer came."""
    host, port = host_port(address).rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def _refusals(c: LocalCluster, reason: str) -> float:
    text = fetch(c.http_url, "/metrics", timeout_s=5, ca_file=c.http_ca).decode()
    found = re.search(rf'^master_http_refusals_total\{{reason="{reason}"\}} (\S+)$', text, re.M)
    assert found, f"no {reason} series in /metrics"
    return float(found.group(1))


def test_the_master_advertises_https_and_answers_only_over_verified_tls(cluster, tmp_path):
    c, _ = cluster
    stranger_ca = make_dev_pki(tmp_path / "other", ["127.0.0.1"]).ca_file
    assert c.masters[0].http.startswith("https://")  # the ready line names the scheme
    assert c.http_url.startswith("https://")
    status = fetch_json(c.http_url, "/api/v1/status", timeout_s=5, ca_file=c.http_ca)
    assert status["role"] == "single" and len(status["nodes"]) == 1
    before = _refusals(c, "tls_handshake")
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        _plaintext_get(c.http_url, "/api/v1/status")  # no HTTP answer in clear
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch(c.http_url, "/health", timeout_s=5, ca_file=str(stranger_ca))  # not its CA
    deadline = time.monotonic() + WAIT_S
    while _refusals(c, "tls_handshake") < before + 2:  # both counted by the server
        assert time.monotonic() < deadline, "refused handshakes not counted"
        time.sleep(0.1)


def test_a_stalled_handshake_is_closed_after_the_header_timeout(cluster):
    c, _ = cluster
    host, port = host_port(c.http_url).rsplit(":", 1)
    before = _refusals(c, "tls_handshake")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, never finished
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server, not by our timeout
        waited = time.monotonic() - started
    assert waited < HEADER_TIMEOUT_S + 5, waited
    deadline = time.monotonic() + WAIT_S
    while _refusals(c, "tls_handshake") < before + 1:
        assert time.monotonic() < deadline, "the stalled handshake was not counted"
        time.sleep(0.1)


def test_admin_api_and_cli_tools_over_https(cluster, tmp_path):
    c, _ = cluster
    made = c.admin_request("POST", "/api/v1/tokens", {"kind": "tenant", "tenant": "default",
                                                      "label": "over https"})
    assert made["token"]
    listing = [sys.executable, "-m", "cellar", "token", "list", "--master", c.address,
               "--http", c.http_url, "--token", c.admin_token]
    trusted = subprocess.run(listing, capture_output=True, text=True, timeout=60,
                             env=_env(c, trusted=True))
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert made["id"] in trusted.stdout
    # the credentials file of the cluster names its CA: enough without $CELLAR_TLS_CA
    by_credentials = subprocess.run(listing, capture_output=True, text=True, timeout=60,
                                    env=_env(c, trusted=False))
    assert by_credentials.returncode == 0, by_credentials.stdout + by_credentials.stderr
    # a plaintext address for that port gets no answer, and says so
    plain = subprocess.run(listing[:-4] + ["--http", host_port(c.http_url), "--token",
                                           c.admin_token],
                           capture_output=True, text=True, timeout=60, env=_env(c, trusted=True))
    assert plain.returncode != 0 and "no master answered" in plain.stderr, plain.stderr
    top = [sys.executable, "-m", "cellar", "top", "--once", "--http", c.http_url]
    shown = subprocess.run(top, capture_output=True, text=True, timeout=60,
                           env=_env(c, trusted=True))
    assert shown.returncode == 0, shown.stderr
    assert "node-0" in shown.stdout
    # no $CELLAR_TLS_CA: the CA of the credentials file that names this HTTP port
    by_file = subprocess.run(top, capture_output=True, text=True, timeout=60,
                             env=_env(c, trusted=False))
    assert by_file.returncode == 0, by_file.stderr
    unverified = subprocess.run(top, capture_output=True, text=True, timeout=60,
                                env=_env(c, trusted=False, credentials=str(tmp_path)))
    assert unverified.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in unverified.stderr


def test_the_nodes_http_port_speaks_tls_with_its_data_port_certificate(cluster):
    c, node_http = cluster
    assert fetch(node_http, "/health", timeout_s=5, ca_file=c.http_ca) == b'{\n "status": "ok"\n}'
    metrics = fetch(node_http, "/metrics", timeout_s=5, ca_file=c.http_ca).decode()
    assert "node_http_refusals_total" in metrics
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        _plaintext_get(node_http, "/health")


def test_http_tls_without_a_certificate_is_refused_at_start(tmp_path):
    started = subprocess.run(
        [sys.executable, "-m", "cellar", "master", "--listen", "127.0.0.1:0", "--http",
         "127.0.0.1:0", "--http-tls", "true", "--tokens-file", str(tmp_path / "tokens.json")],
        capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert "http_tls" in started.stderr and "tls_cert_file" in started.stderr, started.stderr
