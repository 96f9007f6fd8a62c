"""Failover, measured: kill -9 the leader of an HA cluster under traffic, time the takeover.

What it owns
    One run (`run_failover`) on a started `LocalCluster(ha=True)`: preload `objects` objects of
    random bytes through `etcd://`, start a putter and a getter thread (`TrafficStream`, each
    with its own client and per-call timeout), kill -9 the leader, wait until a put issued
    after the kill succeeds, then read back every object ever acknowledged and compare it byte
    for byte. The result (`FailoverRun`) carries the failover time (kill -> first successful put
    issued after the kill), the new leader's own takeover figures (`/api/v1/status` "takeover":
    rebuild duration, recovered objects), and every error the stream saw with how long its call
    had run. The HA fault test asserts on one run; `make failover` (`main`) runs it 5 times on
    fresh clusters and writes the median to bench/results/failover.{json,md}.

Payloads
    Derived from the key (`payload(key)`: size and bytes from a PRNG seeded by the key), so any
    object can be checked without keeping a copy, and a byte that changed or came from another
    key is caught.

What it must never do
    Assert (callers decide what counts as failure), or wait without a deadline.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

KIB = 1 << 10
MAX_PAYLOAD_BYTES = 16 * KIB
DEFAULT_OBJECTS = 1000
DEFAULT_CLIENT_TIMEOUT_S = 20.0
STREAM_PAUSE_S = 0.005          # between two calls of one stream thread: leave CPU to the cluster
SETTLE_S = 1.0                  # traffic before the kill
AFTER_RECOVERY_S = 1.0          # traffic after the first successful put, before stopping
RECOVERY_WAIT_S = 60.0          # give up waiting for a successful put after this long
TAKEOVER_WAIT_S = 30.0
VERIFY_BATCH_KEYS = 200
MAX_ERRORS_KEPT = 1000


def payload(key: str, seed: int = 0) -> bytes:
    """The bytes stored under `key`: 1 B .. 16 KiB, a function of (seed, key) only."""
    rng = random.Random(f"{seed}:{key}")
    return rng.randbytes(rng.randint(1, MAX_PAYLOAD_BYTES))


@dataclass
class Op:
    kind: str            # "put" | "get"
    key: str
    started: float       # time.monotonic()
    ended: float
    ok: bool
    error: str = ""      # exception type and message; "corrupt" for a wrong read

    @property
    def elapsed_s(self) -> float:
        return self.ended - self.started


class TrafficStream(threading.Thread):
    """Puts fresh keys (`kind="put"`) or reads preloaded ones (`kind="get"`), one call at a
    time until `stop()`, recording every call."""

    def __init__(self, client: Any, kind: str, *, prefix: str, read_keys: Sequence[str] = (),
                 seed: int = 0) -> None:
        super().__init__(name=f"failover-{kind}", daemon=True)
        if kind not in ("put", "get") or (kind == "get" and not read_keys):
            raise ValueError("kind must be 'put', or 'get' with read_keys")
        self.client = client
        self.kind = kind
        self.prefix = prefix
        self.read_keys = list(read_keys)
        self.seed = seed
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._rng = random.Random(seed)

    def stop(self, join_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S * 2) -> None:
        self._stop_event.set()
        self.join(join_timeout_s)

    def snapshot(self) -> list[Op]:
        with self._lock:
            return list(self.ops)

    def run(self) -> None:
        i = 0
        while not self._stop_event.is_set():
            if self.kind == "put":
                op = self._call("put", f"{self.prefix}/{i}", self._put_one)
            else:
                op = self._call("get", self._rng.choice(self.read_keys), self._get_one)
            with self._lock:
                self.ops.append(op)
            i += 1
            self._stop_event.wait(STREAM_PAUSE_S)

    def _put_one(self, key: str) -> None:
        self.client.put(key, payload(key, self.seed))

    def _get_one(self, key: str) -> None:
        got = self.client.get(key)
        if got != payload(key, self.seed):
            raise AssertionError(f"corrupt read of {key!r}: {len(got)} bytes differ from the put")

    @staticmethod
    def _call(kind: str, key: str, fn: Callable[[str], None]) -> Op:
        started = time.monotonic()
        try:
            fn(key)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, the caller judges
            return Op(kind, key, started, time.monotonic(), False, f"{type(exc).__name__}: {exc}")
        return Op(kind, key, started, time.monotonic(), True)


@dataclass
class FailoverRun:
    failover_s: float               # kill -> first successful put issued after the kill
    old_leader: str
    new_leader: str
    old_epoch: int
    new_epoch: int
    takeover_duration_s: float      # the new leader's rebuild, from its /api/v1/status
    recovered_objects: int          # objects the new leader rebuilt from the nodes' reports
    preloaded: int
    acked_puts: int                 # stream puts acknowledged (before and after the kill)
    acked_before_kill: int          # acknowledged objects when the leader died (preload incl.)
    ambiguous_puts: int             # puts that reported AlreadyExists on their own fresh key
    verified: int                   # objects read back byte-exact after the failover
    missing: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    stream_calls: int = 0
    puts_ok_after_kill: int = 0     # calls issued after the kill that succeeded
    gets_ok_after_kill: int = 0
    stream_errors: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _status_epoch(status: dict[str, Any] | None) -> int:
    return int(status.get("epoch", 0)) if status else 0


def wait_takeover(cluster: Any, index: int, timeout_s: float = TAKEOVER_WAIT_S) -> dict[str, Any]:
    """Master `index`'s status once its takeover is complete (every node reported)."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        status = cluster.master_status(index)
        if status and status.get("role") == "leader" and (status.get("takeover") or {}).get("complete"):
            return status
        time.sleep(0.1)
    raise TimeoutError(f"master-{index} did not complete a takeover within {timeout_s:g}s "
                       f"(last status: {status and {k: status.get(k) for k in ('role', 'takeover')}})")


