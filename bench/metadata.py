"""The metadata bench alone, up to 10^7 objects: `python -m cellar.bench.metadata` (`make bench-metadata`).

    python -m cellar.bench.metadata [--levels 10000,1000000,10000000] [--segment-size 2GiB]
                                    [--seconds 3] [--out FILE.md]

Starts its own cluster (a master and one node; the bench's objects are 64 bytes, so a small
segment holds 10^7 of them), runs bench/worker.py's metadata bench in a third process, and
samples the master's RSS each time the worker reports a figure. Prints (and with --out writes)
a Markdown table: keys/s for batched PutStart+PutEnd and GetReplicas+Unpin at batch 128 with
each level of objects already in the table, and the master's RSS per million objects it holds
(the level plus the keys earlier timed puts left behind). Loading 10^7 objects takes about 5
minutes on the 2-core machines; the master then holds about 7 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cellar.bench.run import master_rss_bytes, say

MiB = 1 << 20
DEFAULT_LEVELS = "10000,1000000,10000000"


def run(address: str, master_pid: int, levels: str, seconds: float,
        secret: str = "") -> list[dict[str, Any]]:
    """The worker's metadata results, each with the master's RSS when it was reported
    (`secret`: the cluster secret, hex, so the worker can sign the receipts a node would)."""
    command = [sys.executable, "-m", "cellar.bench.worker", "--address", address,
               "--skip", "data,latency", "--metadata-levels", levels,
               "--metadata-seconds", str(seconds)]
    results = []
    env = {**os.environ, "CELLAR_CLUSTER_SECRET": secret} if secret else None
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            record = json.loads(line)
            record["master_rss_bytes"] = master_rss_bytes(master_pid)
            results.append(record)
    if proc.returncode != 0:
        raise SystemExit(f"bench worker failed (exit {proc.returncode}): {' '.join(command)}")
    return results


def markdown(results: list[dict[str, Any]], rss_before: int, command: str, header: str) -> str:
    lines = [f"# Metadata bench: {header}", "", f"Reproduce: `{command}`", "",
             "| metadata op (batch 128) | objects in table | keys/s | master RSS | RSS per million objects |",
             "|---|---|---|---|---|"]
    names = {"put": "PutStart+PutEnd", "get": "GetReplicas+Unpin"}
    for r in results:
        held = r["objects_in_table"]
        rss = r["master_rss_bytes"]
        per_million = (rss - rss_before) / held * 1e6 / MiB if held >= 100_000 else 0.0
        lines.append(f"| {names[r['op']]} | {r['objects']:,} (holding {held:,}) | {r['keys_per_s']:,} "
                     f"| {rss / MiB:,.0f} MiB | {f'{per_million:,.0f} MiB' if per_million else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default=DEFAULT_LEVELS, help="objects in the table, comma list")
    parser.add_argument("--segment-size", default="2GiB")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per figure")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    from cellar.devtools.local_cluster import LocalCluster

    started = time.monotonic()
    with LocalCluster(nodes=1, segment_size=args.segment_size, port=0, http_port=0) as cluster:
        assert cluster.master is not None
        say(f"cluster up at {cluster.address}; metadata bench at {args.levels} objects")
        rss_before = master_rss_bytes(cluster.master.pid)
        results = run(cluster.address, cluster.master.pid, args.levels, args.seconds,
                      cluster.secret)
    command = "python -m cellar.bench.metadata " + " ".join(argv if argv is not None else sys.argv[1:])
    header = f"{time.strftime('%Y-%m-%d %H:%M')} on {socket.gethostname()}"
    table = markdown(results, rss_before, command.strip(), header)
    print(table)
    if args.out:
        args.out.write_text(table)
        say(f"wrote {args.out}")
    say(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
