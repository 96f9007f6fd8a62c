"""`make bench-engines` (SGLang part): HiCache backup and prefetch through Cellar, against
Cellar's own batched put/get of the same bytes, in one run on one cluster.

    python -m cellar.bench.engines_sglang [--pages 64] [--reps 5] [--layouts page_first,layer_first]
                                          [--segment-size 1GiB] [--out bench/results]

Runs from the SGLang engine venv (tests/engines/engine_venv.py; the Makefile target does it).
Shape: a 32-layer MHA model, page size 64, 4 KV heads of dim 128 per rank, bfloat16: a page is
4 MiB (K and V objects of 2 MiB). With SGLang 0.5.23's real HiCacheController on CPU
(tests/engines/sglang_harness.py):
- backup: `write_storage` -> the backup thread's `batch_set_v1` calls -> ack, fresh pages each rep;
- prefetch: `prefetch` -> `batch_exists` -> rank reduce -> `batch_get_v1` -> completion ack,
  into a wiped host pool;
- baseline: `Client.put_many` / `get_many_into` of the same objects (same sizes, straight from
  and into the same host pool memory) with the same client settings; its get, like the
  prefetch, runs after a wipe of the host pool (same cache state: nothing of it left in L3).
Overhead = 1 - adapter GB/s / baseline GB/s (target < 20%), paired per rep. Figures only, never assertions;
results go to bench/results/engines-sglang.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "engines"))  # the harness lives with the engine tests

import cellar  # noqa: E402
from cellar.devtools.local_cluster import LocalCluster  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results"
GB = 1e9


def measure(address: str, layout: str, pages: int, reps: int) -> dict[str, Any]:
    from sglang_harness import Engine, Shape

    shape = Shape(layout=layout, page_size=64, layers=32, heads=4, head_dim=128,
                  device_tokens=pages * 64, host_ratio=2.0)
    engine = Engine(address, model=f"bench-{layout}", shape=shape)
    page_bytes = engine.backend.pages.geometry.page_bytes
    calls = _time_calls(engine.backend, ("batch_set_v1", "batch_get_v1"))
    total = pages * page_bytes
    backup_s, prefetch_s, put_s, get_s = [], [], [], []
    set_call_s: list[float] = []
    get_call_s: list[float] = []
    client = cellar.connect(address)
    try:
        for rep in range(reps + 1):  # rep 0 warms up (segment mappings, pools) and is dropped
            seed = 1000 + rep
            assert engine.backup(pages, seed) == pages * shape.page_size
            backup_s.append(engine.last_backup_s)
            set_call_s.append(sum(calls.pop("batch_set_v1", [])))
            engine.wipe()
            got = engine.prefetch(pages, seed)
            assert got.completed_pages == pages, got
            assert engine.exact_pages(got.host_indices, seed, pages) == pages
            prefetch_s.append(got.seconds)
            get_call_s.append(sum(calls.pop("batch_get_v1", [])))
            # Baseline: the same objects straight from and into the same pool memory.
            views = [obj[0] if len(obj) == 1 else b"".join(obj)
                     for page in engine.backend.pages.views(got.host_indices) for obj in page]
            keys = [f"bench-baseline/{layout}/{rep}/{i}" for i in range(len(views))]
            started = time.monotonic()
            statuses = client.put_many(list(zip(keys, views, strict=True)))
            put_s.append(time.monotonic() - started)
            assert all(s == cellar.Status.OK for s in statuses), statuses[:3]
            dests = [memoryview(bytearray(len(v))) if isinstance(v, bytes) else v for v in views]
            # The prefetch above read after a wipe of the host pool; so does the baseline's
            # get. Without it, the bytes just put would still sit in this VM's large L3
            # (480 MiB reported) and the baseline's get would read them from cache.
            engine.wipe()
            started = time.monotonic()
            sizes = client.get_many_into(keys, dests)
            get_s.append(time.monotonic() - started)
            assert all(n == page_bytes // 2 for n in sizes)
            engine.wipe()
            # Leave the cluster empty for the next rep: eviction must not enter the figures.
            client.remove_prefix(f"bench-baseline/{layout}/{rep}/")
            engine.backend.clear()
            if rep == 0:
                for kept in (backup_s, prefetch_s, put_s, get_s, set_call_s, get_call_s):
                    kept.clear()
    finally:
        client.close()
        engine.close()

    def rate(seconds: list[float], best: bool = False) -> float:
        return total / (min(seconds) if best else statistics.median(seconds)) / GB

    timings = {"backup": backup_s, "baseline_put": put_s, "batch_set_v1": set_call_s,
               "prefetch": prefetch_s, "baseline_get": get_s, "batch_get_v1": get_call_s}
    out: dict[str, Any] = {"layout": layout, "pages": pages, "page_bytes": page_bytes,
                           "reps": reps}
    for name, seconds in timings.items():
        out[f"{name}_GBps"] = rate(seconds)
        out[f"{name}_best_GBps"] = rate(seconds, best=True)
    for what, base in (("backup", "baseline_put"), ("batch_set_v1", "baseline_put"),
                       ("prefetch", "baseline_get"), ("batch_get_v1", "baseline_get")):
        # Paired per rep (the adapter and the baseline ran seconds apart): on a shared machine
        # the load swings between reps, and a ratio of medians would mix those swings in.
        out[f"{what}_overhead"] = statistics.median(
            1 - b / a for a, b in zip(timings[what], timings[base], strict=True))
        out[f"{what}_best_overhead"] = 1 - out[f"{what}_best_GBps"] / out[f"{base}_best_GBps"]
    out["backup_pages_per_s"] = out["backup_GBps"] * GB / page_bytes
    out["prefetch_pages_per_s"] = out["prefetch_GBps"] * GB / page_bytes
    return out


def _time_calls(backend: Any, names: tuple[str, ...]) -> dict[str, list[float]]:
    """Wrap the backend's methods to record the seconds of each call (the adapter alone,
    without SGLang's threads, hashing and rank reduces around it)."""
    seen: dict[str, list[float]] = {}
    for name in names:
        inner = getattr(backend, name)

        def timed(*args: Any, _inner: Any = inner, _name: str = name, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return _inner(*args, **kwargs)
            finally:
                seen.setdefault(_name, []).append(time.monotonic() - started)

        setattr(backend, name, timed)
    return seen


def markdown(report: dict[str, Any]) -> str:
    reps = report["results"][0]["reps"]
    lines = [f"# SGLang HiCache over Cellar ({report['date']}, {report['host']})", "",
             f"SGLang {report['sglang']} HiCacheController on CPU, 32 layers, page 64 tokens, "
             f"4 KV heads x 128, bfloat16 (a page is K + V objects of 2 MiB); "
             f"{report['nodes']} nodes, transport auto; {reps} reps after a warm-up. "
             "GB/s are medians (best rep in brackets). Command: `make bench-engines`.", "",
             "| layout | pages | op | through SGLang GB/s (pages/s) | adapter call GB/s | "
             "Cellar batched GB/s | overhead: SGLang path / call (best reps) |",
             "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        for op, call, base in (("backup", "batch_set_v1", "baseline_put"),
                               ("prefetch", "batch_get_v1", "baseline_get")):
            lines.append(
                f"| {r['layout']} | {r['pages']} | {op} | "
                f"{r[op + '_GBps']:.2f} [{r[op + '_best_GBps']:.2f}] "
                f"({r[op + '_pages_per_s']:.0f}) | "
                f"{r[call + '_GBps']:.2f} [{r[call + '_best_GBps']:.2f}] | "
                f"{r[base + '_GBps']:.2f} [{r[base + '_best_GBps']:.2f}] | "
                f"{r[op + '_overhead']:+.0%} / {r[call + '_overhead']:+.0%} "
                f"({r[op + '_best_overhead']:+.0%} / {r[call + '_best_overhead']:+.0%}) |")
    lines += ["", "Overhead = 1 - rate / Cellar's batched rate for the same bytes (target < 20%): "
              "through SGLang's path, and for the adapter's call alone; the median of the "
              "per-rep ratios (each rep's adapter run against that rep's baseline), and the "
              "best rep against the best baseline in brackets. Backup times "
              "write_storage -> backup ack (SGLang's backup thread around batch_set_v1); "
              "prefetch times prefetch() -> completion ack (SGLang's page hashing, "
              "batch_exists, the gloo rank reduces and its IO thread around batch_get_v1). "
              "Cellar batched = one put_many / get_many_into of the same objects from and into "
              "the same host-pool memory with the same client settings. Every object moves by "
              "the SDK's scatter-gather calls (layer_first: 32 parts per object). The machine "
              "is shared (2 cores): compare the columns of one row, not runs.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layouts", default="page_first,layer_first")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--segment-size", default="1GiB")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    import sglang
    from sglang_harness import init_distributed

    init_distributed()
    results = []
    with LocalCluster(args.nodes, args.segment_size) as cluster:
        for layout in args.layouts.split(","):
            print(f"[bench-engines] sglang {layout}: {args.pages} pages x {args.reps}", flush=True)
            results.append(measure(cluster.address, layout, args.pages, args.reps))
    report = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(),
              "sglang": sglang.__version__, "nodes": args.nodes, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engines-sglang.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (args.out / "engines-sglang.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
