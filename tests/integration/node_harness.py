"""Start, stop and kill real `cellar node` processes for integration tests.

    node = start_node("127.0.0.1:50051", segment_size="64MiB", env={"CELLAR_CLUSTER_SECRET": s})
    node.tcp_address, node.segment_ids, node.segment_paths()
    node.terminate()   # SIGTERM, then SIGKILL after a timeout; returns the exit code
    kill_node(node)    # kill -9 (the segment files stay, as after a crash)
    node.close()       # terminate if alive, then remove the node's private shm_dir

Each node gets its own fresh directory under /dev/shm (unless `shm_dir` is given), so tests
never see each other's segment files and cleanup is one rmtree. Output (stdout and stderr) is
drained by background threads into `node.output()`, so a chatty node never blocks on a pipe.
`node_cluster(...)` starts several nodes and closes them all, even if a test fails.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cellar.storage_node.segment import segment_id_for, segment_path
from cellar.units import parse_size_bytes

READY_RE = re.compile(
    r"^cellar node (?P<node_id>\S+) serving tcp (?P<tcp>\S+) \(http (?P<http>\S+), "
    r"segments (?P<segments>\d+) x (?P<size>\S+)\) mounted on (?P<master>\S+)$"
)
DEFAULT_READY_TIMEOUT_S = 30.0
_REPO = Path(__file__).resolve().parents[2]


@dataclass
class NodeProcess:
    node_id: str
    proc: subprocess.Popen[str]
    shm_dir: Path
    segments: int
    segment_size_bytes: int
    owns_shm_dir: bool
    tcp_address: str = ""
    http_address: str | None = None
    ready_line: str = ""
    _lines: list[str] = field(default_factory=list)
    _stdout: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def segment_ids(self) -> list[int]:
        return [segment_id_for(self.node_id, i) for i in range(self.segments)]

    def segment_paths(self) -> list[Path]:
        return [segment_path(self.shm_dir, self.node_id, i) for i in range(self.segments)]

    def output(self) -> str:
        return "".join(self._lines)

    def wait_ready(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"node {self.node_id} not ready after {timeout_s}s:\n"
                                   f"{self.output()}")
            try:
                line = self._stdout.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(5)
                raise RuntimeError(f"node {self.node_id} exited ({self.proc.returncode}) "
                                   f"before it was ready:\n{self.output()}")
            match = READY_RE.match(line.strip())
            if match:
                self.ready_line = line.strip()
                self.tcp_address = match["tcp"]
                self.http_address = None if match["http"] == "off" else match["http"]
                return self.ready_line

    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait; SIGKILL if it does not stop in time. Returns the exit code."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self._join()
        return self.proc.returncode

    def kill(self) -> None:
        """kill -9: no unmount, no cleanup; the segment files stay behind."""
        if self.alive:
            self.proc.kill()
        self.proc.wait(10)
        self._join()

    def close(self) -> None:
        """Stop the process if needed and remove the private shm_dir."""
        self.terminate()
        if self.owns_shm_dir:
            shutil.rmtree(self.shm_dir, ignore_errors=True)

    def _join(self) -> None:
        for t in self._threads:
            t.join(5)


def kill_node(node: NodeProcess) -> None:
    """kill -9 a node process."""
    node.kill()


def _drain(stream: object, lines: list[str], out: queue.Queue[str | None] | None) -> None:
    assert hasattr(stream, "readline")
    for line in iter(stream.readline, ""):
        lines.append(line)
        if out is not None:
            out.put(line)
    if out is not None:
        out.put(None)


def start_node(
    master: str,
    *,
    segment_size: str | int = "64MiB",
    node_id: str | None = None,
    segments: int = 1,
    listen: str = "127.0.0.1:0",
    http: bool | str = False,
    shm_dir: str | Path | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
) -> NodeProcess:
    """Start `python -m cellar node ...`; by default wait for its ready line (i.e. mounted)."""
    node_id = node_id or f"test-{secrets.token_hex(4)}"
    owns = shm_dir is None
    if shm_dir is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        shm_dir = tempfile.mkdtemp(prefix="cellar-test-", dir=base)
    args = [
        sys.executable, "-m", "cellar", "node",
        "--master", master, "--listen", listen, "--segment-size", str(segment_size),
        "--segments", str(segments), "--node-id", node_id, "--shm-dir", str(shm_dir),
    ]
    if http:
        args += ["--http", "127.0.0.1:0" if http is True else str(http)]
    args += list(extra_args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=_REPO, start_new_session=True)
    node = NodeProcess(node_id, proc, Path(shm_dir), segments, parse_size_bytes(segment_size),
                       owns)
    for stream, out in ((proc.stdout, node._stdout), (proc.stderr, None)):
        t = threading.Thread(target=_drain, args=(stream, node._lines, out), daemon=True)
        t.start()
        node._threads.append(t)
    if wait:
        try:
            node.wait_ready(ready_timeout_s)
        except BaseException:
            node.close()
            raise
    return node


@contextlib.contextmanager
def node_cluster(master: str, count: int, **kwargs: object) -> Iterator[list[NodeProcess]]:
    """Start `count` nodes (same keyword arguments as start_node) and close them all after."""
    nodes: list[NodeProcess] = []
    try:
        for _ in range(count):
            nodes.append(start_node(master, **kwargs))  # type: ignore[arg-type]
        yield nodes
    finally:
        for node in nodes:
            node.close()
