"""deploy/grafana/cellar.json: the structure Grafana needs (no Grafana here to load it).

Its queries are checked for real against Prometheus in test_prometheus.py; here: schema
version, the data source variable every panel uses, a query on every panel, unique ids, a
grid that fits, and a panel for each thing the dashboard must show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deploykit import DEPLOY

DASHBOARD = DEPLOY / "grafana" / "cellar.json"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_schema_version_and_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 36  # Grafana 9+
    assert dashboard["uid"] == "cellar" and dashboard["title"]


def test_datasource_variable_is_used_by_every_panel_and_query(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


def test_every_panel_has_a_query(dashboard: dict[str, Any]) -> None:
    assert len(panels(dashboard)) >= 20
    for panel in panels(dashboard):
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]


def test_ids_are_unique_and_the_grid_fits(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0


@pytest.mark.parametrize("needle", [
    "master_total_capacity_bytes", "master_allocated_bytes", "master_segment_used_bytes",
    "master_tenant_used_bytes", "master_key_count", "master_put_start_keys_total",
    "master_get_replica_list_keys_total", "master_rpc_latency_seconds_bucket",
    "master_evicted_key_count", "master_pin_count", "node_grant_refusals_total",
    "master_is_leader", "master_epoch", "master_takeover_duration_seconds",
    "cellar_client_request_hits_total", "cellar_client_key_hits_total",
    "cellar_client_request_bytes_bucket", "cellar_client_lookup_seconds_bucket",
    "cellar_client_load_seconds_bucket", "cellar_client_wait_seconds_bucket",
    "cellar_client_unused_keys_total", "cellar_client_tokens_reused_total",
    "cellar_client_tokens_total", "cellar_client_unused_tokens_total",
])
def test_dashboard_charts(dashboard: dict[str, Any], needle: str) -> None:
    exprs = [t["expr"] for p in panels(dashboard) for t in p["targets"]]
    assert any(needle in e for e in exprs), needle


def test_docs_list_every_panel(dashboard: dict[str, Any]) -> None:
    """docs/deploy.md's panel table names every panel of the dashboard (and no other)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    table = text.split("### Dashboard panels", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("|")[2].strip() for line in table.splitlines()
              if line.startswith("| ") and not line.startswith("| row")}
    assert listed == {p["title"] for p in panels(dashboard)}
