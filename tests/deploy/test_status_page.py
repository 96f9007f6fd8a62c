"""The master's status page in a real browser, and `cellar top` on the same cluster.

An HA LocalCluster (etcd + 2 masters + 3 nodes, two tenants with quotas) gets some data, and
one node is stopped past its expiry so the event log has a `node_expired` entry. Headless
Chromium (Debian's `chromium`, driven by selenium through Debian's `chromium-driver`, with
JavaScript switched off: the page must read without it) loads the leader's `/`; the test reads
the DOM for the role, epoch, every node with its state, every tenant and the events, and takes
a screenshot into the test's temporary folder; with CELLAR_STATUS_SCREENSHOT=PATH it goes to
PATH instead (the README's bench/results/status-page.png is refreshed only when asked so).
`cellar top --once`, pointed at the standby, follows to the leader and shows the same rows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploykit import ROOT, require_tool

import cellar
from cellar.devtools.local_cluster import LocalCluster

SCREENSHOT_ENV = "CELLAR_STATUS_SCREENSHOT"  # e.g. bench/results/status-page.png, to refresh it
WAIT_S = 60.0
EXPIRE_AFTER_S = 3.0
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--hide-scrollbars"]


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


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium = require_tool("chromium", "chromium-browser")
    driver_path = require_tool("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1000"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_status_page_in_headless_chromium(cluster: LocalCluster, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    leader = cluster.leader()
    browser.get(f"http://{cluster.masters[leader].http}/")
    status = cluster.master_status(leader)
    assert status is not None
    assert browser.find_element(By.ID, "role").text == "leader"
    assert browser.find_element(By.ID, "epoch").text == str(status["epoch"])
    assert not browser.find_elements(By.TAG_NAME, "script")
    refresh = browser.find_element(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
    assert refresh.get_attribute("content").isdigit()
    nodes = {row.get_attribute("data-node"): row.get_attribute("data-state")
             for row in browser.find_elements(By.CSS_SELECTOR, "#nodes tr[data-node]")}
    assert nodes == {"node-0": "ACTIVE", "node-1": "ACTIVE", "node-2": "ACTIVE"}
    for row in browser.find_elements(By.CSS_SELECTOR, "#nodes tr[data-node]"):
        assert row.find_element(By.CSS_SELECTOR, "[role=meter]").is_displayed()  # the use bar
    tenants = {row.get_attribute("data-tenant")
               for row in browser.find_elements(By.CSS_SELECTOR, "#tenants tr[data-tenant]")}
    assert tenants == {"default", "team-a"}
    kinds = [row.get_attribute("data-kind")
             for row in browser.find_elements(By.CSS_SELECTOR, "#events tr[data-kind]")]
    assert "node_expired" in kinds and "elected" in kinds and "rebuild_done" in kinds
    expired = browser.find_element(By.CSS_SELECTOR, '#events tr[data-kind="node_expired"]').text
    assert "node-2" in expired

    asked = os.environ.get(SCREENSHOT_ENV)
    screenshot = ROOT / asked if asked else tmp_path / "status-page.png"
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    from cellar.devtools.ports import free_port

    proc = subprocess.run([sys.executable, "-m", "cellar", "top", "--once",
                           "--http", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no answer" in proc.stderr


def test_a_restarted_single_master_logs_its_rebuild() -> None:
    """kill -9 of a single master: the new process rebuilds from the nodes and its page says so."""
    with LocalCluster(nodes=2, segment_size="64MiB", master_flags={"rebuild_grace_s": 2}) as c:
        with cellar.connect(c.address) as client:
            for i in range(20):
                client.put(f"r-{i}", bytes([i]) * 4096)
        c.restart_master()

        def rebuilt() -> bool:
            with urllib.request.urlopen(f"{c.http_url}/api/v1/events", timeout=5) as reply:
                events = json.loads(reply.read())
            return any(e["kind"] == "rebuild_done" and e["message"].startswith("rebuild done: 20 objects")
                       for e in events)

        _wait(rebuilt, "the restarted master's rebuild_done event")
