"""The master's status page in a real browser, and `cellar top` on the same cluster.

An HA LocalCluster (etcd + 2 masters + 3 nodes, two tenants with quotas) gets some data, and
one node is stopped past its expiry so the event log has a `node_expired` entry. Headless
Chromium (Debian's `chromium`) loads the leader's `/`: the test reads the DOM Chromium built
(`--dump-dom`, after parsing, so what a person's browser shows) for the role, epoch, every node
with its state and every tenant, and takes a screenshot into bench/results/status-page.png.
`cellar top --once`, pointed at the standby, follows to the leader and shows the same rows.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploykit import ROOT, require_tool

import cellar
from cellar.local_cluster import LocalCluster

SCREENSHOT = ROOT / "bench" / "results" / "status-page.png"
WAIT_S = 60.0
EXPIRE_AFTER_S = 3.0
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--hide-scrollbars"]


class _Rows(HTMLParser):
    """Collects the data-* attributes of table rows and the text of id'd elements."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.ids: dict[str, str] = {}
        self._open_id: str | None = None
        self.has_script = False
        self.refresh = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and any(k.startswith("data-") for k in a):
            self.rows.append(a)
        if tag == "script":
            self.has_script = True
        if tag == "meta" and a.get("http-equiv") == "refresh":
            self.refresh = a.get("content", "")
        if "id" in a and tag == "span":
            self._open_id = a["id"]

    def handle_data(self, data: str) -> None:
        if self._open_id:
            self.ids[self._open_id] = self.ids.get(self._open_id, "") + data

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._open_id = None


def _wait(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("page")
    config = tmp / "master.yaml"
    config.write_text(yaml.safe_dump({"tenants": {"default": {"quota_bytes": "64MiB"},
                                                  "team-a": {"quota_bytes": "32MiB", "quota_objects": 1000}}}))
    with LocalCluster(nodes=3, segment_size="64MiB", ha=True, master_flags={
            "config": config, "heartbeat_interval_s": 0.5, "node_suspect_after_s": 1.5,
            "node_expire_after_s": EXPIRE_AFTER_S}) as c:
        with cellar.connect(c.address) as client:
            for i in range(40):
                client.put(f"page-{i}", bytes([i % 256]) * (512 << 10))
        leader = c.leader()
        c.signal_node(2, signal.SIGSTOP)
        try:
            _wait(lambda: _expired(c, leader), "node-2 to expire")
        finally:
            c.signal_node(2, signal.SIGCONT)
        _wait(lambda: len((c.master_status(leader) or {}).get("nodes", [])) == 3, "node-2 to come back")
        yield c


def _expired(c: LocalCluster, leader: int) -> bool:
    status = c.master_status(leader) or {}
    return "node-2" not in {n["node"] for n in status.get("nodes", [])}


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    binary = require_tool("chromium", "chromium-browser")
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_status_page_in_headless_chromium(cluster: LocalCluster, tmp_path: Path) -> None:
    leader = cluster.leader()
    url = f"http://{cluster.masters[leader].http}/"
    proc = _chromium(["--dump-dom", url], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = _Rows()
    page.feed(proc.stdout)
    status = cluster.master_status(leader)
    assert status is not None
    assert page.ids["role"] == "leader" and page.ids["epoch"] == str(status["epoch"])
    assert not page.has_script and page.refresh.isdigit()
    nodes = {r["data-node"]: r["data-state"] for r in page.rows if "data-node" in r}
    assert nodes == {"node-0": "ACTIVE", "node-1": "ACTIVE", "node-2": "ACTIVE"}
    tenants = {r["data-tenant"] for r in page.rows if "data-tenant" in r}
    assert tenants == {"default", "team-a"}
    kinds = [r["data-kind"] for r in page.rows if "data-kind" in r]
    assert "node_expired" in kinds and "elected" in kinds and "rebuild_done" in kinds

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shot = _chromium([f"--screenshot={SCREENSHOT}", "--window-size=1200,1000", url], tmp_path)
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cellar_top_follows_the_standby_to_the_leader(cluster: LocalCluster) -> None:
    leader = cluster.leader()
    standby = 1 - leader
    proc = subprocess.run([sys.executable, "-m", "cellar", "top", "--once",
                           "--http", cluster.masters[standby].http],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"{cluster.masters[leader].http}  role leader" in out
    for name in ("node-0", "node-1", "node-2", "default", "team-a", "node_expired"):
        assert name in out, (name, out)
    assert "[" in out and "%" in out  # use bars


def test_cellar_top_without_a_master_exits_1() -> None:
    from cellar.etcd_server import free_port

    proc = subprocess.run([sys.executable, "-m", "cellar", "top", "--once",
                           "--http", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no answer" in proc.stderr
