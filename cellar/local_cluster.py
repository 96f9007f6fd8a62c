"""The local cluster: one master and N storage nodes on 127.0.0.1, as child processes.

What it owns
    `LocalCluster` starts `python -m cellar master` and `python -m cellar node` children with a
    freshly generated cluster secret (env `CELLAR_CLUSTER_SECRET`), a private directory for the
    segment files (under /dev/shm when it exists, so the segments are RAM) and one log file per
    child under a run directory. `start()` returns once every child has printed its ready line,
    or raises with the last lines of the failing child's log. `stop()` sends SIGTERM, waits a
    grace period, then SIGKILLs what is left, and removes the segment files. `cellar up`
    (`main`), the integration and fault tests and `cellar soak` use this same class, so what a
    user starts by hand is what the tests exercise.

    Faults, for the fault tests and the soak: `kill_node`, `restart_node` (kill -9, then the
    same `--node-id` and shm dir, so the node re-attaches its segment), `restart_master` (kill
    -9, then a new master on the same ports, which rebuilds from the nodes), `signal_node` and
    `signal_master` (SIGSTOP/SIGCONT). After `start()` the master's ports are pinned, so a
    restarted master is found at the same address.

Invariants
    - A child never outlives the cluster: `stop()` reaps every child it started, and on Linux
      each child gets SIGTERM from the kernel if the thread that started it dies (PDEATHSIG,
      which the child asks for itself, see `cellar.lifecycle`), so even a SIGKILLed parent
      leaves nothing behind. Start children from a thread that lives as long as the cluster.
    - No Python code runs between fork and exec (no `preexec_fn`): a parent holding gRPC
      channels would run gRPC's at-fork handlers in the child, which can abort it.
    - Ports may be 0: the real addresses are read back from the ready lines.

What it must never do
    Import the master, node or client code (children are separate processes); wait without a
    timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from cellar.lifecycle import PARENT_PID_ENV
from cellar.units import format_size, parse_size_bytes

MASTER_READY = re.compile(
    r"^cellar master listening on (?P<address>\S+) \(http (?P<http>[^,\s]+), epoch (?P<epoch>\d+)\)")
NODE_READY = re.compile(r"^cellar node (?P<node_id>\S+) serving tcp (?P<address>\S+) ")

DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_STOP_GRACE_S = 5.0
LOG_TAIL_LINES = 20
POLL_INTERVAL_S = 0.02
RESTART_PORT_WAIT_S = 20.0     # how long a restarted master may wait for its old port
RESTART_RETRY_INTERVAL_S = 0.3


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class ClusterError(RuntimeError):
    """A child failed to start or died; the message carries the tail of its log."""


@dataclass
class Child:
    """One child process and what its ready line told us."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""            # gRPC (master) or data-plane tcp (node) address
    http: str = ""               # master only
    node_id: str = ""            # node only
    ready: bool = False
    stopping: bool = False       # stop() or kill_node() asked for its exit
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe_exit(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        return f"{self.name} (pid {self.pid}) {how}; last lines of {self.log_path}:\n{_tail(self.log_path)}"


class LocalCluster:
    """A master and `nodes` storage nodes on `host`; a context manager."""

    def __init__(self, nodes: int = 2, segment_size: str | int = "1GiB", *,
                 host: str = "127.0.0.1", port: int = 0, http_port: int = 0,
                 run_dir: str | Path | None = None, shm_dir: str | Path | None = None,
                 master_flags: Mapping[str, Any] | None = None,
                 node_flags: Mapping[str, Any] | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 stop_grace_s: float = DEFAULT_STOP_GRACE_S,
                 env: Mapping[str, str] | None = None) -> None:
        if nodes < 0:
            raise ValueError(f"nodes must be >= 0, got {nodes}")
        self.segment_size_bytes = parse_size_bytes(segment_size)
        self.host = host
        self.port = port
        self.http_port = http_port
        self.master_flags = dict(master_flags or {})
        self.node_flags = dict(node_flags or {})
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.secret = secrets.token_hex(32)
        self._own_run_dir = run_dir is None
        self.keep_run_dir = False  # set to keep the logs of a run directory this object made
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="cellar-run-"))
        self._own_shm_dir = shm_dir is None
        if shm_dir is not None:
            self.shm_dir = Path(shm_dir)
        elif os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            self.shm_dir = Path(tempfile.mkdtemp(prefix="cellar-segments-", dir="/dev/shm"))
        else:
            self.shm_dir = Path(tempfile.mkdtemp(prefix="cellar-segments-", dir=self.run_dir))
        self._env = dict(os.environ if env is None else env)
        self._env.update({"CELLAR_CLUSTER_SECRET": self.secret, "PYTHONUNBUFFERED": "1"})
        self.master: Child | None = None
        self.nodes: list[Child] = []
        self._node_count = nodes
        self._next_node = 0
        self._restarts = 0
        self._started = False
        self._stopped = False

    # ---- public surface --------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The master's gRPC address, HOST:PORT (what `cellar.connect` takes)."""
        if self.master is None or not self.master.address:
            raise ClusterError("the cluster is not started")
        return self.master.address

    @property
    def http_url(self) -> str:
        """The master's status/metrics base URL."""
        if self.master is None or not self.master.http:
            raise ClusterError("the cluster is not started")
        return f"http://{self.master.http}"

    def __enter__(self) -> LocalCluster:
        if not self._started:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        """Start the master, then every node; return when all printed their ready lines."""
        if self._started:
            raise ClusterError("already started")
        self._started = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.master = self._spawn("master", self._master_argv())
            self._wait_ready([self.master])
            for _ in range(self._node_count):
                self.nodes.append(self._spawn_node())
            self._wait_ready(self.nodes)
        except BaseException:
            self.stop()
            raise
        # pin the bound ports: a restarted master must be found at the same address
        self.port = int(self.master.address.rsplit(":", 1)[1])
        self.http_port = int(self.master.http.rsplit(":", 1)[1])
        return self

    def add_node(self, **node_flags: Any) -> Child:
        """Start one more node and wait for it; returns its `Child`."""
        child = self._spawn_node(node_flags)
        self.nodes.append(child)
        self._wait_ready([child])
        return child

    def kill_node(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill node `index` with `sig` (default SIGKILL, like `kill -9`) and reap it."""
        child = self.nodes[index]
        child.stopping = True
        if child.alive():
            assert child.proc is not None
            child.proc.send_signal(sig)
            try:
                child.proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()

    def restart_node(self, index: int, before_start: Callable[[], None] | None = None, *,
                     sig: int = signal.SIGKILL) -> Child:
        """Stop node `index` with `sig` (kill -9 by default), run `before_start`, start it again
        with the same argv (same --node-id and shm dir, so it re-attaches its segment file) and
        wait until it is ready. The old log is kept as `<name>.<n>.log`."""
        old = self.nodes[index]
        self.kill_node(index, sig)
        if before_start is not None:
            before_start()
        self._keep_log(old)
        child = self._spawn(old.name, old.argv[3:])  # [python, -m, cellar, node, ...]
        self.nodes[index] = child
        self._wait_ready([child])
        return child

    def signal_node(self, index: int, sig: int) -> None:
        """Send `sig` (e.g. SIGSTOP, SIGCONT) to node `index` if it is running."""
        child = self.nodes[index]
        if child.alive():
            assert child.proc is not None
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(sig)

    def kill_master(self) -> None:
        """kill -9 the master and reap it."""
        assert self.master is not None and self.master.proc is not None
        self.master.stopping = True
        if self.master.alive():
            self.master.proc.kill()
        self.master.proc.wait(self.stop_grace_s)

    def restart_master(self) -> Child:
        """kill -9 the master and start a new one on the same ports (it rebuilds its table
        from the nodes' reports); return when it is ready. The old log is kept."""
        assert self.master is not None
        self.kill_master()
        self._keep_log(self.master)
        deadline = time.monotonic() + RESTART_PORT_WAIT_S
        while True:  # the port may linger for a moment after the kill
            self.master = self._spawn("master", self._master_argv())
            try:
                self._wait_ready([self.master])
                return self.master
            except ClusterError:
                if time.monotonic() > deadline:
                    raise
                self.master.stopping = True
                if self.master.alive():
                    assert self.master.proc is not None
                    self.master.proc.kill()
                    self.master.proc.wait(self.stop_grace_s)
                time.sleep(RESTART_RETRY_INTERVAL_S)

    def signal_master(self, sig: int) -> None:
        """Send `sig` (e.g. SIGSTOP, SIGCONT) to the master if it is running."""
        assert self.master is not None
        if self.master.alive():
            assert self.master.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.master.proc.send_signal(sig)

    def dead_children(self) -> list[Child]:
        """Children that exited although nobody asked them to."""
        children = ([self.master] if self.master is not None else []) + self.nodes
        return [c for c in children if c.proc is not None and not c.stopping and not c.alive()]

    def stop(self) -> None:
        """SIGTERM every child (nodes first, then the master), SIGKILL after the grace period,
        then remove the segment files (and the run directory if this object created it)."""
        if self._stopped:
            return
        self._stopped = True
        self._terminate(self.nodes)
        if self.master is not None:
            self._terminate([self.master])
        if self._own_shm_dir:
            shutil.rmtree(self.shm_dir, ignore_errors=True)
        if self._own_run_dir and not self.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        children = ([self.master] if self.master is not None else []) + self.nodes
        return [c.pid for c in children if c.proc is not None]

    # ---- internals -------------------------------------------------------------------------

    def _master_argv(self) -> list[str]:
        argv = ["master", "--listen", f"{self.host}:{self.port}",
                "--http", f"{self.host}:{self.http_port}"]
        for name, value in self.master_flags.items():
            argv += [_flag(name), str(value)]
        return argv

    def _spawn_node(self, extra_flags: Mapping[str, Any] | None = None) -> Child:
        assert self.master is not None
        i = self._next_node
        self._next_node += 1
        argv = ["node", "--master", self.master.address, "--listen", f"{self.host}:0",
                "--segment-size", str(self.segment_size_bytes), "--node-id", f"node-{i}",
                "--shm-dir", str(self.shm_dir)]
        for name, value in {**self.node_flags, **(extra_flags or {})}.items():
            argv += [_flag(name), str(value)]
        return self._spawn(f"node-{i}", argv)

    def _spawn(self, name: str, argv: list[str]) -> Child:
        log_path = self.run_dir / f"{name}.log"
        child = Child(name, [sys.executable, "-m", "cellar", *argv], log_path)
        # No preexec_fn (see the module docstring): the child asks for PDEATHSIG itself.
        env = {**self._env, PARENT_PID_ENV: str(os.getpid())}
        with open(log_path, "wb") as log:
            child.proc = subprocess.Popen(
                child.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
        return child

    def _keep_log(self, child: Child) -> None:
        self._restarts += 1
        if child.log_path.exists():
            child.log_path.rename(child.log_path.with_name(f"{child.name}.{self._restarts}.log"))

    def _wait_ready(self, children: list[Child]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            waiting = [c for c in children if not c.ready]
            if not waiting:
                return
            for child in waiting:
                self._read_ready_line(child)
                if not child.ready and not child.alive():
                    raise ClusterError(f"{child.describe_exit()}")
            if time.monotonic() > deadline:
                child = next(c for c in children if not c.ready)
                raise ClusterError(
                    f"{child.name} did not report ready within {self.start_timeout_s:g}s; last "
                    f"lines of {child.log_path}:\n{_tail(child.log_path)}")
            time.sleep(POLL_INTERVAL_S)

    def _read_ready_line(self, child: Child) -> None:
        try:
            text = child.log_path.read_text(errors="replace")
        except OSError:
            return
        pattern = MASTER_READY if child.name == "master" else NODE_READY
        for line in text.splitlines():
            match = pattern.match(line)
            if match:
                child.address = match.group("address")
                if child.name == "master":
                    child.http = match.group("http")
                    child.extra["epoch"] = match.group("epoch")
                else:
                    child.node_id = match.group("node_id")
                child.ready = True
                return

    def _terminate(self, children: list[Child]) -> None:
        for child in children:
            child.stopping = True
            if child.alive():
                assert child.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    child.proc.terminate()
                    child.proc.send_signal(signal.SIGCONT)  # a SIGSTOPped child must see it
        deadline = time.monotonic() + self.stop_grace_s
        for child in children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


# ---- cellar up ----------------------------------------------------------------------------

def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cellar up",
        description="Start a local Cellar cluster (a master and N storage nodes on 127.0.0.1) "
                    "and keep it running until Ctrl-C or SIGTERM.")
    parser.add_argument("--nodes", type=int, default=2, help="storage nodes (default 2)")
    parser.add_argument("--segment-size", default="1GiB", help="DRAM per node (default 1GiB)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50051, help="master gRPC port; 0 = any free port (default 50051)")
    parser.add_argument("--http-port", type=int, default=9400, help="master status/metrics port; 0 = any (default 9400)")
    parser.add_argument("--run-dir", default=".cellar/up", help="where the logs go (default .cellar/up)")
    parser.add_argument("--start-timeout", type=float, default=DEFAULT_START_TIMEOUT_S,
                        help=f"seconds to wait for every process to be ready (default {DEFAULT_START_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    try:
        segment_bytes = parse_size_bytes(args.segment_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    for name in ("port", "http_port"):
        if not 0 <= getattr(args, name) <= 65535:
            parser.error(f"--{name.replace('_', '-')} must be 0..65535")

    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    cluster = LocalCluster(args.nodes, segment_bytes, host=args.host, port=args.port,
                           http_port=args.http_port, run_dir=Path(args.run_dir).resolve(),
                           start_timeout_s=args.start_timeout)
    code = 0
    try:
        print(f"starting a master and {args.nodes} node(s) of {format_size(segment_bytes)} "
              f"(logs in {cluster.run_dir})...", flush=True)
        cluster.start()
        address = cluster.address
        print(f"Cellar is up: master {address}, {args.nodes} node(s) x {format_size(segment_bytes)}\n"
              f"  status:  {cluster.http_url}/  (JSON {cluster.http_url}/api/v1/status, "
              f"metrics {cluster.http_url}/metrics)\n"
              f"           cellar status --master {address}\n"
              f"  try:     python -c \"import cellar; c = cellar.connect('{address}'); "
              f"c.put('k', b'v'); print(c.get('k'))\"\n"
              f"  logs:    {cluster.run_dir}\n"
              f"Ctrl-C stops the cluster.", flush=True)
        reported: set[str] = set()
        while True:
            time.sleep(0.5)
            for child in cluster.dead_children():
                if child.name not in reported:
                    reported.add(child.name)
                    print(f"cellar up: {child.describe_exit()}", file=sys.stderr, flush=True)
                    if child.name == "master":
                        print("cellar up: the master is gone; stopping the cluster",
                              file=sys.stderr, flush=True)
                        code = 1
            if code:
                break
    except KeyboardInterrupt:
        pass
    except ClusterError as exc:
        print(f"cellar up: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
    if code == 0:
        print("cellar up: stopped", flush=True)
    return code
