"""A child process of a dev cluster (`LocalCluster`, `cellar up`) and how to ask a master how it is.

What it owns
    `Child`: one process, its command line, its log file and what its ready line said;
    `ClusterError` for a child that failed to start or died (the message carries its log's
    tail); `fetch_status`, a master's `/api/v1/status` over plain HTTP; and the process work
    of a cluster: `spawn` (`python -m cellar ...` with its output in a log file), `wait_ready`
    (until each child's log shows its ready line, `MASTER_READY` / `NODE_READY`, or it died),
    `keep_log` (a restarted child's old log kept aside) and `terminate` (SIGTERM, a grace
    period, then SIGKILL).

Invariants
    No Python code runs between fork and exec (no `preexec_fn`): a parent holding gRPC
    channels would run gRPC's at-fork handlers in the child, which can abort it; a child asks
    for PDEATHSIG itself (`cellar.lifecycle`, `PARENT_PID_ENV`). Every wait has a bound.

It imports only the standard library and the kernel's `cellar.lifecycle`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellar.http_fetch import fetch_json
from cellar.lifecycle import PARENT_PID_ENV, open_private_log

LOG_TAIL_LINES = 20
STATUS_PROBE_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.02
STOP_SETTLE_TIMEOUT_S = 5.0
STOP_POLL_INTERVAL_S = 0.001  # threads stop within microseconds once marked: poll finely
MASTER_READY = re.compile(
    r"^cellar master listening on (?P<address>\S+) \(http (?P<http>[^,\s]+), epoch (?P<epoch>\d+)\)")
NODE_READY = re.compile(r"^cellar node (?P<node_id>\S+) serving tcp (?P<address>\S+) ")


def tail_of(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file, or a word saying it has none."""
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
        return f"{self.name} (pid {self.pid}) {how}; last lines of {self.log_path}:\n{tail_of(self.log_path)}"


def send_signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send `sig` to `proc`; for SIGSTOP, return only once every thread of it has stopped.

    Why the wait: the kernel stops a many-threaded process in two steps. `kill()` wakes one
    thread; only when that thread next runs does it mark the others to stop, and until each
    of them reaches the kernel they run on. On a loaded machine that window can outlast a
    loopback round trip, so a request sent right after `kill()` could still be served by a
    data-plane thread of a process the caller believes frozen."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    if sig == signal.SIGSTOP:
        wait_stopped(proc.pid, STOP_SETTLE_TIMEOUT_S)


def wait_stopped(pid: int, timeout_s: float) -> None:
    """Wait until every thread of `pid` is stopped (state T in /proc); ClusterError when
    `timeout_s` passes first. A process that is gone counts as stopped."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = running_threads(pid)
        if not running:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"pid {pid}: threads {running} still run {timeout_s:g}s after SIGSTOP")
        time.sleep(STOP_POLL_INTERVAL_S)


def running_threads(pid: int) -> list[int]:
    """The threads of `pid` not stopped (/proc/<pid>/task/<tid>/stat state other than T/t)."""
    running = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # the thread ended
            if fields and fields[0] not in (b"T", b"t", b"Z", b"X"):
                running.append(int(tid))
    return running


def fetch_status(http: str, timeout_s: float = STATUS_PROBE_TIMEOUT_S,
                 ca_file: str | None = None) -> dict[str, Any] | None:
    """A master's `/api/v1/status` JSON (HTTP address HOST:PORT, or https://HOST:PORT verified
    against `ca_file`), or None if it did not answer."""
    try:
        body = fetch_json(http, "/api/v1/status", timeout_s=timeout_s, ca_file=ca_file)
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) else None


def spawn(name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> Child:
    """Start `python -m cellar <argv>` as child `name`, its output into `log_path`, in a
    session of its own, told who its parent is (it asks for PDEATHSIG itself)."""
    child = Child(name, [sys.executable, "-m", "cellar", *argv], log_path)
    env = {**env, PARENT_PID_ENV: str(os.getpid())}  # no preexec_fn: see the module docstring
    with open_private_log(log_path) as log:  # mode 0600: logs may name peers and keys
        child.proc = subprocess.Popen(
            child.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )
    return child


def keep_log(child: Child, restart: int) -> None:
    """Keep a child's log aside as `<name>.<restart>.log` before the child starts again."""
    if child.log_path.exists():
        child.log_path.rename(child.log_path.with_name(f"{child.name}.{restart}.log"))


def wait_ready(children: list[Child], timeout_s: float) -> None:
    """Return once every child printed its ready line; ClusterError with its log's tail when
    one dies first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = [c for c in children if not c.ready]
        if not waiting:
            return
        for child in waiting:
            read_ready_line(child)
            if not child.ready and not child.alive():
                raise ClusterError(f"{child.describe_exit()}")
        if time.monotonic() > deadline:
            child = next(c for c in children if not c.ready)
            raise ClusterError(
                f"{child.name} did not report ready within {timeout_s:g}s; last "
                f"lines of {child.log_path}:\n{tail_of(child.log_path)}")
        time.sleep(POLL_INTERVAL_S)


def read_ready_line(child: Child) -> None:
    """Fill in `child`'s address (and a master's http and epoch, a node's id) from its ready
    line, if its log has one yet."""
    try:
        text = child.log_path.read_text(errors="replace")
    except OSError:
        return
    is_master = child.name.startswith("master")
    pattern = MASTER_READY if is_master else NODE_READY
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            child.address = match.group("address")
            if is_master:
                child.http = match.group("http")
                child.extra["epoch"] = match.group("epoch")
            else:
                child.node_id = match.group("node_id")
            child.ready = True
            return


def terminate(children: list[Child], grace_s: float) -> None:
    """SIGTERM each child (and SIGCONT, so a stopped one sees it), then SIGKILL whatever is
    left after `grace_s`; every child is reaped."""
    for child in children:
        child.stopping = True
        if child.alive():
            assert child.proc is not None
            with contextlib.suppress(ProcessLookupError):
                child.proc.terminate()
                child.proc.send_signal(signal.SIGCONT)  # a SIGSTOPped child must see it
    deadline = time.monotonic() + grace_s
    for child in children:
        if child.proc is None:
            continue
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
