"""`cellar bench`'s report logic: which ceiling each ratio uses and which targets are met."""

from __future__ import annotations

from typing import Any

from cellar.bench.run import markdown, targets

MiB = 1 << 20


def _row(transport: str, api: str, op: str, size: int, batch: int, gbps: float,
         ops_per_s: float = 1.0) -> dict[str, Any]:
    return {"kind": "data", "transport": transport, "api": api, "op": op, "size_bytes": size,
            "batch": batch, "GBps": gbps, "ops_per_s": ops_per_s}


def _report(**ceilings: float) -> dict[str, Any]:
    results = [_row("tcp", "zero_copy", op, 4 * MiB, 16, 2.7) for op in ("put", "get")]
    results += [_row("shm", "zero_copy", op, 4 * MiB, 16, 6.5) for op in ("put", "get")]
    results += [_row("tcp", "zero_copy", "get", 64 << 10, 128, 1.4, 21_000),
                _row("tcp", "zero_copy", "put", 64 << 10, 128, 0.9, 13_000)]
    results.append({"kind": "metadata", "op": "put", "objects": 10_000, "keys_per_s": 60_000})
    results.append({"kind": "metadata", "op": "put", "objects": 1_000_000, "keys_per_s": 49_999})
    return {"date": "d", "host": "h", "cpus": 2, "ceilings": ceilings, "results": results}


def test_tcp_ratios_use_the_issues_ceiling_and_show_the_stricter_one():
    report = _report(tcp_issue_GBps=3.0, tcp_GBps=4.5, tcp_cold_GBps=2.5,
                     memcpy_aligned_GBps=10.0)
    got = {name: (measured, met) for name, measured, met in targets(report)}
    issue = got["TCP batched put/get 1-16 MiB >= 0.85 x loopback ceiling (zero_copy API)"]
    assert issue == ("worst 0.90 (put 4 MiB x16); median 0.90; best 0.90", True)
    strict = got["TCP batched put/get 1-16 MiB >= 0.85 x page-aligned loopback ceiling "
                 "(stricter) (zero_copy API)"]
    assert strict == ("worst 0.60 (put 4 MiB x16); median 0.60; best 0.60", False)
    assert got["shm batched put/get 1-16 MiB >= 0.6 x aligned memcpy (zero_copy API)"][1]
    assert got["TCP 64 KiB x128 get >= 20k ops/s"] == ("21,000 ops/s", True)
    assert got["TCP 64 KiB x128 put >= 20k ops/s"] == ("13,000 ops/s", False)
    meta = got["metadata PutStart+PutEnd >= 50k keys/s at batch 128 (objects: 10,000, 1,000,000)"]
    assert meta == ("lowest 49,999 keys/s at 1,000,000", False)
    table = markdown(report)
    assert "| tcp | zero_copy | 4 MiB | 16 | 2.70 | 1 | 0.90 |" in table


def test_an_older_report_without_the_issue_ceiling_uses_the_aligned_one():
    report = _report(tcp_GBps=3.0, memcpy_aligned_GBps=10.0)
    names = [name for name, _, _ in targets(report)]
    assert not any("stricter" in name for name in names)
    got = dict((name, met) for name, _, met in targets(report))
    assert got["TCP batched put/get 1-16 MiB >= 0.85 x loopback ceiling (zero_copy API)"]
