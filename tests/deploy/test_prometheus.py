"""Prometheus for real (Debian's `prometheus` package) against a running HA cluster.

One module-scoped setup: `cellar up --ha`'s LocalCluster (etcd + 2 masters) with 3 nodes that
serve /metrics, traffic from a real client (whose SDK metrics are served too once
`cellar.client.metrics` exists), and a Prometheus that loads deploy/prometheus/prometheus.yml
with only its targets swapped for this cluster's and its intervals shortened, and the very
deploy/prometheus/rules.yml. Then:
- `promtool check config` / `check rules` pass on the files as shipped;
- every PromQL expression of deploy/grafana/cellar.json returns data, and so does every metric
  it names (so `x or vector(0)` could not hide a missing metric);
- every alert's measured quantity (`(<quantity>) <op> <threshold>`) returns data, every rule
  evaluates without error;
- a node stopped (SIGSTOP) past the master's expiry makes CellarNodeExpired fire.
Waiting is polling with a deadline (data appears after a few scrapes), never a timed assertion.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from deploykit import DEPLOY, require_tool

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.devtools.ports import free_port

SCRAPE_INTERVAL = "1s"
RATE_WINDOW = "15s"          # stands for Grafana's $__rate_interval
DATA_WAIT_S = 60.0           # how long an expression may take to show data (a few scrapes)
EXPIRE_AFTER_S = 3.0
MAX_TRAFFIC_OPS = 200_000    # the traffic thread's bound besides the stop event
VALUE_BYTES = 64 << 10
_METRIC = re.compile(r"\b((?:master|node|cellar_client)_[a-z0-9_]+)\b")
_ALERT_EXPR = re.compile(r"^\((?P<quantity>.+)\)\s*(?P<op>[<>]=?|==|!=)\s*(?P<threshold>[0-9.e+-]+)$", re.S)

try:  # the SDK's cache metrics (issue 11, built on branch sdk-buffers)
    from cellar.client import metrics as client_metrics
except ImportError:  # not merged yet: the client panels are skipped, said so in the report
    client_metrics = None


def _get(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return json.loads(reply.read())


class Prom:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = _get(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return result if body["data"]["resultType"] in ("vector", "matrix") else [result]

    def wait_for_data(self, expr: str, timeout_s: float = DATA_WAIT_S) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)


def _traffic(client: Any, stop: threading.Event) -> None:
    value = bytes(range(256)) * (VALUE_BYTES // 256)
    for i in range(MAX_TRAFFIC_OPS):
        if stop.is_set():
            return
        key = f"k{i % 400}"
        missing = f"missing-{i}"
        # each call on its own: a put of a key stored already raises, and must not skip the rest
        # (it did, and after the first 400 keys only PutStart moved)
        calls: list[tuple[Any, ...]] = [
            (client.put, (key, value)), (client.get, (key,)),
            (client.exists_many, ([key, missing],)), (client.prefix_len, ([key, missing],)),
            (client.get, (missing,)),
            # a prefix get whose first key misses: the stored key after it is found but not
            # used (cellar_client_unused_keys_total{reason="prefix"}), in tokens too
            (client.get_many_into, ([missing, key], [bytearray(VALUE_BYTES)] * 2),
             {"prefix": True}),
            (client.lookup, ([key, missing],))]
        if i % 50 == 0:  # bad input, refused by the SDK: cellar_client_errors_total{kind}
            calls.append((client.get, ("",)))
        for call, args, *kwargs in calls:
            with contextlib.suppress(cellar.CellarError):
                call(*args, **(kwargs[0] if kwargs else {}))
        time.sleep(0.005)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, LocalCluster]]:
    prometheus = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prom")
    master_config = tmp / "master.yaml"
    master_config.write_text(yaml.safe_dump({"tenants": {"default": {"quota_bytes": "150MiB"}}}))
    cluster = LocalCluster(nodes=0, segment_size="64MiB", ha=True, master_flags={
        "config": master_config, "heartbeat_interval_s": 0.5, "node_suspect_after_s": 1.5,
        "node_expire_after_s": EXPIRE_AFTER_S})
    proc = None
    stop = threading.Event()
    thread = None
    client = None
    try:
        cluster.start()
        node_http = []
        for _ in range(3):
            node_http.append(f"127.0.0.1:{free_port()}")
            cluster.add_node(http=node_http[-1])
        client_target = []
        if client_metrics is not None:
            client_target = [f"127.0.0.1:{client_metrics.serve_metrics(0)}"]
        # tcp: the node's byte counters (node_bytes_*, on the dashboard) count its data
        # server's payload; shm copies bypass it and would leave them at 0
        client = cellar.connect(cluster.address, transport="tcp")
        client.tokens_per_key = 16  # as the engine adapters do: the token series move
        thread = threading.Thread(target=_traffic, args=(client, stop), daemon=True)
        thread.start()

        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        config["global"].update(scrape_interval=SCRAPE_INTERVAL, evaluation_interval=SCRAPE_INTERVAL)
        config["rule_files"] = [str(DEPLOY / "prometheus" / "rules.yml")]
        targets = {"cellar-master": [m.http for m in cluster.masters], "cellar-node": node_http,
                   "cellar-client": client_target}
        assert {job["job_name"] for job in config["scrape_configs"]} == set(targets)
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = f"127.0.0.1:{free_port()}"
        log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address={web}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        prom = Prom(f"http://{web}")
        deadline = time.monotonic() + DATA_WAIT_S
        while True:
            with contextlib.suppress(OSError, ValueError):
                up = prom.query("up")
                if len(up) == len(sum(targets.values(), [])) and all(r["value"][1] == "1" for r in up):
                    break
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"targets not all up: {prom.query('up')}"
            time.sleep(0.5)
        yield prom, cluster
    finally:
        stop.set()
        if thread is not None:
            thread.join(30)
        if client is not None:
            client.close()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if client_metrics is not None:
            client_metrics.stop_metrics_servers()
        cluster.stop()


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads((DEPLOY / "grafana" / "cellar.json").read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"{panel['title']} / {target['refId']}",
                        target["expr"].replace("$__rate_interval", RATE_WINDOW)))
    return out


def alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    return [r for group in rules["groups"] for r in group["rules"] if "alert" in r]


def _skip_client_metrics(prom: Prom, expr: str) -> None:
    """Without the SDK's metrics module only the expression's syntax can be checked here."""
    if "cellar_client_" in expr and client_metrics is None:
        prom.query(expr)  # Prometheus parses and evaluates it (no data to require)
        pytest.skip("cellar.client.metrics is not in this tree yet (branch sdk-buffers): "
                    "syntax checked, data not")


def test_promtool_accepts_the_shipped_config_and_rules() -> None:
    promtool = require_tool("promtool")
    configs = sorted((DEPLOY / "prometheus").glob("prometheus*.yml"))
    assert len(configs) == 4  # plain and TLS, default and loopback
    for argv in ([*(["check", "config", str(c)] for c in configs)] +
                 [["check", "rules", str(DEPLOY / "prometheus" / "rules.yml")]]):
        proc = subprocess.run([promtool, *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("where", "expr"), dashboard_exprs(), ids=[w for w, _ in dashboard_exprs()])
def test_every_dashboard_query_returns_data(stack: tuple[Prom, LocalCluster], where: str, expr: str) -> None:
    prom, _ = stack
    _skip_client_metrics(prom, expr)
    for name in sorted(set(_METRIC.findall(expr))):
        assert prom.wait_for_data(f'count({{__name__="{name}"}})'), f"{where}: no series {name}"
    assert prom.wait_for_data(expr), f"{where}: {expr} returned nothing"


def test_the_sdk_records_its_traffic(stack: tuple[Prom, LocalCluster]) -> None:
    """The client series exist at 0 from the start, so data alone proves little: the real
    client's get/put/exists counters and its hits must grow under the traffic."""
    if client_metrics is None:
        pytest.skip("cellar.client.metrics is not in this tree yet (branch sdk-buffers)")
    prom, _ = stack
    for expr in ('sum(cellar_client_requests_total{op="put"}) > 0',
                 'sum(cellar_client_requests_total{op="get"}) > 0',
                 'sum(cellar_client_key_hits_total{op="get"}) > 0',
                 'sum(cellar_client_keys_total{op="exists"}) > sum(cellar_client_key_hits_total{op="exists"})',
                 'sum(cellar_client_bytes_total{op="get"}) > 0',
                 'sum(cellar_client_wait_seconds_count{op="get"}) > 0',
                 'sum(cellar_client_tokens_reused_total{op="get"}) > 0',
                 'sum(cellar_client_tokens_total{op="lookup"}) > '
                 'sum(cellar_client_tokens_reused_total{op="lookup"})',
                 'sum(cellar_client_unused_keys_total{op="get",reason="prefix"}) > 0',
                 'sum(cellar_client_unused_tokens_total{op="get",reason="prefix"}) > 0'):
        assert prom.wait_for_data(expr), f"the SDK did not record: {expr}"