def run_failover(cluster: Any, *, objects: int = DEFAULT_OBJECTS, seed: int = 0,
                 client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S,
                 log: Callable[[str], None] = lambda _m: None) -> FailoverRun:
    """Preload, stream, kill -9 the leader, verify; see the module docstring."""
    import cellar
    from cellar.errors import Status

    old = cluster.leader()
    old_status = wait_takeover(cluster, old)
    old_epoch = _status_epoch(old_status)
    url = cluster.address
    clients = [cellar.connect(url, timeout_s=client_timeout_s) for _ in range(3)]
    loader, putter_client, getter_client = clients
    try:
        preload = {f"pre/{i}": payload(f"pre/{i}", seed) for i in range(objects)}
        statuses = loader.put_many(preload)
        bad = [k for k, s in zip(preload, statuses, strict=True) if s != Status.OK]
        if bad:
            raise RuntimeError(f"{len(bad)} preload puts failed, e.g. {bad[0]!r}: {statuses[0]}")
        log(f"preloaded {objects} objects; leader master-{old} epoch {old_epoch}")
        putter = TrafficStream(putter_client, "put", prefix="stream", seed=seed)
        getter = TrafficStream(getter_client, "get", prefix="stream", read_keys=list(preload),
                               seed=seed)
        putter.start()
        getter.start()
        time.sleep(SETTLE_S)

        killed_at = time.monotonic()
        cluster.kill_master(old)
        acked_before_kill = objects + sum(
            1 for op in putter.snapshot() if op.ok and op.ended < killed_at)
        log(f"killed master-{old} (kill -9) with {acked_before_kill} objects acknowledged")

        first_ok: Op | None = None
        deadline = killed_at + RECOVERY_WAIT_S
        while first_ok is None and time.monotonic() < deadline:
            first_ok = next((op for op in putter.snapshot()
                             if op.ok and op.started >= killed_at), None)
            if first_ok is None:
                time.sleep(0.02)
        time.sleep(AFTER_RECOVERY_S)
        putter.stop()
        getter.stop()
        if first_ok is None:
            raise TimeoutError(f"no put succeeded within {RECOVERY_WAIT_S:g}s of the kill")
        failover_s = first_ok.ended - killed_at
        log(f"first successful put {failover_s:.3f}s after the kill")

        new = cluster.leader(not_index=old)
        new_status = wait_takeover(cluster, new)
        takeover = new_status.get("takeover") or {}

        acked = [op.key for op in putter.snapshot() if op.ok]
        # A put whose first attempt the old leader committed just before dying, retried on the
        # new leader, may report AlreadyExists although the bytes are ours: check those too.
        ambiguous = [op.key for op in putter.snapshot()
                     if not op.ok and op.error.startswith("AlreadyExists")]
        expected_keys = list(preload) + acked + ambiguous
        missing: list[str] = []
        corrupt: list[str] = []
        for start in range(0, len(expected_keys), VERIFY_BATCH_KEYS):
            batch = expected_keys[start:start + VERIFY_BATCH_KEYS]
            for key, got in zip(batch, loader.get_many(batch), strict=True):
                if got is None:
                    missing.append(key)
                elif got != payload(key, seed):
                    corrupt.append(key)
        ops = putter.snapshot() + getter.snapshot()
        errors = [
            {"kind": op.kind, "key": op.key, "error": op.error,
             "elapsed_s": round(op.elapsed_s, 3),
             "started_after_kill_s": round(op.started - killed_at, 3)}
            for op in ops if not op.ok
        ][:MAX_ERRORS_KEPT]
        return FailoverRun(
            failover_s=round(failover_s, 3),
            old_leader=cluster.masters[old].name, new_leader=cluster.masters[new].name,
            old_epoch=old_epoch, new_epoch=_status_epoch(new_status),
            takeover_duration_s=float(takeover.get("duration_s", 0.0)),
            recovered_objects=int(takeover.get("recovered_objects", 0)),
            preloaded=objects, acked_puts=len(acked), acked_before_kill=acked_before_kill,
            verified=len(expected_keys) - len(missing) - len(corrupt),
            ambiguous_puts=len(ambiguous),
            missing=missing[:100], corrupt=corrupt[:100],
            stream_calls=len(ops),
            puts_ok_after_kill=sum(1 for op in ops if op.kind == "put" and op.ok
                                   and op.started >= killed_at),
            gets_ok_after_kill=sum(1 for op in ops if op.kind == "get" and op.ok
                                   and op.started >= killed_at),
            stream_errors=errors,
        )
    finally:
        for client in clients:
            client.close()


