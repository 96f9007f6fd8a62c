"""The storage node a Mooncake-style client embeds when `global_segment_size > 0`.

What it owns
    `EmbeddedNode`: a real `cellar node` child process (`python -m cellar node`, the public
    entry point) that contributes `segment_bytes` of this host's DRAM to the cluster the store
    is connected to, as a Mooncake client mounts its global segment. The node gets an id of
    its own (`--node-id`), and `start()` returns once the master lists that node, asked
    through the store's SDK client (so the node is mounted and placeable); `stop()` sends SIGTERM
    (the node unmounts, so the master drops the objects it held), waits, then SIGKILLs, and
    removes the node's segment files and log.

Why a child process and not an in-process node
    The room's import rule: compat depends only on the SDK. A child keeps the node's event
    loop, memory and signal handling out of the caller's process (an engine), and is exactly
    what `cellar node` runs standalone.

Lifetime (reference section 4.3)
    The memory lives only as long as the store: `close()`, or the exit of this process, ends
    the node and every object it held. A standalone `cellar node` keeps its memory across
    client restarts. The child asks the kernel for SIGTERM when its parent thread dies
    (`cellar.lifecycle`), so it is started from a keeper thread that lives until `stop()`.

What it must never do
    Import `cellar.storage_node` (nor any Cellar code but the SDK); wait without a timeout.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cellar.compat.mooncake.codes import ErrorCode
from cellar.compat.mooncake.setup_args import SetupError
from cellar.errors import CellarError

NODE_START_TIMEOUT_S = 60.0
NODE_STOP_GRACE_S = 10.0
POLL_INTERVAL_S = 0.1
CONFIG_ERROR_EXIT = 2   # `cellar node` exits 2 on a configuration it refuses
# `cellar node`'s documented environment: the parent whose death ends the node (PDEATHSIG).
PARENT_PID_ENV = "CELLAR_PARENT_PID"
NODE_ID_PREFIX = "mooncake"
# Where `cellar node` takes the cluster secret from (its --help: "'' = CELLAR_CLUSTER_SECRET or
# ~/.cellar/cluster-secret"). Without either it would invent a secret of its own, mount, and
# then refuse every grant the master signs: a node that looks up and fails every write.
SECRET_ENV = "CELLAR_CLUSTER_SECRET"
SECRET_FILE = "~/.cellar/cluster-secret"


# Mooncake's transfer engine picks its port here when local_hostname names none.
SEGMENT_PORT_RANGE = (12300, 14300)
PORT_TRIES = 64


def free_port(host: str, low: int = SEGMENT_PORT_RANGE[0], high: int = SEGMENT_PORT_RANGE[1]) -> int:
    """A port in [low, high] nothing listens on at `host` now (random start, bounded tries);
    `low` if none is found (the node's start then reports the clash)."""
    start = secrets.randbelow(high - low + 1)
    for i in range(min(PORT_TRIES, high - low + 1)):
        port = low + (start + i) % (high - low + 1)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    return low


class EmbeddedNode:
    """One `cellar node` child serving `segment_bytes` for the cluster at `master`."""

    def __init__(self, master: str, segment_bytes: int, host: str, port: int = 0, *,
                 disk_dir: str = "", disk_bytes: int = 0) -> None:
        # Segments are whole pages; Mooncake takes any size, so round down rather than refuse.
        self.segment_bytes = segment_bytes - segment_bytes % mmap.PAGESIZE
        self.master = master
        self.host = host
        self.port = port  # the data-plane port (0: any), get_hostname()'s port
        self.disk_dir, self.disk_bytes = disk_dir, disk_bytes  # enable_ssd_offload's disk tier
        hostname = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0])[:48]
        self.node_id = f"{NODE_ID_PREFIX}-{hostname}-{os.getpid()}-{secrets.token_hex(3)}"
        self._dir = Path(tempfile.mkdtemp(prefix="cellar-mooncake-node-",
                                          dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None))
        self._log_path = self._dir / "node.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._release = threading.Event()
        self._keeper: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else -1

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, node_ids: Callable[[], list[str]]) -> None:
        """Start the child and wait until `node_ids()` (the master's node list) names it;
        SetupError with the code otherwise."""
        if not os.environ.get(SECRET_ENV) and not Path(SECRET_FILE).expanduser().is_file():
            self.stop()
            raise SetupError(ErrorCode.INVALID_PARAMS,
                             f"the embedded node needs the cluster secret: set {SECRET_ENV} "
                             f"or write {SECRET_FILE} (cellar up does)")
        started = threading.Event()
        failure: list[BaseException] = []
        self._keeper = threading.Thread(target=self._keep, args=(started, failure),
                                        name="cellar-mooncake-node", daemon=True)
        self._keeper.start()
        started.wait(NODE_START_TIMEOUT_S)
        if failure or self._proc is None:
            self.stop()
            raise SetupError(ErrorCode.INTERNAL_ERROR, f"cannot start cellar node: {failure}")
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while not self._mounted(node_ids):
            code = self._proc.poll()
            if code is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                refused = code == CONFIG_ERROR_EXIT
                raise SetupError(
                    ErrorCode.INVALID_PARAMS if refused else ErrorCode.INTERNAL_ERROR,
                    f"embedded cellar node {'refused its configuration' if refused else 'did not start'}"
                    f" (exit {code}): {tail}")
            time.sleep(POLL_INTERVAL_S)

    def _keep(self, started: threading.Event, failure: list[BaseException]) -> None:
        """Start the child and live until stop(): the child's PDEATHSIG follows this thread."""
        argv = [sys.executable, "-m", "cellar", "node", "--master", self.master,
                "--listen", f"[{self.host}]:{self.port}" if ":" in self.host
                else f"{self.host}:{self.port}", "--segment-size", str(self.segment_bytes),
                "--shm-dir", str(self._dir), "--node-id", self.node_id]
        if self.disk_dir:
            argv += ["--disk-dir", self.disk_dir, "--disk-size", str(self.disk_bytes)]
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        try:
            # mode 0600 (a fresh file in a fresh 0700 directory): logs name peers and node ids
            with os.fdopen(os.open(self._log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                           "wb") as log_file:
                self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                              stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True)
        except OSError as exc:
            failure.append(exc)
        finally:
            started.set()
        self._release.wait()

    def _mounted(self, node_ids: Callable[[], list[str]]) -> bool:
        try:
            return self.node_id in node_ids()
        except CellarError:
            return False  # the master is busy or restarting: ask again until the deadline

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> int:
        """SIGTERM, wait, SIGKILL if needed; remove the segment files. 0, or the exit code."""
        code = 0
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(NODE_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None:
            code = proc.returncode or 0
        self._release.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(NODE_STOP_GRACE_S)
        shutil.rmtree(self._dir, ignore_errors=True)
        return code
