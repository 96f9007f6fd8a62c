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
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

import cellar
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc

KiB, MiB = 1 << 10, 1 << 20


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


def ops_per_rep(size_bytes: int, batch: int, target_bytes: int) -> int:
    """Enough ops to move about target_bytes, at least one batch, a whole number of batches."""
    ops = max(batch, min(4096, target_bytes // size_bytes))
    return max(batch, ops // batch * batch)


def timed_reps(reps: int, body: Callable[[int], None]) -> list[float]:
    """Run body(rep) `reps` times; returns seconds per rep."""
    seconds = []
    for rep in range(reps):
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


def get_rep(client: cellar.Client, prefix: str, ops: int, batch: int,
            destinations: list[Any] | None, rep: int) -> None:
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
                put_s = timed_reps(reps, functools.partial(put_rep, client, prefix, ops, batch,
                                                           value))
                get_s = timed_reps(reps, functools.partial(get_rep, client, prefix, ops, batch,
                                                           dests))
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


def metadata_stream(stub: Any, header: Any, op: str, level: int, stream: int, batch: int,
                    stop_at: float, counts: list[int],
                    put_round: Callable[[list[str]], None]) -> None:
    """One client thread of the metadata bench; writes its key count into counts[stream]."""
    n = 0
    while time.perf_counter() < stop_at:
        if op == "put":
            put_round([f"meta/run/{level}/{stream}/{n + i}" for i in range(batch)])
        else:
            keys = [f"meta/pre/{(n + i) * 7919 % level}" for i in range(batch)]
            reply = stub.GetReplicas(pb.GetReplicasRequest(header=header, keys=keys))
            stub.Unpin(pb.UnpinRequest(header=header, pin_ids=[
                r.pin_id for r in reply.results if r.pin_id]))
        n += batch
    counts[stream] = n


def metadata(address: str, levels: list[int], batch: int, seconds: float, streams: int) -> None:
    """keys/s for PutStart+PutEnd and GetReplicas+Unpin with `level` objects in the table."""
    options = [("grpc.max_receive_message_length", 4 * MiB)]
    channel = grpc.insecure_channel(address, options=options)
    stub = pb_grpc.MasterStub(channel)
    header = pb.RequestHeader(tenant="default", client_id=f"bench-{os.getpid()}")
    loaded = 0

    def put_round(keys: list[str]) -> None:
        reply = stub.PutStart(pb.PutStartRequest(header=header, items=[
            pb.PutItem(key=k, size_bytes=64, replicas=1) for k in keys]))
        ends = [pb.PutEndItem(key=k, put_id=r.put_id, checksum=0)
                for k, r in zip(keys, reply.results, strict=True) if r.status == pb.OK]
        stub.PutEnd(pb.PutEndRequest(header=header, items=ends))

    for level in levels:
        while loaded < level:
            n = min(batch, level - loaded)
            put_round([f"meta/pre/{i}" for i in range(loaded, loaded + n)])
            loaded += n
            if loaded % 200_000 < batch:
                progress(f"metadata: {loaded} objects loaded")
        for op in ("put", "get"):
            counts = [0] * streams
            stop_at = time.perf_counter() + seconds
            threads = [threading.Thread(target=metadata_stream,
                                        args=(stub, header, op, level, s, batch, stop_at,
                                              counts, put_round))
                       for s in range(streams)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - start
            rate = sum(counts) / elapsed
            emit({"kind": "metadata", "op": op, "objects": level, "batch": batch,
                  "streams": streams, "keys_per_s": round(rate)})
            progress(f"metadata {op} with {level} objects: {rate:,.0f} keys/s")
            if op == "put":
                loaded += sum(counts)  # the run's keys stay in the table for the next level
    channel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cellar bench client (run by `cellar bench`)")
    parser.add_argument("--address", required=True)
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--sizes", default="65536,1048576,4194304,16777216")
    parser.add_argument("--batches", default="1,16,128")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--target-bytes", type=int, default=256 * MiB)
    parser.add_argument("--latency-samples", type=int, default=1000)
    parser.add_argument("--metadata-levels", default="10000,1000000")
    parser.add_argument("--metadata-seconds", type=float, default=3.0)
    parser.add_argument("--metadata-streams", type=int, default=4)
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
                 args.metadata_seconds, args.metadata_streams)
    return 0


if __name__ == "__main__":
    sys.exit(main())
