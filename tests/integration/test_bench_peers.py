"""`make bench-peers`: the report's arithmetic, and the Cellar side of a row on a real cluster.

The peers themselves (Mooncake Store, Valkey) live in their own venv and are exercised by
`make bench-peers` only; what is checked here is that the harness measures what it says."""

from __future__ import annotations

import mmap
from typing import Any

from cellar.bench.peers import ROWS, CellarPeer, Row, report, run_row

KiB = 1 << 10


def _result(system: str, row: Row, ops_per_s: float) -> dict[str, Any]:
    return {"system": system, "op": row.op, "size_bytes": row.size_bytes, "batch": row.batch,
            "ops": 100, "ops_per_s": ops_per_s, "GBps": ops_per_s * row.size_bytes / 1e9,
            "p50_us": 1e6 / ops_per_s}


def test_report_ranges_ratios_taken_within_each_run():
    row = ROWS[1]
    assert row.name == "64 KiB get, one at a time" and ROWS[3].name == "64 KiB get, batches of 16"
    # Run 1: Cellar 1000 against Mooncake 2000 (0.5); run 2: 3000 against 1500 (2.0). Ratios
    # of the ranges (1000/2000 .. 3000/1500 mixed across runs) would give other numbers.
    runs = [{"ceiling_GBps": 2.0, "results": [_result("cellar", row, 1000), _result("mooncake", row, 2000)]},
            {"ceiling_GBps": 4.0, "results": [_result("cellar", row, 3000), _result("mooncake", row, 1500)]}]
    text = report(runs, ["cellar", "mooncake"], [row], 1.0, 0)
    line = next(x for x in text.splitlines() if x.startswith("| 64 KiB get"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "1,000-3,000" and cells[2] == "1,500-2,000"
    assert cells[3] == "0.50-2.00"                 # Cellar / Mooncake, within each run
    gb = 1000 * row.size_bytes / 1e9
    assert cells[4].startswith(f"{gb:.2f}-")       # GB/s, and its share of each run's ceiling
    assert "2.00-4.00 GB/s" in text               # the ceiling's range is in the header
    assert "`guest_halt_poll_ns`): 0 ns" in text  # and the halt-poll window it ran under


def test_cellar_rows_run_on_a_real_cluster_and_clean_up(make_cluster, connect_to):
    cluster = make_cluster(nodes=1, segment_size="64MiB")
    buffer = mmap.mmap(-1, 16 * 64 * KiB)
    buffer[:] = bytes(range(256)) * (len(buffer) // 256)
    peer = CellarPeer(cluster.address, buffer)
    try:
        for i, row in enumerate((Row("put", 64 * KiB, 1), Row("get", 64 * KiB, 1),
                                 Row("put", 64 * KiB, 16), Row("get", 64 * KiB, 16))):
            got = run_row(peer, row, 0.2, f"t{i}")
            assert got["ops"] >= row.batch and got["ops"] % row.batch == 0
            assert got["ops_per_s"] > 0 and got["p50_us"] > 0
    finally:
        peer.close()
    # every row removed what it wrote: a long run never fills the node's segment
    assert connect_to(cluster).list_keys() == []
