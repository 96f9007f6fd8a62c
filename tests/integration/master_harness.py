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

Credentials: every master the harness starts shares one token store of the test session
(`--tokens-file`, unless the test passes its own) holding `TEST_ADMIN_TOKEN` (an admin may act
as any tenant, so `admin_header(tenant)` serves raw-stub tests); `master.token_for(tenant)`
adds a tenant token, `master.node_header(node_id)` carries that node's credential.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import node_credential
from cellar.tokens import KIND_ADMIN, KIND_TENANT, TokenStore, new_token

# The session's admin token (also accepted by tests/faults' clusters: same variable).
TEST_ADMIN_TOKEN = os.environ.setdefault("CELLAR_TEST_ADMIN_TOKEN", new_token()[1])
_STORE: TokenStore | None = None


def session_store() -> TokenStore:
    """The token store every harness master of this test process reads."""
    global _STORE
    if _STORE is None:
        folder = tempfile.mkdtemp(prefix="cellar-test-tokens-")
        # the file holds the session's admin token: gone with the test process
        atexit.register(shutil.rmtree, folder, True)
        path = Path(folder) / "tokens.json"
        _STORE = TokenStore(path)
        _STORE.add(KIND_ADMIN, TEST_ADMIN_TOKEN, shm=True, label="test session admin")
    return _STORE


def admin_header(tenant: str = "", client_id: str = "test-client") -> pb.RequestHeader:
    return pb.RequestHeader(tenant=tenant, client_id=client_id, token=TEST_ADMIN_TOKEN)


_NODE_RPCS = ("MountSegment", "UnmountSegment", "Heartbeat", "ReportObjects")


class AuthedStub:
    """A MasterStub that fills in a missing header token: the node's credential on node RPCs
    (from the request's node_id and `secret`), the session admin token on the others. Tests of
    other behaviour keep their requests as they were; tests of authentication use a bare stub."""

    def __init__(self, channel: Any, secret: bytes) -> None:
        from cellar.proto import cellar_pb2_grpc as pb_grpc

        self._stub = pb_grpc.MasterStub(channel)
        self._secret = secret

    def __getattr__(self, name: str) -> Any:
        rpc = getattr(self._stub, name)
        secret = self._secret

        def call(request: Any, *args: Any, **kwargs: Any) -> Any:
            if not request.header.token:
                request.header.token = (node_credential(secret, request.node_id)
                                        if name in _NODE_RPCS else TEST_ADMIN_TOKEN)
            return rpc(request, *args, **kwargs)

        return call


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

    def token_for(self, tenant: str, *, shm: bool = False) -> str:
        """A new token of `tenant` (the master reads the store again on an unknown token)."""
        store = session_store()
        store.refresh()
        return store.create(KIND_TENANT, tenant, shm=shm, label="test")[1]

    def stub(self, channel: Any) -> AuthedStub:
        """An `AuthedStub` over `channel` for this master."""
        return AuthedStub(channel, self.secret)

    def node_header(self, node_id: str) -> pb.RequestHeader:
        """A header with node `node_id`'s credential (derived from this master's secret)."""
        return pb.RequestHeader(client_id=node_id, token=node_credential(self.secret, node_id))


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
    tokens = [] if any(f.startswith("--tokens-file") for f in flags) else [
        "--tokens-file", str(session_store().path)]
    argv = [sys.executable, "-m", "cellar", "master", "--listen", "127.0.0.1:0",
            "--http", "127.0.0.1:0", *tokens, *flags]
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
