"""Putting ahead, on against off (`make bench-put-ahead`): what a put in two round trips buys.

A client holding put-ahead allocations of a size (client/put_ahead.py) writes its next put of
that size at once and names the key in PutEnd: no PutStart. These rows measure that against
`CELLAR_PUT_AHEAD=0` on one cluster (a master and one node with a 1 GiB segment, child
processes) in alternated rounds whose order flips each round, two clients open side by side
(one per setting), each putting fresh keys:
- p50 of a single `put` of 64 KiB and 1 MiB, over tcp and over shm;
- p50 of `put_many` of 16 x 64 KiB and 16 x 1 MiB, tcp and shm (16 MiB is more than one
  client holds, MAX_HELD_BYTES: that row shows what asking costs a batch it never covers).
Every 16 puts the keys are removed, untimed, so the node's memory is reused as in a full cache
rather than faulted in for the first time (which on this VM costs more than the put). Run:
`python -m cellar.bench.put_ahead [--rounds 8] [--samples 160]`; results in
bench/results/put-ahead-<date>-<host>.{md,json}.
"""

from __future__ import annotations

import os
import statistics
import time
from functools import partial
from typing import Any

from cellar.bench import on_off
from cellar.bench.on_off import (
    Results,
    Stored,
    alternate,
    each_row,
    put_keys,
    said,
    side_clients,
    size_name,
)
from cellar.client.put_ahead import MAX_HELD_BYTES

SIDES = {"on": "", "off": "0"}  # "": the default
REMOVE_EVERY = 16  # puts between two untimed removals of what they stored


def row_name(transport: str, size: int, batch: int) -> str:
    return f"{transport} {size_name(size)} " + ("put, one at a time" if batch == 1
                                                else f"put_many x{batch}")


def measure(client: Any, prefix: str, value: bytes, batch: int, samples: int) -> float:
    """p50 of `samples` puts (or put_many of `batch`) of fresh keys, removals untimed."""
    times: list[float] = []
    stored = Stored(client, REMOVE_EVERY)
    for n in range(samples):
        keys = [f"{prefix}/{n}/{i}" for i in range(batch)]
        start = time.perf_counter()
        put_keys(client, keys, value)
        times.append(time.perf_counter() - start)
        stored.add(keys)
    stored.flush()
    return statistics.median(times) * 1e6


def _round(clients: dict[str, Any], name: str, value: bytes, batch: int, samples: int,
           side: str, round_no: int) -> float:
    return measure(clients[side], f"ahead/{side}/{name}/{round_no}", value, batch, samples)


def run(rounds: int, samples: int) -> Results:
    results: Results = {}
    for cluster, name, transport, size, batch in each_row(row_name, SIDES, results):
        payload = os.urandom(size)
        with side_clients(cluster.address, transport, "CELLAR_PUT_AHEAD", SIDES) as clients:
            for side in SIDES:  # warm: a size is asked for once an earlier put had it
                measure(clients[side], f"ahead/{side}/warm", payload, batch, 4)
            alternate(results[name], rounds, partial(_round, clients, name, payload, batch,
                                                     samples))
            used = clients["on"]._s.aheads.used  # noqa: SLF001 - the bench's own check
            covered = size * batch <= MAX_HELD_BYTES
            assert (used > 0) == covered, f"{name}: {used} puts used a put-ahead allocation"
        said("put-ahead", name, results[name])
    return results


def main(argv: list[str] | None = None) -> int:
    return on_off.main(argv, doc=__doc__, run=run, what="put ahead", make_target="bench-put-ahead",
                       tag="put-ahead", samples=160,
                       workload=f"fresh keys, removed untimed every {REMOVE_EVERY} puts.")


if __name__ == "__main__":
    raise SystemExit(main())