# The master and node counters and gauges the dashboard draws that this traffic must move.
TRAFFIC_SERIES = (
    f"sum(increase(master_put_start_keys_total[{RATE_WINDOW}])) > 0",
    f"sum(increase(master_get_replica_list_keys_total[{RATE_WINDOW}])) > 0",
    f"sum(increase(master_exist_key_keys_total[{RATE_WINDOW}])) > 0",
    f"sum(increase(master_rpc_latency_seconds_count[{RATE_WINDOW}])) > 0",
    "sum(node_bytes_written_total) > 0",  # only the first 400 puts write: the rest exist
    f"sum(increase(node_bytes_read_total[{RATE_WINDOW}])) > 0",
    "sum(master_key_count) > 0",
    "sum(master_allocated_bytes) > 0",
    "sum(master_segment_used_bytes) > 0",
    "sum(master_tenant_used_bytes) > 0",
)


def test_the_master_and_nodes_record_the_traffic(stack: tuple[Prom, LocalCluster]) -> None:
    """Like the SDK's: the dashboard's master and node series exist at 0 from the start, so a
    query that returns data proves only the names; under the traffic these must grow."""
    prom, _ = stack
    dashboard = " ".join(expr for _, expr in dashboard_exprs())
    for expr in TRAFFIC_SERIES:
        (name,) = set(_METRIC.findall(expr))
        assert name in dashboard or name.removesuffix("_count") + "_bucket" in dashboard, \
            f"{name} is not on the dashboard"
        assert prom.wait_for_data(expr), f"the cluster did not record its traffic: {expr}"


