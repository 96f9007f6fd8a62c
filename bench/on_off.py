"""One SDK switch, on against off, in alternated rounds: the harness the switch benches share
(bench/early_reads.py: `CELLAR_EARLY_READS`, bench/put_ahead.py: `CELLAR_PUT_AHEAD`,
bench/read_backs.py: `CELLAR_READ_BACK_KEYS`).

Why alternated rounds: this VM's speed drifts by tens of percent over minutes, so a row runs
its sides in turn within each round (the order flipping each round) on one cluster, two
clients open side by side, and the report gives each side's median over rounds and the
median of the per-round ratios (on / off; below 1 is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cellar
from cellar.devtools.local_cluster import LocalCluster

KIB, MIB = 1 << 10, 1 << 20
ROWS = [(transport, size, batch) for transport in ("tcp", "shm")
        for size in (64 * KIB, MIB) for batch in (1, 16)]
OUT_DIR = Path(__file__).resolve().parent / "results"
Results = dict[str, dict[str, list[float]]]  # row -> side -> p50 (us) per round


def size_name(size: int) -> str:
    return f"{size // KIB} KiB" if size < MIB else f"{size // MIB} MiB"


def each_row(row_name: Callable[[str, int, int], str], sides: dict[str, str],
             results: Results) -> Iterator[tuple[LocalCluster, str, str, int, int]]:
    """One cluster (a master and one node with a 1 GiB segment, child processes, its memory
    pre-faulted) and each row of ROWS on it: (cluster, name, transport, size, batch), with
    `results[name]` ready for the sides."""
    with LocalCluster(1, "1GiB", port=0, http_port=0) as cluster:
        cluster.wait_prefaulted()
        for transport, size, batch in ROWS:
            name = row_name(transport, size, batch)
            results[name] = {side: [] for side in sides}
            yield cluster, name, transport, size, batch


@contextmanager
def side_clients(address: str, transport: str, env: str,
                 sides: dict[str, str]) -> Iterator[dict[str, Any]]:
    """One client per side, each connected with `env` set to the side's value."""
    clients: dict[str, Any] = {}
    try:
        for side, value in sides.items():
            os.environ[env] = value
            clients[side] = cellar.connect(address, transport=transport)
    finally:
        os.environ.pop(env, None)
    try:
        yield clients
    finally:
        for client in clients.values():
            client.close()


def put_keys(client: Any, keys: list[str], value: bytes) -> None:
    """`put` of one key, else `put_many` of them all (each must be stored)."""
    if len(keys) == 1:
        client.put(keys[0], value)
        return
    got = client.put_many([(k, value) for k in keys])
    assert got == [cellar.Status.OK] * len(keys), got


class Stored:
    """Keys a bench put, removed (untimed, by their writer) every `every` keys and at the end,
    so the node's memory is reused as in a full cache rather than faulted in anew."""

    def __init__(self, client: Any, every: int) -> None:
        self.client = client
        self.every = every
        self.keys: list[str] = []

    def add(self, keys: list[str]) -> None:
        self.keys += keys
        if len(self.keys) >= self.every:
            self.flush()

    def flush(self) -> None:
        if self.keys:
            self.client.remove_many(self.keys)
            self.keys = []


def alternate(row: dict[str, list[float]], rounds: int,
              measure: Callable[[str, int], float]) -> None:
    """`rounds` rounds of `measure(side, round)` per side, the order flipping each round."""
    sides = list(row)
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            row[side].append(measure(side, r))


def report(results: Results, header: str) -> str:
    """A Markdown table of alternated on/off rounds: per row, each side's median p50 and the
    median (range) of the per-round on / off ratios."""
    lines = [header, "",
             "| row | off, p50 | on, p50 | on / off (median of per-round ratios) |",
             "|---|---|---|---|"]
    for name, sides in results.items():
        ratios = [a / b for a, b in zip(sides["on"], sides["off"], strict=True)]
        lines.append(f"| {name} | {statistics.median(sides['off']):,.0f} us | "
                     f"{statistics.median(sides['on']):,.0f} us | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return "\n".join(lines) + "\n"


def write(results: Results, header: str, tag: str, out: Path | None) -> int:
    """Write the report (and the raw rounds as JSON) to bench/results/<tag>-<date>-<host>.md."""
    text = report(results, header)
    out = out or OUT_DIR / f"{tag}-{time.strftime('%Y-%m-%d')}-{socket.gethostname()}.md"
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(text)
    print(f"[{tag}] wrote {out}", file=sys.stderr)
    return 0


def said(tag: str, name: str, row: dict[str, list[float]]) -> None:
    print(f"[{tag}] {name}: on {statistics.median(row['on']):.0f} us, "
          f"off {statistics.median(row['off']):.0f} us", flush=True)


def header(what: str, make_target: str, rounds: int, samples: int, workload: str) -> str:
    return (f"Cellar {what}, on against off, {time.strftime('%Y-%m-%d %H:%M')} on "
            f"{socket.gethostname()} (`make {make_target}`): a master and one node, {rounds} "
            f"alternated rounds of {samples} calls per side, p50 per round; {workload}")


def main(argv: list[str] | None, *, doc: str, run: Callable[[int, int], Results], what: str,
         make_target: str, tag: str, samples: int, workload: str) -> int:
    """The command line of a switch bench: --rounds, --samples, --out; runs and writes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--samples", type=int, default=samples)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = run(args.rounds, args.samples)
    return write(results, header(what, make_target, args.rounds, args.samples, workload), tag,
                 args.out)