# ---- make failover --------------------------------------------------------------------------

def _markdown(runs: list[FailoverRun], summary: dict[str, Any]) -> str:
    lines = [
        "# Failover: kill -9 the leader under puts and gets",
        "",
        f"etcd + 2 masters (lease {summary['lease_ttl_s']} s) + {summary['nodes']} nodes on "
        f"127.0.0.1; {summary['objects']} objects preloaded per run, fresh cluster per run. "
        "Failover = kill -> first successful put issued after the kill.",
        "",
        "| run | failover s | takeover s | recovered objects | acked before kill | verified "
        "| missing | corrupt | stream errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, run in enumerate(runs, 1):
        lines.append(f"| {i} | {run.failover_s:.2f} | {run.takeover_duration_s:.2f} | "
                     f"{run.recovered_objects} | {run.acked_before_kill} | {run.verified} | "
                     f"{len(run.missing)} | {len(run.corrupt)} | {len(run.stream_errors)} |")
    lines.append("")
    for i, run in enumerate(runs, 1):
        for error in run.stream_errors[:3]:
            lines.append(f"- run {i}: {error['kind']} {error['key']} failed after "
                         f"{error['elapsed_s']:.2f} s ({error['error']})")
    lines += [f"**Median failover: {summary['median_failover_s']:.2f} s** "
                  f"(min {summary['min_failover_s']:.2f}, max {summary['max_failover_s']:.2f}); "
                  f"median recovered objects {summary['median_recovered_objects']:g}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from cellar.devtools.local_cluster import LocalCluster

    parser = argparse.ArgumentParser(
        prog="python -m cellar.bench.failover",
        description="Kill -9 the leader of a local HA cluster under traffic, N times; print the "
                    "median failover time and the recovered-object counts.")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--objects", type=int, default=DEFAULT_OBJECTS)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--lease-ttl-s", type=int, default=3)
    parser.add_argument("--out", default="bench/results/failover",
                        help="writes OUT.json and OUT.md (default bench/results/failover)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.objects < 1 or args.nodes < 1:
        parser.error("--runs, --objects and --nodes must be at least 1")

    runs: list[FailoverRun] = []
    for i in range(args.runs):
        cluster = LocalCluster(args.nodes, "64MiB", ha=True, masters=2,
                               lease_ttl_s=args.lease_ttl_s)
        def log(message: str, run_number: int = i + 1) -> None:
            print(f"[run {run_number}] {message}", flush=True)

        try:
            cluster.start()
            run = run_failover(cluster, objects=args.objects, seed=i, log=log)
        finally:
            cluster.stop()
        runs.append(run)
        print(f"[run {i + 1}] failover {run.failover_s:.2f}s, takeover {run.takeover_duration_s:.2f}s, "
              f"recovered {run.recovered_objects}, verified {run.verified}, missing "
              f"{len(run.missing)}, corrupt {len(run.corrupt)}, stream errors "
              f"{len(run.stream_errors)}", flush=True)
    failovers = [r.failover_s for r in runs]
    summary = {
        "runs": args.runs, "objects": args.objects, "nodes": args.nodes,
        "lease_ttl_s": args.lease_ttl_s,
        "median_failover_s": statistics.median(failovers),
        "min_failover_s": min(failovers), "max_failover_s": max(failovers),
        "median_recovered_objects": statistics.median(r.recovered_objects for r in runs),
        "recovered_objects": [r.recovered_objects for r in runs],
        "lost_or_corrupt": sum(len(r.missing) + len(r.corrupt) for r in runs),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"summary": summary, "runs": [r.to_dict() for r in runs]}, indent=2) + "\n")
    text = _markdown(runs, summary)
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 1 if summary["lost_or_corrupt"] else 0


if __name__ == "__main__":
    sys.exit(main())
