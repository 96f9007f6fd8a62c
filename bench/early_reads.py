"""Early reads, on against off (`make bench-early-reads`): what reading beside the lookup buys.

A get of a key this client read before sends GetReplicas and, at once, the read under the
grant it kept (client/early_reads.py). These rows measure that against
`CELLAR_EARLY_READS=0` on one cluster (a master and one node with a 1 GiB segment, child
processes) in alternated rounds whose order flips each round, two clients open side by side
(one per setting), reading the same 16 stored keys over and over, as `make bench-peers` does:
- p50 of a single `get` of 64 KiB and 1 MiB, over tcp and over shm;
- p50 of `get_many_into` of 16 x 64 KiB and 16 x 1 MiB (page-aligned buffers), tcp and shm.
The report gives each row's median over rounds per side and the median of the per-round
ratios (on / off; below 1 is faster). Run: `python -m cellar.bench.early_reads [--rounds 8]
[--samples 300]`; results in bench/results/early-reads-<date>-<host>.{md,json}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import cellar
from cellar.bench.spin import p50_us
from cellar.devtools.local_cluster import LocalCluster

KIB, MIB = 1 << 10, 1 << 20
KEYS = 16
ROWS = [(transport, size, batch) for transport in ("tcp", "shm")
        for size in (64 * KIB, MIB) for batch in (1, 16)]
SIDES = {"on": "1", "off": "0"}
OUT_DIR = Path(__file__).resolve().parent / "results"


def row_name(transport: str, size: int, batch: int) -> str:
    what = f"{size // KIB} KiB" if size < MIB else f"{size // MIB} MiB"
    return f"{transport} {what} " + ("get, one at a time" if batch == 1
                                     else f"get_many_into x{batch}")


def measure(client: Any, keys: list[str], size: int, batch: int, samples: int) -> float:
    if batch == 1:
        calls = itertools.count()
        return p50_us(lambda: client.get(keys[next(calls) % KEYS]), samples)
    buffers = [cellar.alloc_buffer(size) for _ in range(batch)]

    def many() -> None:
        got = client.get_many_into(keys[:batch], buffers)
        assert got == [size] * batch, got

    return p50_us(many, samples)


def run(rounds: int, samples: int) -> dict[str, Any]:
    results: dict[str, dict[str, list[float]]] = {
        row_name(*row): {side: [] for side in SIDES} for row in ROWS}
    with LocalCluster(1, "1GiB", port=0, http_port=0) as cluster:
        cluster.wait_prefaulted()
        for transport, size, batch in ROWS:
            name = row_name(transport, size, batch)
            clients = {}
            for side, value in SIDES.items():
                os.environ["CELLAR_EARLY_READS"] = value
                clients[side] = cellar.connect(cluster.address, transport=transport)
            os.environ.pop("CELLAR_EARLY_READS", None)
            keys = [f"early/{transport}/{size}/{batch}/{i}" for i in range(KEYS)]
            clients["on"].put_many([(k, os.urandom(size)) for k in keys])
            try:
                for side in SIDES:  # warm: each side learns where the keys are
                    measure(clients[side], keys, size, batch, KEYS)
                for r in range(rounds):
                    order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
                    for side in order:
                        results[name][side].append(
                            measure(clients[side], keys, size, batch, samples))
                kept = clients["on"]._s.locations.kept  # noqa: SLF001 - the bench's own check
                assert kept > 0, f"{name}: no early read was kept"
            finally:
                clients["on"].remove_prefix(f"early/{transport}/{size}/{batch}/")
                for client in clients.values():
                    client.close()
            print(f"[early-reads] {name}: on {statistics.median(results[name]['on']):.0f} us, "
                  f"off {statistics.median(results[name]['off']):.0f} us", flush=True)
    return results


def report(results: dict[str, dict[str, list[float]]], rounds: int, samples: int) -> str:
    lines = [f"Cellar early reads, on against off, {time.strftime('%Y-%m-%d %H:%M')} on "
             f"{socket.gethostname()} (`make bench-early-reads`): a master and one node, "
             f"{rounds} alternated rounds of {samples} calls per side, p50 per round; the "
             "same 16 stored keys read over and over.", "",
             "| row | early reads off, p50 | on, p50 | on / off (median of per-round ratios) |",
             "|---|---|---|---|"]
    for name, sides in results.items():
        ratios = [a / b for a, b in zip(sides["on"], sides["off"], strict=True)]
        lines.append(f"| {name} | {statistics.median(sides['off']):,.0f} us | "
                     f"{statistics.median(sides['on']):,.0f} us | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = run(args.rounds, args.samples)
    text = report(results, args.rounds, args.samples)
    out = args.out or OUT_DIR / f"early-reads-{time.strftime('%Y-%m-%d')}-{socket.gethostname()}.md"
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(text)
    print(f"[early-reads] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
