"""bench/compare.py: medians, the direction of latency rows, and which rows fall apart."""

from __future__ import annotations

from cellar.bench.compare import compare


def run(ops: float, p50: float, ceiling: float = 4.0) -> dict:
    return {"ceilings_measured": [{"tcp_GBps": ceiling}], "results": [
        {"kind": "data", "transport": "tcp", "api": "bytes", "op": "put", "size_bytes": 65536,
         "batch": 16, "ops_per_s": ops},
        {"kind": "latency", "transport": "tcp", "op": "get", "size_bytes": 65536, "p50_us": p50},
    ]}


def test_ratios_higher_is_better_and_apart_rows_are_named() -> None:
    before = [run(100, 500), run(110, 520), run(90, 510)]
    after = [run(200, 1000), run(210, 1040), run(190, 1020)]  # twice the rate, twice the latency
    text = compare(before, after)
    assert "| data tcp bytes put 65536 16 | 100.0 (100, 110, 90) | 200.0" in text
    assert text.count("| 2.00 |") == 1 and text.count("| 0.50 |") == 1  # latency inverted
    assert "data tcp bytes put 65536 16: faster after" in text
    assert "latency tcp get 65536: slower after" in text
    assert "ranges overlap in 0 of 2 rows" in text


def test_overlapping_runs_are_within_noise() -> None:
    text = compare([run(100, 500), run(140, 520)], [run(120, 510), run(130, 530)])
    assert "ranges overlap in 2 of 2 rows" in text and "apart:" not in text
