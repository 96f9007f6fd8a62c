"""The disk tier against this machine's own disk, and what it does for the hit ratio.

    python -m cellar.bench.disk [--reps 5] [--dir DIR] [--out bench/results]   (make bench-disk)

Part 1, throughput (docs/disk-tier.md): one node whose 4 MiB of DRAM is held by a
soft-pinned filler, so every put spills to its disk tier (a file in DIR, default the system
temp dir, on a real disk here) and every get is served from that file: by a same-host client
over shm (memcpy into and out of the client's own mapping of the file) and by one over TCP
(through the node's data port, as a remote client). Baselines: the same batches to a
DRAM-only node over shm and over TCP. Per object size (1 and 4 MiB) and rep: `put_many` of a
batch of 16, `get_many_into` of the same 16 (the master's disk-hit counter confirms the reads
came from disk); nothing is removed, so every batch lands on ranges of the file never written
before (a cache's steady state: its disk tier takes writes on ranges written back long ago or
never, not on pages still dirty from a batch just removed); values and destinations are
page-aligned buffers.
Against, in the same run, the machine's disk ceiling with the node's own flags: sequential
`pwrite` then `pread` of 16 ranges of the same size in one file from and into 16 page-aligned
buffers, buffered (no O_DIRECT, no sync on put, as the node's spilled puts), and the device
underneath: the same with O_DIRECT (where the filesystem refuses it the row says so), and the
loopback TCP ceiling every TCP byte also crosses (bench/ceilings.py: 16 x 4 MiB spans).
Target: >= 0.7x of the buffered ceiling for reads and writes, met or not by the shm column;
the TCP column's ratio is to min(buffered, TCP), what a TCP data plane over this disk could
reach. Median GB/s over the reps after the first.

Part 2, hit ratio: a seeded trace (`trace`: Zipf(s) popularity over a working set 4x the
node's DRAM, 256 KiB objects, key ids shuffled) replayed as a cache does it: get, and on a
miss put. The same trace over the same DRAM alone and over DRAM + a disk tier.

Results: bench/results/disk-<date>-<host>.md (and .json). Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import mmap
import os
import re
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import cellar
from cellar.bench.ceilings import COLD_SPAN_BYTES, tcp_loopback_GBps
from cellar.devtools.page_cache import evict
from cellar.http_fetch import fetch

MIB = 1 << 20
BATCH = 16
SIZES = (MIB, 4 * MIB)
FILLER_BYTES = 4 * MIB  # the node's whole DRAM, soft-pinned: every bench put spills to disk
DISK_BYTES = 512 * MIB
THROUGHPUT_DISK_BYTES = 1 << 30  # every throughput batch at offsets of its own (480 MiB)
TRACE_DRAM = 32 * MIB
TRACE_OBJECT = 256 << 10
TRACE_ACCESSES = 4000
TRACE_SKEW = 0.9
TRACE_SEED = 2212
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
TARGET = 0.7


def trace(seed: int, keys: int, accesses: int, skew: float) -> list[int]:
    """`accesses` key ids in [0, keys): Zipf(`skew`) popularity, ids shuffled (seeded)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, keys + 1) ** skew
    ranks = rng.choice(keys, size=accesses, p=weights / weights.sum())
    order = rng.permutation(keys)
    return [int(order[r]) for r in ranks]


