"""client.metrics: recording changes the exposed values, under the documented names."""

from __future__ import annotations

import re
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
                 "cellar_client_unused_keys_total", "cellar_client_lookup_seconds_bucket",
                 "cellar_client_load_seconds_bucket", "cellar_client_wait_seconds_bucket",
                 "cellar_client_tokens_total", "cellar_client_tokens_reused_total",
                 "cellar_client_unused_tokens_total"):
        for op in metrics.OPS:
            assert re.search(rf'^{name}{{[^}}]*op="{op}"', text, re.M), (name, op)
    for reason in ("deadline", "refused", "prefix", "vanished"):
        assert f'cellar_client_unused_keys_total{{op="get",reason="{reason}"}}' in text
        assert f'cellar_client_unused_tokens_total{{op="get",reason="{reason}"}}' in text


def test_recording_moves_the_counters_and_histograms() -> None:
    before = {n: _value(n, op="get") for n in (
        "cellar_client_requests_total", "cellar_client_request_hits_total",
        "cellar_client_keys_total", "cellar_client_key_hits_total", "cellar_client_bytes_total",
        "cellar_client_request_bytes_count", "cellar_client_lookup_seconds_count",
        "cellar_client_load_seconds_sum", "cellar_client_wait_seconds_count")}
    late_before = _value("cellar_client_unused_keys_total", op="get", reason="deadline")
    vanished_before = _value("cellar_client_unused_keys_total", op="get", reason="vanished")
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
    assert _value("cellar_client_unused_keys_total", op="get", reason="deadline") == \
        late_before + 1
    assert _value("cellar_client_unused_keys_total", op="get", reason="vanished") == \
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


def _series_values(op: str) -> dict[str, float]:
    names = ("cellar_client_requests_total", "cellar_client_request_hits_total",
             "cellar_client_keys_total", "cellar_client_key_hits_total",
             "cellar_client_bytes_total", "cellar_client_request_bytes_count",
             "cellar_client_request_bytes_sum", "cellar_client_wait_seconds_count",
             "cellar_client_wait_seconds_sum")
    out = {n: _value(n, op=op) for n in names}
    for le in ("1024.0", "65536.0", "262144.0", "+Inf"):
        out[f"bytes_le_{le}"] = _value("cellar_client_request_bytes_bucket", op=op, le=le)
    for le in ("0.001", "0.0025", "+Inf"):
        out[f"wait_le_{le}"] = _value("cellar_client_wait_seconds_bucket", op=op, le=le)
    return out


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def test_a_batch_record_equals_one_record_per_caller() -> None:
    """record_requests (the asyncio face's coalesced gets) moves every series exactly as one
    record_request(keys=1) per caller would: sizes mixed, misses, one shared wait."""
    sizes = [65536, None, 65536, 200_000, 1, None, 65536]
    wait_s = 0.002
    start = _series_values("get")
    for n in sizes:
        metrics.record_request("get", keys=1, hits=int(n is not None), nbytes=n or 0,
                               wait_s=wait_s)
    one_by_one = _delta(start, _series_values("get"))
    start = _series_values("get")
    metrics.record_requests("get", sizes, wait_s=wait_s)
    batched = _delta(start, _series_values("get"))
    assert batched == pytest.approx(one_by_one)
    assert batched["cellar_client_requests_total"] == 7
    assert batched["cellar_client_request_hits_total"] == 5
    assert batched["bytes_le_65536.0"] == 6  # two misses (0 B), 1 B and three 64 KiB
    assert batched["wait_le_0.0025"] == 7 and batched["wait_le_0.001"] == 0
    with pytest.raises(ValueError):
        metrics.record_requests("scan", [1])


def test_bucket_bounds_follow_prometheus_le_rule() -> None:
    """An observation equal to a bound lands in that bound's bucket (le = less or equal)."""
    before = _value("cellar_client_request_bytes_bucket", op="put", le="1024.0")
    metrics.record_request("put", keys=1, hits=1, nbytes=1024)
    assert _value("cellar_client_request_bytes_bucket", op="put", le="1024.0") == before + 1


def test_tokens_and_unused_keys_by_reason() -> None:
    """§7.2's token hit ratio and 'found but not used': tokens follow the keys at the given
    tokens per key; a call without it moves no token series; each reason has its own series."""
    def tokens() -> dict[str, float]:
        out = {n: _value(n, op="get") for n in ("cellar_client_tokens_total",
                                                 "cellar_client_tokens_reused_total")}
        for reason in metrics.UNUSED_REASONS:
            out[f"keys_{reason}"] = _value("cellar_client_unused_keys_total", op="get",
                                           reason=reason)
            out[f"tokens_{reason}"] = _value("cellar_client_unused_tokens_total", op="get",
                                             reason=reason)
        return out

    start = tokens()
    metrics.record_request("get", keys=10, hits=4, late_deadline=1, refused=2, cut=3,
                           tokens_per_key=64)
    metrics.record_vanished("get", 2, tokens_per_key=64)
    metrics.record_request("get", keys=5, hits=5)  # tokens unknown: no token series moves
    metrics.record_requests("get", [1, None, 1], tokens_per_key=16)
    d = _delta(start, tokens())
    assert d["cellar_client_tokens_total"] == 10 * 64 + 3 * 16
    assert d["cellar_client_tokens_reused_total"] == 4 * 64 + 2 * 16
    assert (d["keys_deadline"], d["keys_refused"], d["keys_prefix"], d["keys_vanished"]) == \
        (1, 2, 3, 2)
    assert (d["tokens_deadline"], d["tokens_refused"], d["tokens_prefix"],
            d["tokens_vanished"]) == (64, 128, 192, 128)
    with pytest.raises(AssertionError):  # more keys accounted for than were asked
        metrics.record_request("get", keys=2, hits=1, refused=1, cut=1)
