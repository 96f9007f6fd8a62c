"""A child process of a dev cluster (`LocalCluster`, `cellar up`) and how to ask a master how it is.

What it owns
    `Child`: one process, its command line, its log file and what its ready line said;
    `ClusterError` for a child that failed to start or died (the message carries its log's
    tail); `fetch_status`, a master's `/api/v1/status` over plain HTTP.
Import rule: any (package root; it imports only the standard library)
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 20
STATUS_PROBE_TIMEOUT_S = 1.0


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


def fetch_status(http: str, timeout_s: float = STATUS_PROBE_TIMEOUT_S) -> dict[str, Any] | None:
    """A master's `/api/v1/status` JSON (HTTP address HOST:PORT), or None if it did not answer."""
    try:
        with urllib.request.urlopen(f"http://{http}/api/v1/status", timeout=timeout_s) as reply:
            body = json.loads(reply.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) else None


