"""Remove latency: what an acknowledged, durable remove costs (`make bench` rows).

Every remove is acknowledged only once its tombstone bound is in the removal log
(cellar.master.serving.removal_log: a local file for a single master, etcd under HA). These
rows time, against a running cluster, from the SDK:
- a single `remove` of one key (p50 and p99 over `--samples` removes);
- `remove_many` of 128 keys (one Remove RPC; p50/p99 over `--reps` batches);
- `remove_prefix` of a prefix holding 128 keys (p50/p99 over `--reps`).
Keys are put (untimed) right before each timed remove. Run alone:
`python -m cellar.bench.removes --address HOST:PORT` (prints one JSON line per row).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import cellar

BATCH = 128
VALUE = b"r" * 4096


def percentiles(us: list[float]) -> dict[str, float]:
    us = sorted(us)
    return {"p50_us": round(us[len(us) // 2], 1), "p99_us": round(us[min(len(us) - 1, int(len(us) * 0.99))], 1)}


def measure(client: cellar.Client, samples: int, reps: int) -> list[dict[str, Any]]:
    run = f"rm/{os.getpid()}"
    single: list[float] = []
    for i in range(samples):
        key = f"{run}/one/{i}"
        client.put(key, VALUE)
        start = time.perf_counter()
        assert client.remove(key)
        single.append((time.perf_counter() - start) * 1e6)
    many: list[float] = []
    prefix: list[float] = []
    for rep in range(reps):
        keys = [f"{run}/many/{rep}/{i}" for i in range(BATCH)]
        client.put_many(dict.fromkeys(keys, VALUE))
        start = time.perf_counter()
        assert all(client.remove_many(keys))
        many.append((time.perf_counter() - start) * 1e6)
        keys = [f"{run}/prefix/{rep}/{i}" for i in range(BATCH)]
        client.put_many(dict.fromkeys(keys, VALUE))
        start = time.perf_counter()
        assert client.remove_prefix(f"{run}/prefix/{rep}/") == BATCH
        prefix.append((time.perf_counter() - start) * 1e6)
    return [{"kind": "removes", "op": op, "keys": keys_per_call, "samples": len(values),
             **percentiles(values)}
            for op, keys_per_call, values in (("remove", 1, single), ("remove_many", BATCH, many),
                                              ("remove_prefix", BATCH, prefix))]


def markdown_rows(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r.get("kind") == "removes"]
    if not rows:
        return []
    lines = ["", "| durable remove (removal log) | keys per call | p50 µs | p99 µs |",
             "|---|---|---|---|"]
    lines += [f"| {r['op']} | {r['keys']} | {r['p50_us']:.0f} | {r['p99_us']:.0f} |" for r in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.removes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True)
    parser.add_argument("--samples", type=int, default=1000, help="single removes timed")
    parser.add_argument("--reps", type=int, default=100, help="batches of 128 timed, per op")
    parser.add_argument("--quick", action="store_true", help="200 single removes, 20 batches")
    args = parser.parse_args(argv)
    samples, reps = (200, 20) if args.quick else (args.samples, args.reps)
    with cellar.connect(args.address, timeout_s=30) as client:
        for row in measure(client, samples, reps):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
