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

import itertools
import os
from functools import partial
from typing import Any

import cellar
from cellar.bench import on_off
from cellar.bench.on_off import Results, alternate, each_row, said, side_clients, size_name
from cellar.bench.spin import p50_us

KEYS = 16
SIDES = {"on": "1", "off": "0"}


def row_name(transport: str, size: int, batch: int) -> str:
    return f"{transport} {size_name(size)} " + ("get, one at a time" if batch == 1
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


def _round(clients: dict[str, Any], keys: list[str], size: int, batch: int, samples: int,
           side: str, _round_no: int) -> float:
    return measure(clients[side], keys, size, batch, samples)


def run(rounds: int, samples: int) -> Results:
    results: Results = {}
    for cluster, name, transport, size, batch in each_row(row_name, SIDES, results):
        prefix = f"early/{transport}/{size}/{batch}/"
        keys = [f"{prefix}{i}" for i in range(KEYS)]
        with side_clients(cluster.address, transport, "CELLAR_EARLY_READS", SIDES) as clients:
            clients["on"].put_many([(k, os.urandom(size)) for k in keys])
            try:
                for side in SIDES:  # warm: each side learns where the keys are
                    measure(clients[side], keys, size, batch, KEYS)
                alternate(results[name], rounds, partial(_round, clients, keys, size, batch,
                                                         samples))
                kept = clients["on"]._s.locations.kept  # noqa: SLF001 - the bench's own check
                assert kept > 0, f"{name}: no early read was kept"
            finally:
                clients["on"].remove_prefix(prefix)
        said("early-reads", name, results[name])
    return results


def main(argv: list[str] | None = None) -> int:
    return on_off.main(argv, doc=__doc__, run=run, what="early reads",
                       make_target="bench-early-reads", tag="early-reads", samples=300,
                       workload="the same 16 stored keys read over and over.")


if __name__ == "__main__":
    raise SystemExit(main())
