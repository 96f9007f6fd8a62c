"""Spinning for replies, on against off (`make bench-spin`): what CELLAR_SPIN_US buys and costs.

The SDK polls for a reply due within microseconds before it blocks (transfer/spin_wait.py).
These rows measure that against `CELLAR_SPIN_US=0` on one cluster (a master and one node,
child processes), in alternated rounds whose order flips each round, so a neighbour's burst
lands on both sides: per round and side, a fresh client, then
- p50 of a 256-key `lookup`, a 1-key `prefix_len`, a single 64 KiB `get` and `put` (tcp);
- keys/s of 16 and 128 x 64 KiB `put_many` and `get_many` (tcp, the median of 31 and 7
  batches per round), to show what batches gain or lose (they do not spin);
- the client's CPU seconds per single operation (what the spinning costs).
The report gives each row's median over rounds per side and the median of the per-round
ratios (on / off). Run: `python -m cellar.bench.spin [--rounds 6] [--samples 400]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.transfer.spin_wait import DEFAULT_SPIN_US

KIB = 1 << 10
PROBE_KEYS = 256
BATCHES = ((16, 31), (128, 7))  # (keys per batch, batches per round and side: rate = median)
SIDES = {"off": "0", "on": ""}  # "" = the default window


def p50_us(call: Callable[[], Any], samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def one_side(address: str, side: str, round_no: int, samples: int) -> dict[str, float]:
    if SIDES[side]:
        os.environ["CELLAR_SPIN_US"] = SIDES[side]
    else:
        os.environ.pop("CELLAR_SPIN_US", None)
    run = f"spin/{round_no}/{side}"
    value = os.urandom(64 * KIB)
    out: dict[str, float] = {}
    with cellar.connect(address, transport="tcp") as client:
        probe = [f"{run}/probe/{i:03d}" for i in range(PROBE_KEYS)]
        client.put_many(dict.fromkeys(probe, b"p"))
        out["lookup 256 keys p50 us"] = p50_us(lambda: client.lookup(probe), samples)
        out["prefix_len 1 key p50 us"] = p50_us(lambda: client.prefix_len(probe[:1]), samples)
        singles = iter(range(samples))
        cpu = time.process_time()
        out["put 64 KiB p50 us"] = p50_us(
            lambda: client.put(f"{run}/one/{next(singles)}", value), samples)
        singles = iter(range(samples))
        out["get 64 KiB p50 us"] = p50_us(lambda: client.get(f"{run}/one/{next(singles)}"),
                                           samples)
        out["client CPU us per single op"] = (time.process_time() - cpu) / (2 * samples) * 1e6
        for count, reps in BATCHES:
            puts, gets = [], []
            for rep in range(reps):
                batch = {f"{run}/many/{rep}/{i:03d}": value for i in range(count)}
                start = time.perf_counter()
                client.put_many(batch)
                puts.append(count / (time.perf_counter() - start))
                start = time.perf_counter()
                client.get_many(list(batch))
                gets.append(count / (time.perf_counter() - start))
                client.remove_prefix(f"{run}/many/")
            out[f"put_many {count} x 64 KiB keys/s"] = statistics.median(puts)
            out[f"get_many {count} x 64 KiB keys/s"] = statistics.median(gets)
        client.remove_prefix(f"{run}/")
    return out


def measure(rounds: int, samples: int) -> dict[str, Any]:
    per_round: list[dict[str, dict[str, float]]] = []
    with LocalCluster(nodes=1, segment_size="1GiB") as cluster:
        for round_no in range(rounds):
            order = ("off", "on") if round_no % 2 == 0 else ("on", "off")
            got = {side: one_side(cluster.address, side, round_no, samples) for side in order}
            per_round.append(got)
            print(f"[spin] round {round_no + 1}/{rounds}: " + ", ".join(
                f"{row} {got['off'][row]:.0f} -> {got['on'][row]:.0f}"
                for row in ("lookup 256 keys p50 us", "get 64 KiB p50 us")), file=sys.stderr)
    rows = []
    for row in per_round[0]["off"]:
        off = [r["off"][row] for r in per_round]
        on = [r["on"][row] for r in per_round]
        rows.append({"row": row, "off": statistics.median(off), "on": statistics.median(on),
                     "ratio_on_off": statistics.median(b / a for a, b in zip(off, on, strict=True)),
                     "off_rounds": off, "on_rounds": on})
    return {"rounds": rounds, "samples": samples, "rows": rows,
            "spin_us_default": DEFAULT_SPIN_US}


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Spinning for replies (default window {report['spin_us_default']} us) against "
             f"`CELLAR_SPIN_US=0`: {report['rounds']} alternated rounds, {report['samples']} "
             "samples per latency row; medians over rounds, and the median of the per-round "
             "ratios.", "", "| row | spin off | spin on | on / off (per-round median) |",
             "|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['row']} | {r['off']:,.0f} | {r['on']:,.0f} | {r['ratio_on_off']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.spin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="alternated rounds (default 6)")
    parser.add_argument("--samples", type=int, default=400,
                        help="calls per latency row per round (default 400)")
    parser.add_argument("--out", default="bench/results",
                        help="folder for spin-<date>-<host>.json and .md (default bench/results)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.samples < 10:
        parser.error("--rounds must be >= 1 and --samples >= 10")
    report = measure(args.rounds, args.samples)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"spin-{time.strftime('%Y-%m-%d')}-{os.uname().nodename}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
