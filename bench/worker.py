"""The bench's client process: runs workloads against a running cluster, prints JSON lines.

Kept in its own process so the client's CPU use competes with the master and the node the way a
serving engine's would, and so the orchestrator's own work does not disturb the figures.
Each line on stdout is one JSON result; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cellar
from cellar.client.rpc import MasterChannel
from cellar.credentials import default_token
from cellar.proto import cellar_pb2 as pb
from cellar.proto.receipt import ReceiptSigner

KiB, MiB = 1 << 10, 1 << 20
RPC_TIMEOUT_S = 30.0
PROGRESS_EVERY_OBJECTS = 250_000
META_PREFIX = f"meta/{os.getpid()}"  # a rerun against the same cluster starts afresh


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


def ops_per_rep(size_bytes: int, batch: int, target_bytes: int) -> int:
    """Enough ops to move about target_bytes, at least one batch, a whole number of batches."""
    ops = max(batch, min(4096, target_bytes // size_bytes))
    return max(batch, ops // batch * batch)


def timed_reps(reps: int, body: Callable[[int], None],
               before: Callable[[int], None] | None = None) -> list[float]:
    """Run body(rep) `reps` times, before(rep) untimed ahead of each; seconds per rep."""
    seconds = []
    for rep in range(reps):
        if before is not None:
            before(rep)
        start = time.perf_counter()
        body(rep)
        seconds.append(time.perf_counter() - start)
    return seconds


def key_batches(prefix: str, rep: int, ops: int, batch: int) -> list[list[str]]:
    return [[f"{prefix}/{rep}/{i}" for i in range(first, first + batch)]
            for first in range(0, ops, batch)]


def put_rep(client: cellar.Client, prefix: str, ops: int, batch: int, value: Any,
            rep: int) -> None:
    for keys in key_batches(prefix, rep, ops, batch):
        if len(keys) == 1:
            client.upsert(keys[0], value)
            continue
        for status in client.put_many([(k, value) for k in keys]):
            if status not in (cellar.Status.OK, cellar.Status.ALREADY_EXISTS):
                raise RuntimeError(f"put failed: {status!r}")


def drop_earlier_rep(client: cellar.Client, prefix: str, rep: int) -> None:
    """Before put rep `rep`: remove rep-1's keys (only the last rep's keys are read back)."""
    if rep:
        client.remove_prefix(f"{prefix}/{rep - 1}/")


def get_rep(client: cellar.Client, prefix: str, ops: int, batch: int,
            destinations: list[Any] | None, rep: int, _timed_rep: int = 0) -> None:
    """Read back put rep `rep`'s keys (timed_reps passes its own rep count last; ignored)."""
    for keys in key_batches(prefix, rep, ops, batch):
        if destinations is not None:
            if min(client.get_many_into(keys, destinations[:len(keys)])) < 0:
                raise RuntimeError("miss in zero-copy get")
        elif len(keys) == 1:
            client.get(keys[0])
        elif any(v is None for v in client.get_many(keys)):
            raise RuntimeError("miss in get_many")


