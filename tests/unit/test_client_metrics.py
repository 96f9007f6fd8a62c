"""client.metrics: recording changes the exposed values, under the documented names."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import generate_latest

from cellar.client import metrics


def _value(name: str, **labels: str) -> float:
    got = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_every_documented_series_is_exposed_from_the_start() -> None:
    text = generate_latest(metrics.REGISTRY).decode()
    for name in ("cellar_client_requests_total", "cellar_client_request_hits_total",
                 "cellar_client_keys_total", "cellar_client_key_hits_total",
                 "cellar_client_bytes_total", "cellar_client_request_bytes_bucket",
                 "cellar_client_late_keys_total", "cellar_client_lookup_seconds_bucket",
                 "cellar_client_load_seconds_bucket", "cellar_client_wait_seconds_bucket"):
        for op in metrics.OPS:
            assert f'{name}{{' in text and f'op="{op}"' in text, (name, op)
    assert 'reason="deadline"' in text and 'reason="vanished"' in text


def test_recording_moves_the_counters_and_histograms() -> None:
    before = {n: _value(n, op="get") for n in (
        "cellar_client_requests_total", "cellar_client_request_hits_total",
        "cellar_client_keys_total", "cellar_client_key_hits_total", "cellar_client_bytes_total",
        "cellar_client_request_bytes_count", "cellar_client_lookup_seconds_count",
        "cellar_client_load_seconds_sum", "cellar_client_wait_seconds_count")}
    late_before = _value("cellar_client_late_keys_total", op="get", reason="deadline")
    vanished_before = _value("cellar_client_late_keys_total", op="get", reason="vanished")
    metrics.record_request("get", keys=8, hits=8, nbytes=8 << 16, lookup_s=0.001,
                           load_s=0.25, wait_s=0.3)
    metrics.record_request("get", keys=4, hits=2, nbytes=1 << 16, late_deadline=1,
                           late_vanished=1)
    delta = {n: _value(n, op="get") - v for n, v in before.items()}
    assert delta["cellar_client_requests_total"] == 2
    assert delta["cellar_client_request_hits_total"] == 1  # only the first hit every key
    assert delta["cellar_client_keys_total"] == 12
    assert delta["cellar_client_key_hits_total"] == 10
    assert delta["cellar_client_bytes_total"] == 9 << 16
    assert delta["cellar_client_request_bytes_count"] == 2
    assert delta["cellar_client_lookup_seconds_count"] == 1
    assert delta["cellar_client_load_seconds_sum"] == pytest.approx(0.25)
    assert delta["cellar_client_wait_seconds_count"] == 1
    assert _value("cellar_client_late_keys_total", op="get", reason="deadline") == \
        late_before + 1
    assert _value("cellar_client_late_keys_total", op="get", reason="vanished") == \
        vanished_before + 1
    assert _value("cellar_client_requests_total", op="put") == _value(
        "cellar_client_requests_total", op="put")  # other ops untouched


def test_errors_by_kind_and_unknown_ops() -> None:
    class Unavailable(Exception):
        pass

    before = _value("cellar_client_errors_total", op="put", kind="Unavailable")
    metrics.record_error("put", Unavailable("x"))
    assert _value("cellar_client_errors_total", op="put", kind="Unavailable") == before + 1
    with pytest.raises(ValueError):
        metrics.record_request("scan", keys=1, hits=1)
    with pytest.raises(ValueError):
        metrics.record_error("scan", "X")


def test_disabled_recording_changes_nothing() -> None:
    before = _value("cellar_client_requests_total", op="exists")
    metrics.set_enabled(False)
    try:
        metrics.record_request("exists", keys=3, hits=1)
    finally:
        metrics.set_enabled(True)
    assert _value("cellar_client_requests_total", op="exists") == before


def test_serve_metrics_exposes_the_registry_on_loopback() -> None:
    metrics.record_request("prefix_len", keys=256, hits=17)
    port = metrics.serve_metrics(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        metrics.stop_metrics_servers()
    assert 'cellar_client_keys_total{op="prefix_len"}' in text