@pytest.mark.parametrize("rule", alert_rules(), ids=[r["alert"] for r in alert_rules()])
def test_every_alert_watches_a_quantity_that_has_data(stack: tuple[Prom, LocalCluster], rule: dict[str, Any]) -> None:
    prom, _ = stack
    match = _ALERT_EXPR.match(rule["expr"].strip())
    assert match, f"{rule['alert']}: write the expression as (<quantity>) <op> <threshold>"
    quantity = match.group("quantity")
    for name in sorted(set(_METRIC.findall(quantity))):
        assert prom.wait_for_data(f'count({{__name__="{name}"}})'), f"{rule['alert']}: no series {name}"
    assert prom.wait_for_data(quantity), f"{rule['alert']}: {quantity} returned nothing"
    prom.query(rule["expr"])  # the whole expression evaluates (empty = not firing)


def test_rules_evaluate_without_errors(stack: tuple[Prom, LocalCluster]) -> None:
    prom, _ = stack
    deadline = time.monotonic() + DATA_WAIT_S
    while True:
        groups = _get(f"{prom.base}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad


def test_a_node_stopped_past_expiry_fires_cellar_node_expired(stack: tuple[Prom, LocalCluster]) -> None:
    prom, cluster = stack
    firing: list[dict[str, Any]] = []
    cluster.signal_node(2, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + DATA_WAIT_S
        while not firing and time.monotonic() < deadline:
            alerts = _get(f"{prom.base}/api/v1/alerts")["data"]["alerts"]
            firing = [a for a in alerts if a["labels"]["alertname"] == "CellarNodeExpired"
                      and a["state"] == "firing"]
            time.sleep(0.5)
    finally:
        cluster.signal_node(2, signal.SIGCONT)
    assert firing, f"CellarNodeExpired never fired: {_get(f'{prom.base}/api/v1/alerts')}"
    assert float(firing[0]["value"]) >= 1
    leader_status = cluster.master_status(cluster.leader())
    assert leader_status is not None
    events = _get(f"http://{cluster.masters[cluster.leader()].http}/api/v1/events")
    assert any(e["kind"] == "node_expired" and "node-2" in e["message"] for e in events)

