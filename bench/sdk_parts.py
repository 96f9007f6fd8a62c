"""Scatter-gather against whole values: the SDK's cost of SGLang's layer_first shape.

    python -m cellar.bench.sdk_parts [--reps 6] [--transport auto] [--out bench/results]

One batch = 128 objects of 2 MiB (64 pages of a 32-layer model, K and V), each object 32 parts
of 64 KiB laid out layer-major in one 256 MiB pool (`layer_first`: a part every 8 MiB). Per rep:
`put_many` of the 128 objects as whole 2 MiB values, `put_many_parts` of the same bytes from the
pool's parts, `get_many_into` into 2 MiB buffers, `get_many_into_parts` back into the parts
(a 2-node cluster, the default transports). Reports ms per batch (medians over the reps after
the first) and the parts/whole ratio, the SDK's share of `bench/engines_sglang.py`'s figure.
Results: bench/results/sdk-parts-<transport>-<date>-<host>.md. Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import socket
import statistics
import time
from pathlib import Path

import cellar

PAGES, LAYERS, PART_BYTES = 64, 32, 64 << 10
OBJECTS = PAGES * 2
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def measure(address: str, transport: str, reps: int) -> dict[str, list[float]]:
    pool = bytearray(OBJECTS * LAYERS * PART_BYTES)
    for i in range(0, len(pool), 4096):
        pool[i] = i % 251
    mv = memoryview(pool)
    parts = [[mv[(layer * OBJECTS + o) * PART_BYTES:(layer * OBJECTS + o + 1) * PART_BYTES]
              for layer in range(LAYERS)] for o in range(OBJECTS)]
    whole = [b"".join(p) for p in parts]
    dests = [memoryview(bytearray(LAYERS * PART_BYTES)) for _ in range(OBJECTS)]
    times: dict[str, list[float]] = {}

    def timed(name: str, fn, *args):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        out = fn(*args)
        times.setdefault(name, []).append(time.perf_counter() - started)
        return out

    with cellar.connect(address, transport=transport) as client:
        for rep in range(reps + 1):
            kw, kp = ([f"bench-parts/{what}/{rep}/{i}" for i in range(OBJECTS)]
                      for what in ("whole", "parts"))
            assert all(s == cellar.Status.OK for s in timed("put whole", client.put_many,
                                                            list(zip(kw, whole, strict=True))))
            assert all(s == cellar.Status.OK for s in timed("put parts", client.put_many_parts,
                                                            list(zip(kp, parts, strict=True))))
            assert all(n == LAYERS * PART_BYTES for n in timed("get whole", client.get_many_into,
                                                               kw, dests))
            assert all(n == LAYERS * PART_BYTES for n in timed(
                "get parts", client.get_many_into_parts, kp, parts))
            client.remove_prefix(f"bench-parts/whole/{rep}/")
            client.remove_prefix(f"bench-parts/parts/{rep}/")
    return {name: t[1:] for name, t in times.items()}  # rep 0 warms up


def markdown(times: dict[str, list[float]], transport: str) -> str:
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    lines = [f"Cellar scatter-gather bench, {dt.datetime.now():%Y-%m-%d %H:%M} on "
             f"{socket.gethostname()}, transport {transport}: {OBJECTS} objects of 2 MiB, "
             f"{LAYERS} parts of 64 KiB each (256 MiB per batch); ms per batch, medians.", "",
             "| op | whole 2 MiB values | 64 KiB parts | parts / whole |", "|---|---|---|---|"]
    for op in ("put", "get"):
        w, p = med[f"{op} whole"], med[f"{op} parts"]
        lines.append(f"| {op} | {w:.1f} | {p:.1f} | {p / w:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    from cellar.devtools.local_cluster import LocalCluster

    with LocalCluster(nodes=2, segment_size="1GiB", port=0, http_port=0) as cluster:
        cluster.wait_prefaulted()
        text = markdown(measure(cluster.address, args.transport, args.reps), args.transport)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / (f"sdk-parts-{args.transport}-{dt.datetime.now():%Y-%m-%d}-"
                       f"{socket.gethostname()}.md")
    path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
