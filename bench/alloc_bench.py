"""Micro-benchmark of cellar.master.state.allocator.SegmentAllocator on the master's hot path.

Run: ``python bench/alloc_bench.py [--live N] [--ops N] [--seed N]``. Prints one JSON object:
mean nanoseconds per ``alloc`` and per ``free`` for (a) uniform 64 KiB pages and (b) mixed random
sizes, on a 16 GiB logical segment (no memory is touched) holding ~100k live allocations.

Method: fill the segment to ``--live`` allocations, then run rounds of "alloc a batch, free a
random batch of the same size" so the live count stays put. Only the allocator calls and a list
append/lookup are inside the timed loops; sizes and victims are drawn beforehand. The figures
include CPython's loop overhead (a few tens of ns), which is reported separately.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time

from cellar.master.state.allocator import SegmentAllocator

SEGMENT_BYTES = 16 * 1024**3
KIB = 1024


def _uniform_64k(rng: random.Random) -> int:
    return 64 * KIB


def _mixed(rng: random.Random) -> int:
    """Half small (KV blocks of a few tokens, metadata), 40% medium, 10% page-aligned large."""
    r = rng.random()
    if r < 0.5:
        return rng.randint(1, 16 * KIB)
    if r < 0.9:
        return rng.randint(16 * KIB, 256 * KIB - 1)
    return rng.randint(256 * KIB, 512 * KIB)


def _loop_overhead_ns(count: int) -> float:
    """Cost of the timed loop shape with a trivial call, to read the figures against."""
    sink: list[int] = []
    append = sink.append
    values = list(range(count))
    identity = int
    t0 = time.perf_counter_ns()
    for value in values:
        append(identity(value))
    return (time.perf_counter_ns() - t0) / count


def run_case(name: str, draw, live_target: int, ops: int, batch: int, seed: int) -> dict:
    rng = random.Random(seed)
    allocator = SegmentAllocator(SEGMENT_BYTES)
    live: list[int] = []
    while len(live) < live_target:
        offset = allocator.alloc(draw(rng))
        if offset is None:
            break
        live.append(offset)

    alloc_ns = 0
    alloc_calls = 0
    alloc_failures = 0
    free_ns = 0
    free_calls = 0
    alloc = allocator.alloc
    free = allocator.free
    while alloc_calls < ops:
        sizes = [draw(rng) for _ in range(batch)]
        fresh: list[int | None] = []
        append = fresh.append
        t0 = time.perf_counter_ns()
        for nbytes in sizes:
            append(alloc(nbytes))
        alloc_ns += time.perf_counter_ns() - t0
        alloc_calls += batch
        alloc_failures += fresh.count(None)
        live.extend(offset for offset in fresh if offset is not None)

        rng.shuffle(live)
        victims = live[-batch:]
        del live[-batch:]
        t0 = time.perf_counter_ns()
        for offset in victims:
            free(offset)
        free_ns += time.perf_counter_ns() - t0
        free_calls += len(victims)

    return {
        "case": name,
        "live_allocations": allocator.allocation_count,
        "used_fraction": round(allocator.used_bytes / allocator.capacity_bytes, 4),
        "free_blocks": allocator.free_block_count,
        "alloc_calls": alloc_calls,
        "alloc_failures": alloc_failures,
        "alloc_ns_mean": round(alloc_ns / alloc_calls, 1),
        "free_calls": free_calls,
        "free_ns_mean": round(free_ns / free_calls, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=100_000, help="live allocations held")
    parser.add_argument(
        "--ops", type=int, default=200_000, help="timed allocs (and frees) per case"
    )
    parser.add_argument("--batch", type=int, default=10_000, help="ops per timed batch")
    parser.add_argument("--seed", type=int, default=20240601)
    args = parser.parse_args()

    cases = [
        run_case("uniform_64KiB", _uniform_64k, args.live, args.ops, args.batch, args.seed),
        run_case("mixed_random", _mixed, args.live, args.ops, args.batch, args.seed + 1),
    ]
    report = {
        "benchmark": "segment_allocator",
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "segment_bytes": SEGMENT_BYTES,
        "loop_overhead_ns": round(_loop_overhead_ns(args.batch), 1),
        "cases": cases,
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
