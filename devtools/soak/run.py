"""`cellar soak` itself: start the cluster and the workers, run the chaos, settle, judge.

What it owns
    `run_soak`: a `LocalCluster` with the soak's short liveness settings (or etcd + masters
    with --ha), N worker processes (`python -m cellar.devtools.soak --worker ...`), the watcher
    thread, the chaos loop in this process until the load ends, then settling the cluster and
    the workers' final pass, the report (JSON with --report) and the exit status: 1 on any
    corrupt read, stale read, unexplained loss, eviction under half full, early worker exit
    or (with --ha) failed takeover. `main`
    parses the command line and dispatches worker mode.

What it must never do
    Leave a process behind or stopped: workers are killed and every stopped child continued in
    `finally`, and the cluster's logs are kept only when the run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

from cellar.devtools.soak.chaos import Chaos
from cellar.devtools.soak.kinds import face_of, transport_of
from cellar.devtools.soak.report import build_report, print_summary, progress_line
from cellar.devtools.soak.settings import (
    MASTER_FLAGS,
    PROGRESS_INTERVAL_S,
    WORKER_FINISH_TIMEOUT_S,
    build_parser,
)
from cellar.devtools.soak.values import HEADER
from cellar.devtools.soak.watcher import Watcher, now_s, stamp
from cellar.devtools.soak.worker import worker_main
from cellar.lifecycle import PARENT_PID_ENV
from cellar.units import format_size, parse_duration_s, parse_size_bytes


def master_invariants(cluster: Any) -> str:
    """"" when the leader's full table check (GET /api/v1/invariants, cellar.master.state.audit)
    passes after the soak, else what it found broken: the check is O(n), so it runs once, at
    the end, not on the hot path."""
    try:
        body = cluster.admin_request("GET", "/api/v1/invariants")
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read() or b"{}")
    return "" if body.get("ok") else f"master invariants broken: {body}"


def run_soak(args: argparse.Namespace) -> int:
    from cellar.devtools.local_cluster import LocalCluster

    duration_s = parse_duration_s(args.duration)
    chaos_interval_s = parse_duration_s(args.chaos_interval)
    segment_bytes = parse_size_bytes(args.segment_size)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    rng = random.Random(seed)
    run_id = f"{int(time.time())}-{os.getpid()}"
    started = now_s()

    def log(message: str) -> None:
        print(f"[{stamp(now_s())} +{now_s() - started:6.1f}s] {message}", flush=True)

    master_flags = {**MASTER_FLAGS, "default_replicas": args.replicas}
    expire_after_s = float(master_flags["node_expire_after_s"])
    log(f"soak: seed {seed}, {args.nodes} nodes x {format_size(segment_bytes)}, "
        f"{args.clients} clients x {args.keys} keys, replicas {args.replicas}, "
        f"duration {duration_s:g}s, a fault every ~{chaos_interval_s:g}s")
    if args.ha:
        log(f"high availability: etcd + {args.masters} masters, lease {args.lease_ttl_s}s")
        cluster = LocalCluster(args.nodes, segment_bytes, master_flags=master_flags,
                               node_flags={"heartbeat_interval_s": 0.3}, ha=True,
                               masters=args.masters, lease_ttl_s=args.lease_ttl_s,
                               cluster_name=f"soak{os.getpid()}", tls=args.tls)
    else:
        cluster = LocalCluster(args.nodes, segment_bytes, master_flags=master_flags,
                               node_flags={"heartbeat_interval_s": 0.3}, tls=args.tls)
    if args.disk_size:  # one folder: each node's file is named by its node id
        disk_dir = cluster.run_dir / "disk"
        disk_dir.mkdir(parents=True, exist_ok=True)
        cluster.node_flags.update(disk_dir=str(disk_dir),
                                  disk_size=parse_size_bytes(args.disk_size))
        log(f"disk tier: {format_size(parse_size_bytes(args.disk_size))} per node in {disk_dir}")
    workers: list[subprocess.Popen[bytes]] = []
    watcher = Watcher(cluster)
    chaos = Chaos(cluster, watcher, rng, expire_after_s, log,
                  lease_ttl_s=float(args.lease_ttl_s) if args.ha else 0.0)
    work_dir = cluster.run_dir / "soak"
    failure = ""
    try:
        cluster.start()
        log(f"cluster up: {'etcd ' if args.ha else 'master '}{cluster.address}, "
            f"logs in {cluster.run_dir}")
        work_dir.mkdir(parents=True, exist_ok=True)
        watcher.start()
        load_until = now_s() + duration_s
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        for i in range(args.clients):
            argv = [sys.executable, "-m", "cellar.devtools.soak", "--worker", "--id", str(i),
                    "--master", cluster.address, "--dir", str(work_dir),
                    "--load-until", repr(load_until), "--seed", str(seed * 1000 + i),
                    "--keys", str(args.keys), "--replicas", str(args.replicas),
                    "--min-size", str(parse_size_bytes(args.min_size)),
                    "--max-size", str(parse_size_bytes(args.max_size)),
                    "--page-size", str(parse_size_bytes(args.page_size)),
                    "--page-share", repr(args.page_share), "--run-id", run_id,
                    "--batch-share", repr(args.batch_share),
                    "--face", face_of(args.faces, i),
                    "--transport", transport_of(args.transports, i)]
            with open(work_dir / f"worker-{i}.log", "wb") as out:
                workers.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, env=env))
        next_fault = time.monotonic() + chaos_interval_s * rng.uniform(0.5, 1.5)
        next_progress = time.monotonic() + PROGRESS_INTERVAL_S
        while now_s() < load_until:
            if any(w.poll() is not None for w in workers):
                failure = "a worker exited early (see its log in " + str(work_dir) + ")"
                break
            if time.monotonic() >= next_progress:
                log(progress_line(work_dir, chaos, watcher))
                next_progress = time.monotonic() + PROGRESS_INTERVAL_S
            if time.monotonic() >= next_fault and now_s() < load_until - 1.0:
                chaos.inject()
                next_fault = time.monotonic() + chaos_interval_s * rng.uniform(0.5, 1.5)
            time.sleep(0.1)
        if not failure:
            log("load over: settling the cluster for the final pass")
            chaos.wait_whole()
            if any(f.leader_changed for f in chaos.faults[-1:]):
                time.sleep(float(master_flags["rebuild_grace_s"]))
            (work_dir / "settled").touch()
            log("final pass: every worker reads every key it believes present")
            deadline = time.monotonic() + WORKER_FINISH_TIMEOUT_S
            for w in workers:
                try:
                    w.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    failure = "a worker did not finish its final pass in time"
            log("master invariants: the full O(n) check of the leader's tables")
            failure = failure or master_invariants(cluster)
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
        log(f"soak aborted: {failure}")
    finally:
        watcher.stop_event.set()
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        for child in [*cluster.masters, *cluster.nodes]:
            if child is not None and child.alive():
                assert child.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGCONT)
        if cluster.etcd is not None and cluster.etcd.paused:
            cluster.etcd.resume()
        report = build_report(args, seed, started, work_dir, chaos, watcher, failure)
        ha_failures = (report.get("leader_stops_without_takeover", 0)
                       + report.get("etcd_outages_within_fence_window_that_changed_leader", 0))
        keep = bool(args.keep_run_dir or failure or report["corrupt_reads"]
                    or report["stale_reads"] or report["lost"]["unexplained"]
                    or report["evicted_below_half_full"] or ha_failures)
        if keep:  # keep the logs for the post-mortem
            cluster.keep_run_dir = True
            report["run_dir"] = str(cluster.run_dir)
        cluster.stop()
    print_summary(report, log)
    if args.report:
        report_path = Path(args.report)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2, default=str))
        log(f"report written to {args.report}")
    # HA: a leader stopped past its lease that no standby replaced, or a leader deposed by an
    # etcd outage it should have ridden out, is a failover failure too
    # A stale read (an acknowledged remove or upsert undone) fails the run: removes and upserts
    # are durable (cellar.master.serving.removal_log); report.classify_stale says which fault.
    # An eviction in a cluster under half full is a fault of its own (report.py).
    ok = (not failure and report["corrupt_reads"] == 0 and report["stale_reads"] == 0
          and report["lost"]["unexplained"] == 0 and report["evicted_below_half_full"] == 0
          and not ha_failures)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        args.min_size = int(args.min_size)
        args.max_size = int(args.max_size)
        args.page_size = int(args.page_size)
        return worker_main(args)
    try:
        parse_duration_s(args.duration)
        parse_duration_s(args.chaos_interval)
        parse_size_bytes(args.segment_size)
        if args.disk_size:
            parse_size_bytes(args.disk_size)
        min_size, max_size = parse_size_bytes(args.min_size), parse_size_bytes(args.max_size)
        page_size = parse_size_bytes(args.page_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.clients < 1 or args.nodes < 1 or args.keys < 1:
        parser.error("--clients, --nodes and --keys must be at least 1")
    if args.ha and (args.masters < 2 or args.lease_ttl_s < 1):
        parser.error("--ha needs --masters >= 2 (a standby to take over) and --lease-ttl-s >= 1")
    if not 1 <= args.replicas <= args.nodes:
        parser.error("--replicas must be between 1 and --nodes")
    if not HEADER.size + 200 <= min_size <= max_size:
        parser.error(f"need {HEADER.size + 200} <= --min-size <= --max-size")
    if not min_size <= page_size <= max_size or not 0 <= args.page_share <= 1:
        parser.error("need --min-size <= --page-size <= --max-size and 0 <= --page-share <= 1")
    if not 0 <= args.batch_share <= 1:
        parser.error("need 0 <= --batch-share <= 1")
    return run_soak(args)
