"""Read backs, on against off (`make bench-read-backs`): what a PutEnd's read grants buy and cost.

With `CELLAR_READ_BACK_KEYS` a PutEnd of at most that many keys brings back their read grants
and read trust (client/read_backs.py), so the writer's first get of a key it just put is one
read without asking. These rows measure that against the default (off) on one cluster (a
master and one node with a 1 GiB segment, child processes) in alternated rounds whose order
flips each round, two clients open side by side (one per setting), each putting fresh keys
and reading each back at once:
- p50 of a single `put` of 64 KiB and 1 MiB, and of the `get` of that key right after it;
- p50 of `put_many` of 16 x 64 KiB and 16 x 1 MiB, and of the `get_many` of those 16 right
  after it; over tcp and over shm.
Every 16 keys are removed, untimed (by their writer: nothing waits). Run:
`python -m cellar.bench.read_backs [--rounds 8] [--samples 100]`; results in
bench/results/read-backs-<date>-<host>.{md,json}.
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
from cellar.client.read_backs import READ_BACK_ENV

SIDES = {"on": "16", "off": ""}  # "": the default (off)
REMOVE_EVERY = 16  # keys between two untimed removals of what was put


def row_name(transport: str, size: int, batch: int) -> str:
    return f"{transport} {size_name(size)} " + ("put, one at a time" if batch == 1
                                                else f"put_many x{batch}")


def measure(client: Any, prefix: str, value: bytes, batch: int,
            samples: int) -> tuple[float, float]:
    """p50s (us) of `samples` puts of fresh keys (or put_many of `batch`) and of the get (or
    get_many) of those keys right after each; removals untimed."""
    put_s: list[float] = []
    get_s: list[float] = []
    stored = Stored(client, REMOVE_EVERY)
    for n in range(samples):
        keys = [f"{prefix}/{n}/{i}" for i in range(batch)]
        start = time.perf_counter()
        put_keys(client, keys, value)
        put_done = time.perf_counter()
        read = [client.get(keys[0])] if batch == 1 else client.get_many(keys)
        get_s.append(time.perf_counter() - put_done)
        put_s.append(put_done - start)
        assert read == [value] * batch, f"{prefix}/{n}: a value read back differs"
        stored.add(keys)
    stored.flush()
    return statistics.median(put_s) * 1e6, statistics.median(get_s) * 1e6


def _round(clients: dict[str, Any], name: str, gets: dict[str, list[float]], value: bytes,
           batch: int, samples: int, side: str, round_no: int) -> float:
    put_us, get_us = measure(clients[side], f"rb/{side}/{name}/{round_no}", value, batch,
                             samples)
    gets[side].append(get_us)
    return put_us


def run(rounds: int, samples: int) -> Results:
    results: Results = {}
    for cluster, name, transport, size, batch in each_row(row_name, SIDES, results):
        payload = os.urandom(size)
        get_name = f"{transport} {size_name(size)} " + (
            "get of it right after" if batch == 1 else f"get_many of those {batch} right after")
        gets: dict[str, list[float]] = {side: [] for side in SIDES}
        results[get_name] = gets
        with side_clients(cluster.address, transport, READ_BACK_ENV, SIDES) as clients:
            for side in SIDES:  # warm: put-ahead allocations of the size, connections
                measure(clients[side], f"rb/{side}/warm", payload, batch, 4)
            trusted = clients["on"]._s.locations.trusted  # noqa: SLF001 - the bench's own check
            alternate(results[name], rounds, partial(_round, clients, name, gets, payload,
                                                     batch, samples))
            read_back = clients["on"]._s.locations.trusted - trusted  # noqa: SLF001
            assert read_back > 0, f"{name}: no key read back was read without asking"
        said("read-backs", name, results[name])
        said("read-backs", get_name, gets)
    return results


def main(argv: list[str] | None = None) -> int:
    return on_off.main(argv, doc=__doc__, run=run, what="read backs",
                       make_target="bench-read-backs", tag="read-backs", samples=100,
                       workload=f"fresh keys, each read back right after its put; removed "
                                f"untimed every {REMOVE_EVERY} keys.")


if __name__ == "__main__":
    raise SystemExit(main())