def _aligned(nbytes: int) -> mmap.mmap:
    buf = mmap.mmap(-1, nbytes)
    buf.write(os.urandom(min(nbytes, MIB)) * max(1, nbytes // MIB))
    return buf


CACHE_STEP_BYTES = 4 << 20


def _cache_file(path: Path) -> float:
    """Read all of `path` once, so its pages are in the page cache before the bench writes into
    it; the seconds it took.

    Why: on the VMs here (Firecracker, with free page reporting) memory the guest has not
    touched lately is backed by the host only on first touch, and a page-cache folio taken from
    it fills at ~0.3 GB/s against 6-10 GB/s for one the page cache freed moments ago (measured
    with plain pwrite outside Cellar: a 64 MiB step fell from ~9 to ~0.3 GB/s once the recently
    freed folios ran out, the CPUs in copy_folio_from_iter_atomic, no dirty throttling, no
    device I/O; freed memory goes back to the host within seconds, so warming it earlier does
    not last). The ceilings' files are deleted right after each measurement and reuse warm
    folios; a tier's file keeps every folio it takes, so 16 x 4 MiB TCP puts into the disk
    tier ran 0.3 GB/s in one run and 1.9 in the next. With the tier's file read first, its
    puts write into folios already there (the extents stay unwritten: reading them costs no
    device I/O), which is what the machine's memory, not the host's, allows."""
    buf = bytearray(CACHE_STEP_BYTES)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - started


def _settle_writeback() -> None:
    """Write back every dirty page (sync) before a phase, so an earlier phase's pages are not
    written back (flusher CPU, the device) during a later phase's batches on two cores."""
    os.sync()


def _ceiling_once(directory: Path, bufs: list[mmap.mmap], direct: bool, name: str,
                  cold: bool = False) -> dict[str, float]:
    """One sequential write then read of len(bufs) ranges of one file, from and into `bufs`
    (page-aligned, as Cellar's batches below: one buffer reused for every range stayed in the
    CPU's cache and read 10-17 GB/s, a figure no batch of distinct destinations reaches); GB/s.
    With `cold`, the read once more after the file's pages were evicted. OSError if the
    filesystem refuses the flags."""
    size = len(bufs[0])
    flags = os.O_RDWR | os.O_CREAT | (getattr(os, "O_DIRECT", 0) if direct else 0)
    path = directory / f"ceiling-{name}.bin"
    fd = os.open(path, flags, 0o600)
    try:
        os.posix_fallocate(fd, 0, len(bufs) * size)  # as the node reserves its disk file
        out = {}
        started = time.perf_counter()
        for i, buf in enumerate(bufs):
            os.pwrite(fd, buf, i * size)
        out["write"] = len(bufs) * size / (time.perf_counter() - started) / 1e9
        started = time.perf_counter()
        for i, buf in enumerate(bufs):
            os.preadv(fd, [buf], i * size)
        out["read"] = len(bufs) * size / (time.perf_counter() - started) / 1e9
        if cold:
            evict(fd)
            started = time.perf_counter()
            for i, buf in enumerate(bufs):
                os.preadv(fd, [buf], i * size)
            out["read_cold"] = len(bufs) * size / (time.perf_counter() - started) / 1e9
        return out
    finally:
        os.close(fd)
        path.unlink()


def _file_ceiling(directory: Path, size: int, reps: int, direct: bool) -> dict[str, float] | str:
    """`_ceiling_once` `reps` + 1 times, GB/s medians after the first (buffered: with the cold
    read too); a string if the filesystem refuses O_DIRECT."""
    bufs = [_aligned(size) for _ in range(BATCH)]
    runs: list[dict[str, float]] = []
    for rep in range(reps + 1):
        try:
            runs.append(_ceiling_once(directory, bufs, direct, f"{size}-{rep}-{int(direct)}",
                                      cold=not direct))
        except OSError as exc:
            return f"O_DIRECT refused: {exc.strerror}"
    return {what: statistics.median(run[what] for run in runs[1:]) for what in runs[0]}


def _metric(http_url: str, name: str) -> float:
    text = fetch(http_url, "/metrics", timeout_s=10).decode()
    match = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _cellar(directory: Path | None, reps: int, transport: str) -> dict[int, dict[str, Any]]:
    """Batches over `transport` to the disk tier in `directory`, or (None) to a DRAM-only
    node; from and into page-aligned buffers, as the ceiling's."""
    from cellar.devtools.local_cluster import LocalCluster

    _settle_writeback()
    out: dict[int, dict[str, Any]] = {}
    node_flags: dict[str, Any] = {}
    dram: int | str = "1GiB"
    if directory is not None:
        tier = directory / f"tier-{transport}"
        tier.mkdir()
        node_flags = {"disk_dir": str(tier), "disk_size": THROUGHPUT_DISK_BYTES}
        dram = FILLER_BYTES
    with (LocalCluster(1, dram, node_flags=node_flags) as cluster,
          cellar.connect(cluster.address, transport=transport) as client):
        if directory is not None:
            client.put("bench-disk/filler", bytes(FILLER_BYTES), soft_pin=True)
            _cache_file(next(tier.glob("*.seg")))
        for size in SIZES:
            values = [_aligned(size) for _ in range(BATCH)]
            buffers = [mmap.mmap(-1, size) for _ in range(BATCH)]
            puts, gets, from_disk = [], [], 0.0
            put_ratios, get_ratios = [], []
            ceiling_dir = directory or Path(tempfile.gettempdir())
            for rep in range(reps + 1):
                keys = [f"bench-disk/{size}/{rep}/{i}" for i in range(BATCH)]
                # the ceiling right before each batch, so a ratio compares two moments
                # seconds apart, not two parts of a run minutes apart (this VM's page-cache
                # copy rate moved 7-13 GB/s between runs)
                ceiling = _ceiling_once(ceiling_dir, buffers, False, f"pair-{size}-{rep}")
                started = time.perf_counter()
                assert client.put_many(list(zip(keys, values, strict=True))) == \
                    [cellar.Status.OK] * BATCH
                puts.append(BATCH * size / (time.perf_counter() - started) / 1e9)
                hits = _metric(cluster.http_url, "master_tier_disk_hits")
                started = time.perf_counter()
                assert client.get_many_into(keys, buffers) == [size] * BATCH
                gets.append(BATCH * size / (time.perf_counter() - started) / 1e9)
                from_disk += _metric(cluster.http_url, "master_tier_disk_hits") - hits
                assert buffers[-1][:] == values[-1][:]
                put_ratios.append(puts[-1] / ceiling["write"])
                get_ratios.append(gets[-1] / ceiling["read"])
            out[size] = {"put": statistics.median(puts[1:]), "get": statistics.median(gets[1:]),
                         "put_ratio": statistics.median(put_ratios[1:]),
                         "get_ratio": statistics.median(get_ratios[1:]),
                         "from_disk": int(from_disk), "reads": (reps + 1) * BATCH}
    return out


SEND_BYTES = 64 * MIB
SEND_PIECE_BYTES = 4 * MIB


def _send_paths(directory: Path, reps: int) -> dict[str, float]:
    """How the node could send a disk replica over TCP: `sendmsg` of its mapping (what the
    node does: the kernel copies page-cache pages into the socket once) against `sendfile`
    (no copy on the sending side), SEND_BYTES of a file in `directory` to a receiver's
    `recv_into` over loopback, alternated, GB/s medians."""
    import threading

    path = directory / "send.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    rates: dict[str, list[float]] = {"sendmsg": [], "sendfile": []}
    try:
        os.pwrite(fd, os.urandom(MIB) * (SEND_BYTES // MIB), 0)
        mapped = mmap.mmap(fd, SEND_BYTES, mmap.MAP_SHARED)
        view = memoryview(mapped)
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            for _ in range(reps + 1):
                for way in rates:
                    def serve(way: str = way) -> None:
                        conn, _ = listener.accept()
                        with conn:
                            conn.recv(1)
                            if way == "sendmsg":
                                for start in range(0, SEND_BYTES, SEND_PIECE_BYTES):
                                    conn.sendall(view[start:start + SEND_PIECE_BYTES])
                            else:
                                sent = 0
                                while sent < SEND_BYTES:
                                    sent += os.sendfile(conn.fileno(), fd, sent,
                                                        SEND_BYTES - sent)

                    server = threading.Thread(target=serve)
                    server.start()
                    into = memoryview(bytearray(SEND_BYTES))
                    with socket.create_connection(("127.0.0.1", port)) as client:
                        started = time.perf_counter()
                        client.send(b"x")
                        got = 0
                        while got < SEND_BYTES:
                            got += client.recv_into(into[got:], SEND_BYTES - got)
                        rates[way].append(SEND_BYTES / (time.perf_counter() - started) / 1e9)
                    server.join()
        view.release()
        mapped.close()
    finally:
        os.close(fd)
        path.unlink()
    return {way: statistics.median(r[1:]) for way, r in rates.items()}


COLD_DISK_BYTES = 1 << 30  # room for every cold rep's objects at offsets of their own


def _cold_gets(directory: Path, reps: int) -> dict[int, dict[str, Any]]:
    """Cold disk-tier reads. Per object size and rep: BATCH objects spilled to disk by a shm
    client that then closes (its mapping goes), the file's pages evicted (`_evict`), and the
    batch read by a new client over shm (the client's copy faults the pages in from the
    device); evicted again, then over TCP (the node's send faults them in). Nothing is removed
    between reps, so each rep's objects sit at offsets no process has mapped yet (a page the
    node mapped once cannot be evicted). GB/s medians, and the smallest share of a batch's
    bytes an eviction dropped (the check that the reads were cold)."""
    from cellar.devtools.local_cluster import LocalCluster

    _settle_writeback()
    tier = directory / "tier-cold"
    tier.mkdir()
    out: dict[int, dict[str, Any]] = {}
    with LocalCluster(1, FILLER_BYTES, node_flags={"disk_dir": str(tier),
                                                   "disk_size": COLD_DISK_BYTES}) as cluster:
        with cellar.connect(cluster.address, transport="shm") as writer:
            writer.put("bench-disk/filler", bytes(FILLER_BYTES), soft_pin=True)
        disk_file = next(tier.glob("*.seg"))
        for size in SIZES:
            values = [_aligned(size) for _ in range(BATCH)]
            buffers = [mmap.mmap(-1, size) for _ in range(BATCH)]
            rates: dict[str, list[float]] = {"shm": [], "tcp": []}
            evicted = BATCH * size
            for rep in range(reps + 1):
                keys = [f"bench-disk/cold/{size}/{rep}/{i}" for i in range(BATCH)]
                with cellar.connect(cluster.address, transport="shm") as writer:
                    assert writer.put_many(list(zip(keys, values, strict=True))) == \
                        [cellar.Status.OK] * BATCH
                for transport, got in rates.items():
                    fd = os.open(disk_file, os.O_RDONLY)
                    try:
                        evicted = min(evicted, evict(fd))
                    finally:
                        os.close(fd)
                    with cellar.connect(cluster.address, transport=transport) as reader:
                        started = time.perf_counter()
                        assert reader.get_many_into(keys, buffers) == [size] * BATCH
                        got.append(BATCH * size / (time.perf_counter() - started) / 1e9)
                    assert buffers[-1][:] == values[-1][:]
            out[size] = {way: statistics.median(r[1:]) for way, r in rates.items()}
            out[size]["evicted_fraction"] = evicted / (BATCH * size)
    return out


def _hit_ratio(directory: Path | None) -> dict[str, Any]:
    """Replay the trace as a cache: get, put on a miss. `directory`: the disk tier, or None."""
    from cellar.devtools.local_cluster import LocalCluster

    keys = 4 * TRACE_DRAM // TRACE_OBJECT
    accesses = trace(TRACE_SEED, keys, TRACE_ACCESSES, TRACE_SKEW)
    node_flags: dict[str, Any] = {}
    if directory is not None:
        (directory / "trace").mkdir()
        node_flags = {"disk_dir": str(directory / "trace"), "disk_size": DISK_BYTES}
    value = os.urandom(TRACE_OBJECT)
    buffer = bytearray(TRACE_OBJECT)
    hits = 0
    with (LocalCluster(1, TRACE_DRAM, node_flags=node_flags) as cluster,
          cellar.connect(cluster.address) as client):
        for key in accesses:
            name = f"trace/{key:05d}"
            if client.get_many_into([name], [buffer]) == [TRACE_OBJECT]:
                hits += 1
            else:
                client.put_many([(name, value)])
        from_disk = _metric(cluster.http_url, "master_tier_disk_hits")
    return {"hits": hits, "accesses": len(accesses), "ratio": hits / len(accesses),
            "from_disk": int(from_disk)}


def markdown(result: dict[str, Any]) -> str:
    when, host = result["when"], result["host"]
    lines = [f"Cellar disk-tier bench, {when} on {host} (`make bench-disk`): batch of {BATCH}, "
             f"GB/s medians of {result['reps']} reps after a warm-up, from and into "
             f"page-aligned buffers; the disk file in `{result['dir_fs']}`.", "",
             f"TCP loopback ceiling (16 x 4 MiB spans): {result['tcp_GBps']:.2f} GB/s.", "",
             "Each disk tier's file was read once before its batches (`_cache_file` says why).",
             "",
             "Ratios pair each batch with the buffered ceiling measured just before it "
             "(median of the per-rep ratios); the ceiling column is the median of its own "
             "reps.", "",
             "| object | op | disk tier, shm (same host) | ratio to buffered (target >= 0.7) "
             "| disk tier, TCP | ratio to min(buffered, TCP) | DRAM tier, shm | DRAM tier, TCP "
             "| buffered ceiling | O_DIRECT (device) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for size in SIZES:
        key = str(size)
        buffered, direct = result["buffered"][key], result["direct"][key]
        for op, ceiling_op in (("put", "write"), ("get", "read")):
            ceiling = buffered[ceiling_op]
            shm, tcp = result["disk_shm"][key][op], result["disk_tcp"][key][op]
            dev = f"{direct[ceiling_op]:.2f}" if isinstance(direct, dict) else direct
            paired = result["disk_shm"][key][f"{op}_ratio"]
            lines.append(f"| {size // MIB} MiB | {op} | {shm:.2f} | {paired:.2f} "
                         f"| {tcp:.2f} | {tcp / min(ceiling, result['tcp_GBps']):.2f} "
                         f"| {result['dram_shm'][key][op]:.2f} | {result['dram_tcp'][key][op]:.2f} "
                         f"| {ceiling:.2f} | {dev} |")
    lines.append("")
    lines.append("Reads served from the disk tier (master_tier_disk_hits), shm / TCP: "
                 + ", ".join(f"{result['disk_shm'][str(s)]['from_disk']}/"
                             f"{result['disk_tcp'][str(s)]['from_disk']} of "
                             f"{result['disk_shm'][str(s)]['reads']} at {s // MIB} MiB"
                             for s in SIZES) + ".")
    evicted = min(result["cold"][str(s)]["evicted_fraction"] for s in SIZES)
    lines += ["", "Cold reads (before each read the disk file's pages are evicted: at least "
              f"{evicted:.0%} of a batch's bytes left the page cache each time):", "",
              "| object | disk tier get, shm | disk tier get, TCP | buffered cold read ceiling "
              "| ratio shm / ceiling | O_DIRECT read (device) |", "|---|---|---|---|---|---|"]
    for size in SIZES:
        cold, buffered = result["cold"][str(size)], result["buffered"][str(size)]
        direct = result["direct"][str(size)]
        dev = f"{direct['read']:.2f}" if isinstance(direct, dict) else direct
        lines.append(f"| {size // MIB} MiB | {cold['shm']:.2f} | {cold['tcp']:.2f} "
                     f"| {buffered['read_cold']:.2f} | {cold['shm'] / buffered['read_cold']:.2f} "
                     f"| {dev} |")
    send = result["send"]
    lines += ["", f"Sending {SEND_BYTES // MIB} MiB of the disk file over loopback TCP "
              f"(medians): sendmsg of its mapping (the node's way) {send['sendmsg']:.2f} GB/s, "
              f"sendfile {send['sendfile']:.2f} GB/s."]
    dram, tiered = result["trace"]["dram"], result["trace"]["disk"]
    lines += ["", f"Hit ratio of a replayed trace (Zipf {TRACE_SKEW}, {TRACE_ACCESSES} accesses, "
              f"seed {TRACE_SEED}, {4 * TRACE_DRAM // TRACE_OBJECT} keys of "
              f"{TRACE_OBJECT >> 10} KiB = 4x the node's {TRACE_DRAM // MIB} MiB DRAM; get, put on "
              "a miss):", "", "| cache | hits | hit ratio | hits served from disk |",
              "|---|---|---|---|",
              f"| DRAM alone | {dram['hits']}/{dram['accesses']} | {dram['ratio']:.3f} | - |",
              f"| DRAM + {DISK_BYTES // MIB} MiB disk | {tiered['hits']}/{tiered['accesses']} | "
              f"{tiered['ratio']:.3f} | {tiered['from_disk']} |"]
    return "\n".join(lines) + "\n"


def _filesystem(path: Path) -> str:
    best, fs = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, fs = parts[1], f"{parts[2]} on {parts[0]}"
    except OSError:
        pass
    return fs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the disk files go (default: the system temp dir)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="cellar-bench-disk-", dir=args.dir))
    try:
        result: dict[str, Any] = {
            "when": f"{dt.datetime.now():%Y-%m-%d %H:%M}", "host": socket.gethostname(),
            "reps": args.reps, "dir_fs": f"{directory} ({_filesystem(directory)})",
            "buffered": {str(s): _file_ceiling(directory, s, args.reps, False) for s in SIZES},
            "direct": {str(s): _file_ceiling(directory, s, args.reps, True) for s in SIZES},
            "tcp_GBps": statistics.median(tcp_loopback_GBps(1 << 30, COLD_SPAN_BYTES)
                                          for _ in range(3)),
            "send": _send_paths(directory, args.reps),
            "cold": {str(k): v for k, v in _cold_gets(directory, args.reps).items()},
            **{name: {str(k): v for k, v in _cellar(where, args.reps, transport).items()}
               for name, where, transport in (("disk_shm", directory, "shm"),
                                              ("disk_tcp", directory, "tcp"),
                                              ("dram_shm", None, "shm"),
                                              ("dram_tcp", None, "tcp"))},
            "trace": {"dram": _hit_ratio(None), "disk": _hit_ratio(directory)},
        }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    text = markdown(result)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"disk-{dt.datetime.now():%Y-%m-%d}-{socket.gethostname()}"
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