def data_plane(client: cellar.Client, sizes: list[int], batches: list[int], reps: int,
               target_bytes: int, transport: str) -> None:
    fill = os.urandom(1 * MiB)
    for size in sizes:
        source = cellar.alloc_buffer(size)
        for start in range(0, size, len(fill)):
            n = min(len(fill), size - start)
            source[start:start + n] = fill[:n]
        source_bytes = bytes(source)
        for batch in batches:
            ops = ops_per_rep(size, batch, target_bytes if batch > 1 else target_bytes // 4)
            destinations = [cellar.alloc_buffer(size) for _ in range(batch)]
            for api in ("bytes", "zero_copy"):
                prefix = f"bench/{transport}/{api}/{size}/{batch}"
                value: Any = source_bytes if api == "bytes" else source
                dests = destinations if api == "zero_copy" else None
                # Only the last put rep's keys stay (earlier ones are removed, untimed, so a
                # large row never fills the segment and evicts what the gets will read); every
                # get rep reads them.
                put_s = timed_reps(reps, functools.partial(put_rep, client, prefix, ops, batch,
                                                           value),
                                   before=functools.partial(drop_earlier_rep, client, prefix))
                get_s = timed_reps(reps, functools.partial(get_rep, client, prefix, ops, batch,
                                                           dests, reps - 1))
                for op, seconds in (("put", put_s), ("get", get_s)):
                    median_s = statistics.median(seconds)
                    emit({"kind": "data", "transport": transport, "api": api, "op": op,
                          "size_bytes": size, "batch": batch, "ops": ops, "reps": reps,
                          "GBps": round(ops * size / median_s / 1e9, 3),
                          "ops_per_s": round(ops / median_s, 1)})
                progress(f"{transport} {api:9} {size // KiB:>6} KiB x{batch:<3} "
                         f"put {ops * size / statistics.median(put_s) / 1e9:6.2f} GB/s  "
                         f"get {ops * size / statistics.median(get_s) / 1e9:6.2f} GB/s")
                client.remove_prefix(prefix + "/")


def latency(client: cellar.Client, transport: str, size: int, samples: int) -> None:
    value = os.urandom(size)
    buffer = cellar.alloc_buffer(size)
    put_us, get_us = [], []
    for i in range(samples):
        key = f"lat/{transport}/{i}"
        start = time.perf_counter()
        client.upsert(key, value)
        put_us.append((time.perf_counter() - start) * 1e6)
    for i in range(samples):
        start = time.perf_counter()
        client.get_into(f"lat/{transport}/{i}", buffer)
        get_us.append((time.perf_counter() - start) * 1e6)
    for op, values in (("put", put_us), ("get", get_us)):
        values.sort()
        emit({"kind": "latency", "transport": transport, "op": op, "size_bytes": size,
              "samples": samples, "p50_us": round(values[len(values) // 2], 1),
              "p99_us": round(values[int(len(values) * 0.99)], 1)})
    progress(f"{transport} single {size // KiB} KiB: put p50 {sorted(put_us)[samples // 2]:.0f} us,"
             f" get p50 {sorted(get_us)[samples // 2]:.0f} us")
    client.remove_prefix(f"lat/{transport}/")


def run_threads(bodies: list[Callable[[], None]]) -> None:
    """Run each body on a thread of its own; once all ended, raise the first one's error (a
    loader or stream that failed would otherwise leave a figure of 0 keys/s and no error)."""
    with ThreadPoolExecutor(max(1, len(bodies))) as pool:
        futures = [pool.submit(body) for body in bodies]
    for future in futures:  # every body has ended here (the pool's exit waits for them)
        future.result()


def metadata_stream(master: Any, header: Any, op: str, run: str, stream: int, batch: int,
                    stop_at: float, counts: list[int], misses: list[int], preloaded: int,
                    put_round: Callable[[list[str]], None]) -> None:
    """One client thread of the metadata bench; writes its key count into counts[stream] and
    its gets that found nothing into misses[stream] (gets read preloaded keys: all hit)."""
    n = missed = 0
    while time.perf_counter() < stop_at:
        if op == "put":
            put_round([f"{META_PREFIX}/run/{run}/{stream}/{n + i}" for i in range(batch)])
        else:
            keys = [f"{META_PREFIX}/pre/{(n + i + stream * 1009) * 7919 % preloaded}"
                    for i in range(batch)]
            reply = master.call("GetReplicas", pb.GetReplicasRequest(header=header, keys=keys),
                                time.monotonic() + RPC_TIMEOUT_S)
            pins = [r.pin_id for r in reply.results if r.pin_id]
            missed += len(keys) - len(pins)
            master.call("Unpin", pb.UnpinRequest(header=header, pin_ids=pins),
                        time.monotonic() + RPC_TIMEOUT_S)
        n += batch
    counts[stream] = n
    misses[stream] = missed


def metadata(address: str, levels: list[int], batch: int, seconds: float, streams: int,
             fast: bool = True, warmup_s: float = 1.0) -> None:
    """keys/s for PutStart+PutEnd and GetReplicas+Unpin with `level` objects in the table,
    through the SDK's own line to the master (the fast line unless `fast` is False).

    Each timed phase follows `warmup_s` of the same work, untimed (connections opened, the
    master past its first batches), so the figure is the steady state."""
    master = MasterChannel(address, fast=fast)
    header = pb.RequestHeader(tenant="default", client_id=f"bench-{os.getpid()}",
                              token=default_token(address) or "")  # what `cellar up` wrote
    master.call("ClusterStatus", pb.ClusterStatusRequest(header=header),
                time.monotonic() + RPC_TIMEOUT_S)  # learns the fast line's port
    in_table = preloaded = 0  # objects in the table; how many of them are meta/pre/<i>
    next_progress = PROGRESS_EVERY_OBJECTS

    # The master alone is measured: no byte is written, so no node seals anything; the bench
    # signs the receipt a node would (it is given the cluster secret), or every PutEnd is
    # refused, nothing enters the table and every get misses.
    secret = os.environ.get("CELLAR_CLUSTER_SECRET", "")
    signer = ReceiptSigner(bytes.fromhex(secret)) if secret else None
    if signer is None:
        progress("metadata: WARNING: no CELLAR_CLUSTER_SECRET: PutEnd carries no receipts, so "
                 "every put is refused and every get misses")

    def receipts(result: Any) -> list[bytes]:
        if signer is None:
            return []
        return [signer.sign(alloc_id=rep.grant.alloc_id, segment_id=rep.segment_id,
                            offset=rep.offset, length=rep.length, epoch=rep.grant.epoch,
                            key_tag=rep.grant.key_tag, checksum=0) for rep in result.replicas]

    def put_round(keys: list[str]) -> None:
        reply = master.call("PutStart", pb.PutStartRequest(header=header, items=[
            pb.PutItem(key=k, size_bytes=64, replicas=1) for k in keys]),
            time.monotonic() + RPC_TIMEOUT_S)
        ends = [pb.PutEndItem(key=k, put_id=r.put_id, checksum=0, receipts=receipts(r))
                for k, r in zip(keys, reply.results, strict=True) if r.status == pb.OK]
        ended = master.call("PutEnd", pb.PutEndRequest(header=header, items=ends),
                            time.monotonic() + RPC_TIMEOUT_S)
        refused = [r.message for r in (*reply.results, *ended.results) if r.status != pb.OK]
        if refused and signer is not None:  # a count of refused puts is no figure
            raise RuntimeError(f"metadata: {len(refused)} of {len(keys)} puts refused, e.g. "
                               f"{refused[0]!r}")

    for level in levels:
        level_started = time.perf_counter()
        while in_table < level:  # load in rounds of `streams` parallel batches
            firsts = [preloaded + k * batch for k in range(streams)
                      if in_table + k * batch < level]
            sizes = [min(batch, level - in_table - k * batch) for k in range(len(firsts))]
            run_threads([functools.partial(
                put_round, [f"{META_PREFIX}/pre/{i}" for i in range(first, first + n)])
                for first, n in zip(firsts, sizes, strict=True)])
            in_table += sum(sizes)
            preloaded += sum(sizes)
            if in_table >= next_progress:
                progress(f"metadata: {in_table:,} objects loaded "
                         f"({time.perf_counter() - level_started:.0f} s)")
                next_progress += PROGRESS_EVERY_OBJECTS
        for op in ("put", "get"):
            for phase, phase_s in (("warm-up", warmup_s), ("timed", seconds)):
                counts = [0] * streams
                misses = [0] * streams
                stop_at = time.perf_counter() + phase_s
                start = time.perf_counter()
                run_threads([functools.partial(
                    metadata_stream, master, header, op, f"{level}-{phase}", s, batch,
                    stop_at, counts, misses, preloaded, put_round) for s in range(streams)])
                elapsed = time.perf_counter() - start
                if phase == "warm-up" and op == "put":
                    in_table += sum(counts)
            rate = sum(counts) / elapsed
            if op == "put":
                in_table += sum(counts)  # the run's keys stay in the table for the next level
            # objects_in_table: `level` plus the keys earlier timed puts left behind (what the
            # master holds now, for its RSS per object)
            emit({"kind": "metadata", "op": op, "objects": level, "batch": batch,
                  "streams": streams, "keys_per_s": round(rate), "misses": sum(misses),
                  "objects_in_table": in_table})
            progress(f"metadata {op} with {level:,} objects: {rate:,.0f} keys/s"
                     + (f" ({sum(misses)} misses!)" if sum(misses) else ""))
    master.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cellar bench client (run by `cellar bench`)")
    parser.add_argument("--address", required=True)
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--sizes", default="65536,1048576,4194304,16777216")
    parser.add_argument("--batches", default="1,16,128")
    parser.add_argument("--reps", type=int, default=3)
    # Bytes each batched rep moves: 1 GiB keeps a rep of large objects >= ~0.1 s even over shm,
    # so one scheduling hiccup of this shared VM cannot decide a row (256 MiB was one batch of
    # 16 x 16 MiB, ~30 ms, and rows moved by 2x between runs).
    parser.add_argument("--target-bytes", type=int, default=1 << 30)
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--metadata-levels", default="10000,1000000")
    parser.add_argument("--metadata-seconds", type=float, default=3.0)
    parser.add_argument("--metadata-streams", type=int, default=4)
    parser.add_argument("--metadata-warmup-seconds", type=float, default=1.0)
    parser.add_argument("--skip", default="", help="comma list of: data,latency,metadata")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    with cellar.connect(args.address, transport=args.transport) as client:
        if "latency" not in skip:
            latency(client, args.transport, 64 * KiB, args.latency_samples)
        if "data" not in skip:
            data_plane(client, [int(s) for s in args.sizes.split(",")],
                       [int(b) for b in args.batches.split(",")], args.reps, args.target_bytes,
                       args.transport)
    if "metadata" not in skip:
        metadata(args.address, [int(v) for v in args.metadata_levels.split(",") if v], 128,
                 args.metadata_seconds, args.metadata_streams,
                 warmup_s=args.metadata_warmup_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
