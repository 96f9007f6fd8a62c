"""What TLS costs on the TCP data plane: the same puts and gets, plaintext beside TLS.

Two clusters of one node each: a plaintext one and a `LocalCluster(tls=True)` one (nodes
serve `tls://`, cellar.transfer.tls_sock). For each workload (16 x 4 MiB: bandwidth-bound;
128 x 64 KiB: per-frame cost) the sync Client, forced onto tcp, runs `put_many(upsert=True)`
and a zero-copy `get_many_into` of the same keys, alternating plaintext and TLS rep by rep (so
a neighbour's burst hits both alike); each figure is the median of the reps, in GB/s of
payload. The first get of each cluster is checked byte for byte.

Run alone: `python -m cellar.bench.tls` (starts both clusters, prints the table, writes
bench/results/tls-<date>-<host>.md and .json); `cellar bench` runs it as one more worker with
`--address` (its own plaintext cluster is then the plaintext side), printing JSON lines of
kind "tls" that its Markdown lists.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cellar

KiB, MiB = 1 << 10, 1 << 20
WORKLOADS = ((16, 4 * MiB), (128, 64 * KiB))  # (objects per batch, bytes each)
SEGMENT = "256MiB"  # holds a workload twice over (an upsert frees the old value after)
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _label(batch: int, size: int) -> str:
    return f"{batch} x {size // MiB} MiB" if size >= MiB else f"{batch} x {size // KiB} KiB"


def _timed_reps(client: Any, batch: int, size: int, reps: int, tag: str) -> Iterator[
        tuple[float, float]]:
    """(put seconds, get seconds) per rep; the first get is checked byte for byte."""
    keys = [f"tlsbench/{tag}/{size}/{i}" for i in range(batch)]
    values = [os.urandom(size) for _ in range(batch)]
    bufs = [bytearray(size) for _ in range(batch)]
    items = list(zip(keys, values, strict=True))
    for rep in range(reps):
        start = time.perf_counter()
        statuses = client.put_many(items, upsert=True)
        put_s = time.perf_counter() - start
        assert statuses == [cellar.Status.OK] * batch, statuses
        start = time.perf_counter()
        got = client.get_many_into(keys, bufs)
        get_s = time.perf_counter() - start
        assert got == [size] * batch, got
        if rep == 0:
            assert all(b == v for b, v in zip(bufs, values, strict=True)), "bytes differ"
        yield put_s, get_s
    client.remove_prefix(f"tlsbench/{tag}/")


def run(plain_address: str, tls_address: str, reps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with cellar.connect(plain_address, transport="tcp") as plain, \
            cellar.connect(tls_address, transport="tcp") as tls:
        for batch, size in WORKLOADS:
            sides = {"plain": _timed_reps(plain, batch, size, reps, "plain"),
                     "tls": _timed_reps(tls, batch, size, reps, "tls")}
            times: dict[str, list[tuple[float, float]]] = {"plain": [], "tls": []}
            for _ in range(reps):  # alternate: plaintext rep, TLS rep, ...
                for side, reps_iter in sides.items():
                    times[side].append(next(reps_iter))
            for reps_iter in sides.values():  # runs the clean-up after the last rep
                for _ in reps_iter:
                    pass
            nbytes = batch * size
            for k, op in enumerate(("put", "get")):
                gbps = {side: nbytes / statistics.median(t[k] for t in samples) / 1e9
                        for side, samples in times.items()}
                rows.append({"kind": "tls", "workload": _label(batch, size), "batch": batch,
                             "size_bytes": size, "op": op, "reps": reps,
                             "plain_GBps": gbps["plain"], "tls_GBps": gbps["tls"],
                             "tls_over_plain": gbps["tls"] / gbps["plain"]})
    return rows


def markdown_rows(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r.get("kind") == "tls"]
    if not rows:
        return []
    lines = ["", "| tcp data plane (sync Client, median of reps) | op | plaintext GB/s "
             "| TLS GB/s | TLS / plaintext |", "|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['op']} | {r['plain_GBps']:.2f} | {r['tls_GBps']:.2f} "
              f"| {r['tls_over_plain']:.2f} |" for r in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.tls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="a running plaintext cluster (else one is started)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 reps, nothing written")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    reps = 2 if args.quick else args.reps
    from cellar.devtools.local_cluster import LocalCluster

    with contextlib.ExitStack() as stack:
        tls_cluster = stack.enter_context(
            LocalCluster(nodes=1, segment_size=SEGMENT, port=0, http_port=0, tls=True))
        plain_address = args.address
        if plain_address is None:
            plain = stack.enter_context(
                LocalCluster(nodes=1, segment_size=SEGMENT, port=0, http_port=0))
            plain.wait_prefaulted()
            plain_address = plain.address
        tls_cluster.wait_prefaulted()
        results = run(plain_address, tls_cluster.address, reps)
    if args.address:
        for row in results:
            print(json.dumps(row), flush=True)
        return 0
    now = dt.datetime.now()
    text = "\n".join([f"Cellar TLS data-plane bench, {now:%Y-%m-%d %H:%M} on "
                      f"{socket.gethostname()} ({os.cpu_count()} cores)",
                      *markdown_rows(results)]) + "\n"
    print(text)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"tls-{now:%Y-%m-%d}-{socket.gethostname()}"
        Path(f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
        Path(f"{stem}.md").write_text(text)
        print(f"wrote {stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
