"""`make profile`: where the time goes in each data-plane workload, per process.

    python -m cellar.bench.profile [--workloads tcp-put-zc-64KiB-x128,...] [--seconds 6]
                                   [--out bench/results/profiles-<date>-<host>.txt]

For each workload: a fresh local cluster (master + 1 node, 2 GiB segment, pre-fault awaited),
and a client loop in its own process (put_many or get_many[_into] of one size and batch, as the
bench does). While the loop runs `--seconds`, this process reads every process's CPU time
(user and system, /proc/<pid>/stat) before and after, and py-spy (if installed; it is in the
`dev` extra) samples the master, the node and the client. The report gives, per workload:
ops/s and GB/s in that window, CPU microseconds per op for each process (user and system: the
system share is mostly the kernel copying payload bytes), and each process's hottest Python
frames (self and inclusive shares of its active samples). On the 2-core machines here the sum
of CPU per op across the processes, against 2 cores, is what bounds a rate.

Put loops remove their keys a group at a time (`put_group_rounds`: about PUT_GROUP_KEYS keys,
at most a quarter of the segment), so a long run never fills the segment and a remove (a gRPC
call, made durable in the removal log) adds a few percent to the CPU per put, not the half it
added to batches of 16 when every round removed the one before it. The removes are in the
master's and node's CPU and profiles, not in the ops count.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

KiB, MiB = 1 << 10, 1 << 20
DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "results"
SEGMENT_BYTES = 2 << 30
SAMPLE_RATE_HZ = 250
TOP_FRAMES = 12
PUT_GROUP_KEYS = 256     # put loops remove their keys about this many at a time
# What a native top frame means (measured 2026-12-05, single 64 KiB puts: py-spy gave the
# master's `Runner.run` 60% of its "active" samples as self time, while `py-spy --native`
# (blocking) showed the same samples in epoll_pwait, and /proc's per-thread CPU put the
# master's whole cost at 178 us a put).
NATIVE_TOP_NOTE = [
    "# A top frame of Runner.run (asyncio) or Thread.run is native code with no Python frame",
    "# above it: the event loop's own work and its waits in epoll, which py-spy counts as",
    "# active; the CPU per op lines (from /proc) are the figures to compare."]
# The figures issue 4 sets that a run may leave unmet, as workloads: transport-op-api-size-batch.
# Then the rows `make bench-peers` shows Cellar short of Mooncake or Valkey (issue 25): single
# 64 KiB and 1 MiB operations and 64 KiB batches of 16 (x1 runs the single-key calls).
DEFAULT_WORKLOADS = ("tcp-put-zc-64KiB-x128", "tcp-get-zc-64KiB-x128", "tcp-put-zc-1MiB-x16",
                     "tcp-get-zc-16MiB-x16", "shm-put-zc-1MiB-x16", "shm-get-bytes-4MiB-x128",
                     "tcp-put-zc-64KiB-x1", "tcp-get-zc-64KiB-x1", "tcp-put-zc-64KiB-x16",
                     "tcp-get-zc-64KiB-x16", "tcp-get-zc-1MiB-x1")


@dataclass(frozen=True)
class Workload:
    transport: str
    op: str
    api: str         # "zc" (registered buffers, get_many_into) or "bytes"
    size_bytes: int
    batch: int

    @classmethod
    def parse(cls, name: str) -> Workload:
        try:
            transport, op, api, size, batch = name.split("-")
            unit = 1 << 20 if size.endswith("MiB") else 1 << 10
            workload = cls(transport, op, api, int(size[:-3]) * unit, int(batch.lstrip("x")))
        except ValueError:
            raise SystemExit(f"bad workload {name!r}: want transport-op-api-size-xbatch, "
                             "e.g. tcp-put-zc-64KiB-x128") from None
        if op not in ("put", "get") or api not in ("zc", "bytes") or not size.endswith(
                ("KiB", "MiB")):
            raise SystemExit(f"bad workload {name!r}: op put|get, api zc|bytes, size in KiB|MiB")
        return workload


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


# ---- the client loop (its own process) --------------------------------------------------------

def put_group_rounds(w: Workload) -> int:
    """Put rounds between two removes: PUT_GROUP_KEYS keys' worth, at most a quarter of the
    segment (a group and the one before it stay stored), at least one round."""
    by_keys = PUT_GROUP_KEYS // w.batch
    by_bytes = SEGMENT_BYTES // 4 // (w.batch * w.size_bytes)
    return max(1, min(by_keys, by_bytes))


def loop(address: str, workload: Workload, seconds: float) -> None:
    """Warm up, say READY, wait for GO on stdin, run `seconds`, print ops, wall and CPU."""
    import cellar

    w = workload
    client = cellar.connect(address, transport=w.transport, timeout_s=60.0)
    buffers = [cellar.alloc_buffer(w.size_bytes) for _ in range(w.batch)]
    fill = os.urandom(min(w.size_bytes, MiB))
    for buf in buffers:
        for at in range(0, w.size_bytes, len(fill)):
            n = min(len(fill), w.size_bytes - at)
            buf[at:at + n] = fill[:n]
    values = buffers if w.api == "zc" else [bytes(b) for b in buffers]

    single = w.batch == 1  # the single-key calls (put, get_into / get), as engines make them

    rounds_per_group = put_group_rounds(w)

    def put_round(r: int) -> None:
        group = r // rounds_per_group
        if single:
            client.put(f"p/{group}/{r}/0", values[0])
        else:
            client.put_many([(f"p/{group}/{r}/{i}", v) for i, v in enumerate(values)])
        if group and r % rounds_per_group == 0:
            client.remove_prefix(f"p/{group - 1}/")

    read_keys = [f"p/0/0/{i}" for i in range(w.batch)]

    def get_round(_: int) -> None:
        if single:
            if w.api == "zc":
                client.get_into(read_keys[0], buffers[0])
            else:
                client.get(read_keys[0])
        elif w.api == "zc":
            client.get_many_into(read_keys, buffers)
        else:
            client.get_many(read_keys)

    one_round = put_round if w.op == "put" else get_round
    put_round(0)
    for r in range(1, 3):
        one_round(r)
    print("READY", flush=True)
    sys.stdin.readline()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    rounds = 0
    while time.perf_counter() - start < seconds:
        one_round(rounds + 3)
        rounds += 1
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(f"DONE {rounds * w.batch} {wall_s:.6f} {after.ru_utime - before.ru_utime:.6f} "
          f"{after.ru_stime - before.ru_stime:.6f}", flush=True)
    client.close()


# ---- py-spy output ----------------------------------------------------------------------------

def summarize(raw_path: Path, top: int = TOP_FRAMES) -> list[str]:
    """Self and inclusive shares of the hottest frames in a py-spy `--format raw` file."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return ["    (no active samples)"]
    out = [f"    {total} active samples; self:"]
    out += [f"      {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    out.append("    inclusive:")
    out += [f"      {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return out


# ---- the orchestrator -------------------------------------------------------------------------

def profile_one(name: str, seconds: float, py_spy: str | None, work_dir: Path) -> list[str]:
    from cellar.devtools.local_cluster import LocalCluster

    workload = Workload.parse(name)
    lines = [f"## {name}"]
    with LocalCluster(nodes=1, segment_size=SEGMENT_BYTES, port=0, http_port=0) as cluster:
        if not cluster.wait_prefaulted():
            lines.append("# WARNING: the node's pre-fault did not end; page faults included")
        assert cluster.master is not None
        proc = subprocess.Popen(
            [sys.executable, "-m", "cellar.bench.profile", "--loop", name, "--address",
             cluster.address, "--seconds", str(seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline().strip() != "READY":
            proc.kill()
            return [*lines, "# the client loop failed to start", ""]
        pids = {"master": cluster.master.pid, "node": cluster.nodes[0].pid}
        spies = []
        if py_spy:
            for role, pid in (*pids.items(), ("client", proc.pid)):
                raw = work_dir / f"{role}.txt"
                spies.append((role, raw, subprocess.Popen(
                    [py_spy, "record", "--nonblocking", "-r", str(SAMPLE_RATE_HZ), "-d",
                     str(max(1, int(seconds) - 1)), "-p", str(pid), "-f", "raw", "-o", str(raw)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        before = {role: cpu_seconds(pid) for role, pid in pids.items()}
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        done = proc.stdout.readline().split()
        after = {role: cpu_seconds(pid) for role, pid in pids.items()}
        proc.wait(30)
        for _, _, spy in spies:
            spy.wait(30)
    if len(done) != 5 or done[0] != "DONE":
        return [*lines, f"# the client loop did not finish: {done}", ""]
    ops, wall = int(done[1]), float(done[2])
    cpu = {role: (after[role][0] - before[role][0], after[role][1] - before[role][1])
           for role in pids}
    cpu["client"] = (float(done[3]), float(done[4]))
    lines.append(f"# {ops / wall:,.0f} ops/s, {ops * workload.size_bytes / wall / 1e9:.2f} GB/s "
                 f"over {wall:.1f} s")
    total_us = 0.0
    for role, (user, system) in cpu.items():
        user_us, system_us = user / ops * 1e6, system / ops * 1e6
        total_us += user_us + system_us
        lines.append(f"# CPU per op, {role:6}: user {user_us:7.1f} us  system {system_us:7.1f} us")
    lines.append(f"# CPU per op, all: {total_us:.1f} us (2 cores: at most "
                 f"{2e6 / total_us:,.0f} ops/s if every process overlapped perfectly)")
    for role, raw, _ in spies:
        lines.append(f"### {role}")
        lines += summarize(raw) if raw.exists() else ["    (py-spy wrote nothing)"]
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.profile",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help="comma list of transport-op-api-size-xbatch")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured window per workload")
    parser.add_argument("--out", type=Path, help="report file (default: bench/results/"
                        "profiles-<date>-<host>.txt)")
    parser.add_argument("--loop", help=argparse.SUPPRESS)     # internal: run one client loop
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop:
        loop(args.address, Workload.parse(args.loop), args.seconds)
        return 0
    names = [n for n in args.workloads.split(",") if n]
    for name in names:
        Workload.parse(name)  # every name is checked before the first cluster starts
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    now = dt.datetime.now()
    out = args.out or DEFAULT_OUT_DIR / f"profiles-{now:%Y-%m-%d}-{socket.gethostname()}.txt"
    report = [f"# Cellar data-plane profiles, {now:%Y-%m-%d %H:%M} on {socket.gethostname()} "
              f"({os.cpu_count()} cores); reproduce: make profile",
              "# py-spy " + ("record --nonblocking at " f"{SAMPLE_RATE_HZ} Hz, active samples only"
                             if py_spy else "not installed: CPU split only")]
    if py_spy:
        report += NATIVE_TOP_NOTE
    report.append("")
    for i, name in enumerate(names, 1):
        print(f"[profile {time.strftime('%H:%M:%S')}] {i}/{len(names)} {name}", file=sys.stderr,
              flush=True)
        with tempfile.TemporaryDirectory(prefix="cellar-profile-") as tmp:
            section = profile_one(name, args.seconds, py_spy, Path(tmp))
        print("\n".join(section[:8]), file=sys.stderr, flush=True)
        report += section
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report) + "\n")
    print(f"[profile] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
