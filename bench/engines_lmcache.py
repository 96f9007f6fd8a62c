"""The LMCache part of `make bench-engines`: LMCache's retrieve through plugin://cellar against
Cellar's own batched get of the same bytes, in the same run, on the same cluster.

    python -m cellar.bench.engines_lmcache [--chunks 48] [--reps 15] [--transport auto]
                                           [--chunk-meta] [--out bench/results]

Runs from the LMCache engine venv (tests/engines/engine_venv.py run lmcache -- -m ...), from a
clone: it builds its LMCacheEngine with the engine tests' kit (tests/engines/lmcache_kit.py).

What it measures (a 32-layer model, 4 KV heads of 128, bfloat16, LMCache chunks of 64 tokens:
4 MiB per chunk; `--chunks` chunks of one prompt stored once):
- `cellar get_many_into`: the SDK's batched get of every chunk's object into buffers allocated
  once (the floor any adapter stands on), on the blocking face (`cellar.Client`) and on the
  asyncio face the connector uses (`cellar.AsyncClient`, the connector's own session).
- `lmcache remote batched_get`: LMCache's RemoteBackend.batched_get_blocking for the prompt's
  keys, i.e. LMCache's loop hop, its instrumentation wrapper and our connector: MemoryObjs
  allocated from the LocalCPUBackend and filled in place. The adapter overhead is this against
  the AsyncClient's line; the target is under 20%.
- `lmcache engine retrieve`: the whole LMCacheEngine.retrieve (lookup of the prefix, the remote
  get, LMCache's copy into the engine KV tensor), for scale.
Each rep empties the LocalCPUBackend first so every byte comes from Cellar; the three are
interleaved rep by rep; rates are medians, and each path's time against the AsyncClient's is
the median of its per-rep ratios (a rep slowed by other jobs on the machine slows both sides). The results go to
bench/results/engines-lmcache-<transport>[-chunk-meta]-<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results"
LAYERS, KV_HEADS, HEAD_DIM, CHUNK_TOKENS = 32, 4, 128, 64
MiB = 1 << 20


def _kit() -> Any:
    sys.path.insert(0, str(ROOT / "tests" / "engines"))
    import lmcache_kit

    return lmcache_kit


def _figure(name: str, seconds: list[float], chunks: int, chunk_bytes: int) -> dict[str, Any]:
    median_s = statistics.median(seconds)
    return {"op": name, "chunks": chunks, "chunk_bytes": chunk_bytes, "reps": len(seconds),
            "median_s": median_s, "pages_per_s": chunks / median_s,
            "GBps": chunks * chunk_bytes / median_s / 1e9}


class LoopLag:
    """A ticker task on LMCache's event loop: the longest gap between its ticks in a window
    (how long the loop could not run anything else, e.g. during an inline copy)."""

    TICK_S = 0.001

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.armed = False
        self.max_gap_s = 0.0
        self._stop = threading.Event()
        self._future = asyncio.run_coroutine_threadsafe(self._tick(), loop)

    async def _tick(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            await asyncio.sleep(self.TICK_S)
            now = time.perf_counter()
            if self.armed:
                self.max_gap_s = max(self.max_gap_s, now - last)
            last = now

    def window(self, call: Any) -> tuple[Any, float, float]:
        """`call()`'s result, its duration and the loop's longest pause meanwhile."""
        self.max_gap_s, self.armed = 0.0, True
        started = time.perf_counter()
        try:
            result = call()
        finally:
            seconds = time.perf_counter() - started
            self.armed = False
        return result, seconds, self.max_gap_s

    def stop(self) -> None:
        self._stop.set()
        self._future.result(10)


def measure(chunks: int, reps: int, transport: str, chunk_meta: bool,
            work: Path) -> dict[str, Any]:
    import torch

    import cellar
    from cellar.devtools.local_cluster import LocalCluster

    kit = _kit()
    chunk_bytes = 2 * LAYERS * CHUNK_TOKENS * KV_HEADS * HEAD_DIM * 2
    segment_bytes = max(256 * MiB, (chunks * chunk_bytes * 3) // 4 + 64 * MiB)
    with LocalCluster(2, segment_bytes) as cluster:
        config = kit.write_config(work / "bench-lmcache.yaml", cluster.address,
                                  chunk=CHUNK_TOKENS, transport=transport, timeout_s=60.0,
                                  save_chunk_meta=chunk_meta,
                                  blocking_s=120,
                                  cpu_gib=round(2.2 * chunks * chunk_bytes / (1 << 30), 2))
        engine = kit.make_engine(config, layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                 chunk=CHUNK_TOKENS, model="bench/32-layer")
        try:
            tokens = kit.tokens_for(chunks * CHUNK_TOKENS, seed=7)
            hidden = KV_HEADS * HEAD_DIM
            kv = kit.random_kv(len(tokens), seed=8, layers=LAYERS, hidden=hidden)
            engine.store(tokens, kv=kv)
            if kit.wait_stored(engine, tokens, timeout_s=300.0) != chunks:
                raise SystemExit("not every chunk reached Cellar")
            backend = kit.remote_backend(engine)
            conn = kit.cellar_connector(engine)
            keys = [k for _s, _e, k in engine.token_database.process_tokens(tokens)]
            names = [conn._name(k) for k in keys]
            client = cellar.connect(cluster.address, transport=transport, timeout_s=60.0)
            object_bytes = client.size(names[0])  # the chunk, and its head with chunk_meta
            bufs = [cellar.alloc_buffer(object_bytes) for _ in names]
            out = torch.zeros_like(kv)
            timings: dict[str, list[float]] = {"cellar": [], "async": [], "remote": [],
                                               "retrieve": []}
            lag = LoopLag(conn.loop)
            pauses: dict[str, list[float]] = {"idle": [], "remote": []}
            for rep in range(reps + 1):  # rep 0 warms every path up and is not counted
                # The blocking client's get runs on this thread: LMCache's loop has nothing
                # to do meanwhile, so its pauses then are the machine's (the control).
                sizes, cellar_s, idle_pause_s = lag.window(
                    lambda: client.get_many_into(names, bufs))
                assert sizes == [object_bytes] * chunks

                started = time.perf_counter()
                sizes = conn.session.run_sync(lambda c: c.get_many_into(names, bufs))
                async_s = time.perf_counter() - started
                assert sizes == [object_bytes] * chunks

                kit.drop_local(engine)
                objs, remote_s, remote_pause_s = lag.window(
                    lambda: backend.batched_get_blocking(keys))
                assert all(o is not None for o in objs)
                for obj in objs:
                    obj.ref_count_down()
                if rep > 0:
                    pauses["idle"].append(idle_pause_s)
                    pauses["remote"].append(remote_pause_s)

                kit.drop_local(engine)
                started = time.perf_counter()
                mask = engine.retrieve(tokens, kv=out)
                retrieve_s = time.perf_counter() - started
                assert bool(mask.all())
                if rep == 0:
                    assert torch.equal(out, kv)  # the figures are of exact reads
                    continue
                timings["cellar"].append(cellar_s)
                timings["async"].append(async_s)
                timings["remote"].append(remote_s)
                timings["retrieve"].append(retrieve_s)
            client.close()
            lag.stop()
        finally:
            kit.destroy(engine)
    figures = [_figure("cellar Client.get_many_into", timings["cellar"], chunks, chunk_bytes),
               _figure("cellar AsyncClient.get_many_into", timings["async"], chunks,
                       chunk_bytes),
               _figure("lmcache remote batched_get", timings["remote"], chunks, chunk_bytes),
               _figure("lmcache engine retrieve", timings["retrieve"], chunks, chunk_bytes)]
    # Per-op time against the AsyncClient's in the same rep, median over reps: a rep slowed by
    # the machine's other jobs slows both sides of its ratio alike.
    for f, name in zip(figures, ("cellar", "async", "remote", "retrieve"), strict=True):
        f["overhead_vs_cellar"] = statistics.median(
            t / base for t, base in zip(timings[name], timings["async"], strict=True)) - 1.0
    return {"shape": {"layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                      "chunk_tokens": CHUNK_TOKENS, "dtype": "bfloat16",
                      "chunk_bytes": chunk_bytes},
            "transport": transport, "save_chunk_meta": chunk_meta, "figures": figures,
            "adapter_overhead": figures[2]["overhead_vs_cellar"],
            "loop_pause_s": {"during_remote_get_median": statistics.median(pauses["remote"]),
                             "during_remote_get_max": max(pauses["remote"]),
                             "idle_median": statistics.median(pauses["idle"]),
                             "idle_max": max(pauses["idle"])},
            "target_overhead": 0.20}


def markdown(report: dict[str, Any], command: str) -> str:
    shape = report["shape"]
    lines = [f"# LMCache through plugin://cellar: {report['host']} {report['date']}", "",
             f"Reproduce: `{command}`", "",
             f"Shape: {shape['layers']} layers, {shape['kv_heads']} KV heads x "
             f"{shape['head_dim']}, {shape['dtype']}, chunks of {shape['chunk_tokens']} tokens "
             f"= {shape['chunk_bytes'] / MiB:.0f} MiB per chunk; transport "
             f"{report['transport']}; save_chunk_meta {str(report['save_chunk_meta']).lower()}; "
             f"medians of {report['figures'][0]['reps']} reps.", "",
             "| path | chunks | pages/s | GB/s | time vs AsyncClient.get_many_into (median ratio) |",
             "|---|---|---|---|---|"]
    for f in report["figures"]:
        lines.append(f"| {f['op']} | {f['chunks']} | {f['pages_per_s']:,.0f} | "
                     f"{f['GBps']:.2f} | {f['overhead_vs_cellar']:+.0%} |")
    pause = report["loop_pause_s"]
    verdict = "met" if report["adapter_overhead"] < report["target_overhead"] else "NOT met"
    lines += ["", f"Adapter overhead (LMCache's remote batched get vs the AsyncClient's): "
                  f"{report['adapter_overhead']:+.1%}; target < "
                  f"{report['target_overhead']:.0%}: {verdict}.",
              "", "LMCache's event loop (a 1 ms ticker on it), longest pause per rep, median and "
                  "worst over reps: during the remote batched gets "
                  f"{pause['during_remote_get_median'] * 1e3:.1f} ms / "
                  f"{pause['during_remote_get_max'] * 1e3:.1f} ms; during Client.get_many_into, "
                  "which does not touch that loop (the machine's own jitter) "
                  f"{pause['idle_median'] * 1e3:.1f} ms / {pause['idle_max'] * 1e3:.1f} ms. "
                  f"One remote batched get takes {report['figures'][2]['median_s'] * 1e3:.0f} ms."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.engines_lmcache")
    parser.add_argument("--chunks", type=int, default=48, help="4 MiB chunks in the prompt")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--transport", default="auto", choices=["auto", "tcp", "shm"])
    parser.add_argument("--chunk-meta", action="store_true",
                        help="LMCache's save_chunk_meta: true (objects carry header + metadata)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.chunks < 1 or args.reps < 1:
        parser.error("--chunks and --reps must be >= 1")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cellar-bench-lmcache-") as work:
        report = measure(args.chunks, args.reps, args.transport, args.chunk_meta, Path(work))
    report["date"] = time.strftime("%Y-%m-%d")
    report["host"] = socket.gethostname()
    command = ("python3 tests/engines/engine_venv.py run lmcache -- -m cellar.bench.engines_lmcache"
               f" --chunks {args.chunks} --reps {args.reps} --transport {args.transport}"
               + (" --chunk-meta" if args.chunk_meta else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    mode = "-chunk-meta" if args.chunk_meta else ""
    stem = args.out / f"engines-lmcache-{args.transport}{mode}-{report['date']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report, command)
    stem.with_suffix(".md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
