"""Start a real `cellar master` process for tests and tear it down.

    from master_harness import running_master   # a test in tests/integration/
    # (or: from tests.integration.master_harness import running_master, run from the repo root)

    with running_master("--node-expire-after-s", "2") as master:
        channel = grpc.insecure_channel(master.grpc_address)
        ...

`start_master(*flags, env=None)` returns a `MasterProcess` (call `.stop()`); `running_master`
is the same as a context manager. The master listens on 127.0.0.1 with port 0 for gRPC and HTTP;
the harness waits for its ready line, parses the bound ports and epoch, and gives it a fresh
cluster secret through `CELLAR_CLUSTER_SECRET` (never the user's ~/.cellar). `stop()` sends
SIGTERM, waits, then kills; it returns the exit code.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

READY = re.compile(
    r"^cellar master listening on (?P<grpc>\S+):(?P<gport>\d+) "
    r"\(http (?P<http>\S+):(?P<hport>\d+), epoch (?P<epoch>\d+)\)$"
)
START_TIMEOUT_S = 20.0


@dataclass
class MasterProcess:
    proc: subprocess.Popen[str]
    grpc_address: str
    http_address: str
    epoch: int
    secret: bytes
    output: list[str] = field(default_factory=list)  # stdout lines after the ready line
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"http://{self.http_address}"

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        return self.proc.returncode

    def stderr(self) -> str:
        return "".join(self.stderr_lines)


def _drain(stream: object, sink: list[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink.append(line)


def start_master(
    *flags: str,
    env: Mapping[str, str] | None = None,
    secret: bytes | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> MasterProcess:
    """Start `python -m cellar master` on 127.0.0.1:0 (gRPC and HTTP) with extra `flags`."""
    secret = secret if secret is not None else secrets.token_bytes(32)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("CELLAR_MASTER_")}
    child_env["CELLAR_CLUSTER_SECRET"] = secret.hex()
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env.update(env or {})
    argv = [sys.executable, "-m", "cellar", "master", "--listen", "127.0.0.1:0",
            "--http", "127.0.0.1:0", *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)
    stderr_lines: list[str] = []
    threading.Thread(target=_drain, args=(proc.stderr, stderr_lines), daemon=True).start()
    lines: list[str] = []
    found: list[re.Match[str]] = []
    got_line = threading.Event()

    def read_stdout() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not found:
                match = READY.match(line.strip())
                if match:
                    found.append(match)
                    got_line.set()
                    continue
            lines.append(line)
        got_line.set()

    threading.Thread(target=read_stdout, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not found and proc.poll() is None and time.monotonic() < deadline:
        got_line.wait(0.05)
    if not found:
        with contextlib.suppress(Exception):
            proc.kill()
            proc.wait(5)
        time.sleep(0.1)
        raise RuntimeError(
            f"master did not become ready (exit {proc.returncode}):\n"
            f"stdout: {''.join(lines)}\nstderr: {''.join(stderr_lines)}"
        )
    match = found[0]
    return MasterProcess(
        proc=proc,
        grpc_address=f"{match['grpc']}:{match['gport']}",
        http_address=f"{match['http']}:{match['hport']}",
        epoch=int(match["epoch"]),
        secret=secret,
        output=lines,
        stderr_lines=stderr_lines,
    )


@contextlib.contextmanager
def running_master(
    *flags: str, env: Mapping[str, str] | None = None, secret: bytes | None = None
) -> Iterator[MasterProcess]:
    master = start_master(*flags, env=env, secret=secret)
    try:
        yield master
    finally:
        master.stop()
