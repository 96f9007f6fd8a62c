"""The local cluster: one master (or etcd + N masters) and N storage nodes on 127.0.0.1.

What it owns
    `LocalCluster` starts `python -m cellar master` and `python -m cellar node` children with a
    freshly generated cluster secret (env `CELLAR_CLUSTER_SECRET`), a private directory for the
    segment files (under /dev/shm when it exists, so the segments are RAM) and one log file per
    child under a run directory. `start()` returns once every child has printed its ready line,
    or raises with the last lines of the failing child's log. `stop()` sends SIGTERM, waits a
    grace period, then SIGKILLs what is left, and removes the segment files (starting, waiting
    for and stopping a process is `cellar.devtools.children`'s work). `cellar up`
    (`cellar.devtools.up`), the integration and fault tests and `cellar soak` use this same
    class, so what a user starts by hand is what the tests exercise.

    Faults, for the fault tests and the soak: `kill_node`, `restart_node` (kill -9, then the
    same `--node-id` and shm dir, so the node re-attaches its segment), `restart_master` (kill
    -9, then a new master on the same ports, which rebuilds from the nodes), `signal_node` and
    `signal_master` (SIGSTOP/SIGCONT). After `start()` the master's ports are pinned, so a
    restarted master is found at the same address.

High availability (`ha=True`, `cellar up --ha`)
    First a real etcd (`cellar.devtools.etcd_server.EtcdServer`, data and log in the run directory),
    then `masters` masters (`master-0`, `master-1`, ...) on fixed ports, each with `--etcd`,
    `--cluster`, `--advertise` (its own gRPC address) and `--lease-ttl-s`; `start()` waits
    until one of them says `"role": "leader"` on its `/api/v1/status`, then starts the nodes
    with `--master etcd://HOST:PORT/CLUSTER`. `address` is that etcd:// URL (what clients
    connect to); `leader()` polls the masters' status for the current leader's index. The
    master faults take the index of a master; `cluster.etcd` is the EtcdServer for etcd
    faults (`stop`, `start`, `pause`, `resume`).

Invariants
    - A child never outlives the cluster: `stop()` reaps every child it started, and on Linux
      each child gets SIGTERM from the kernel if the thread that started it dies (PDEATHSIG,
      which the child asks for itself, see `cellar.lifecycle`), so even a SIGKILLed parent
      leaves nothing behind. Start children from a thread that lives as long as the cluster.
    - No Python code runs between fork and exec (`cellar.devtools.children.spawn` says why).
    - Ports may be 0: the real addresses are read back from the ready lines.

Credentials (docs/security.md)
    Before the master starts, the cluster creates its token store `<run_dir>/tokens.json`
    (hashed) with an admin token and a token of the `default` tenant (trusted on this host:
    shm allowed), passes it as the master's `--tokens-file`, and once the master is up writes
    both tokens, 0600, to `<run_dir>/credentials/<address>.json` and to the per-user
    credentials directory (`cellar.credentials`, ~/.cellar/credentials/), so that
    `cellar.connect(cluster.address)` and every CLI command need no flag. `token_for(tenant)`
    adds a tenant token (the master reads the store file again on an unknown token). `stop()`
    removes the per-user credentials file it wrote. Nodes need nothing: their credential derives
    from the cluster secret. With `tls=True` (one master) each node instead gets a client
    certificate `node:<node id>` from the throwaway CA and reaches the master's mutual-TLS port
    (`node_port`, `--node-listen`) with it and no credential; nodes past `nodes` +
    MTLS_SPARE_NODES, node ids of its own, and `ha=True` clusters use the credential.
    With `etcd_tls=True` (ha) etcd speaks only TLS and asks for client certificates (a CA of
    its own under `<run_dir>/etcd-tls`); the masters and nodes get `etcd_env`, the settings of
    coord/etcd_tls.py, which a client of the cluster needs in its environment too.

What it must never do
    Import the master, node or client code (children are separate processes); wait without a
    timeout.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from cellar.credentials import (
    ENV_TLS_CA,
    file_name,
    read_credentials,
    remove_credentials,
    write_credentials,
    write_private_json,
)
from cellar.devtools import cluster_argv
from cellar.devtools.children import (  # Child, ClusterError, fetch_status: re-exported for callers
    POLL_INTERVAL_S,
    STATUS_PROBE_TIMEOUT_S,
    Child,
    ClusterError,
    fetch_status,
    keep_log,
    send_signal,
    spawn,
    tail_of,
    terminate,
    wait_ready,
)
from cellar.devtools.etcd_server import ETCD_CLIENT_ID, EtcdServer
from cellar.devtools.ports import free_port
from cellar.http_fetch import advertised, base_url, fetch_json
from cellar.tls import TlsFiles, make_dev_pki
from cellar.tokens import KIND_ADMIN, KIND_TENANT, TokenStore
from cellar.units import parse_size_bytes

# A node's log line when one segment's background pre-fault ended, either way
# (storage_node/segment.py PREFAULT_DONE_LOG / PREFAULT_SKIPPED_LOG).
PREFAULT_ENDED = re.compile(r"segment \d+ (?:not )?pre-faulted")
DEFAULT_PREFAULT_WAIT_S = 120.0

DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_STOP_GRACE_S = 5.0
RESTART_PORT_WAIT_S = 20.0     # how long a restarted master may wait for its old port
RESTART_RETRY_INTERVAL_S = 0.3
PORT_CLASH_RETRIES = 3         # ha masters started again on new free ports when one was taken
PORT_CLASH = re.compile(r"cannot (?:listen on|serve HTTP on) .*(?:in use|Failed to bind)")
DEFAULT_LEASE_TTL_S = 3        # HA masters' etcd lease: a dead leader is replaced after ~this
DEFAULT_CLUSTER_NAME = "local"
DEFAULT_LEADER_WAIT_S = 30.0
MTLS_SPARE_NODES = 4  # tls: client certificates made beyond `nodes`, for add_node (CA key dropped)


class LocalCluster:
    """A master (or, with `ha=True`, etcd and `masters` masters) and `nodes` storage nodes on
    `host`; a context manager."""

    def __init__(self, nodes: int = 2, segment_size: str | int = "1GiB", *,
                 host: str = "127.0.0.1", port: int = 0, http_port: int = 0,
                 run_dir: str | Path | None = None, shm_dir: str | Path | None = None,
                 master_flags: Mapping[str, Any] | None = None,
                 node_flags: Mapping[str, Any] | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 stop_grace_s: float = DEFAULT_STOP_GRACE_S,
                 env: Mapping[str, str] | None = None,
                 ha: bool = False, masters: int | None = None,
                 cluster_name: str = DEFAULT_CLUSTER_NAME, etcd_port: int = 0,
                 lease_ttl_s: int = DEFAULT_LEASE_TTL_S,
                 admin_tokens: Sequence[str] = (), tls: bool = False,
                 etcd_tls: bool = False) -> None:
        if nodes < 0:
            raise ValueError(f"nodes must be >= 0, got {nodes}")
        master_count = masters if masters is not None else (2 if ha else 1)
        if master_count < 1 or (master_count > 1 and not ha):
            raise ValueError(f"masters must be 1 without ha, >= 1 with it; got {master_count}")
        self.ha = ha
        if etcd_tls and not ha:
            raise ValueError("etcd_tls needs ha=True (only an HA cluster uses etcd)")
        self.etcd_tls = etcd_tls
        self.etcd_env: dict[str, str] = {}  # coord/etcd_tls.py's settings when etcd_tls
        self.cluster_name = cluster_name
        self.etcd_port = etcd_port
        self.lease_ttl_s = lease_ttl_s
        self._master_count = master_count
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
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tokens_path = self.run_dir / "tokens.json"
        self.tokens_path.unlink(missing_ok=True)  # a reused run dir (cellar up): fresh tokens
        self._tokens = TokenStore(self.tokens_path)
        self.admin_token = self._tokens.create(KIND_ADMIN, label="cellar up admin")[1]
        self.token = self._tokens.create(KIND_TENANT, "default", shm=True,
                                         label="cellar up default tenant")[1]
        self.tls: TlsFiles | None = None
        # Mutual TLS for nodes (one master only: a node follows no redirect to another port).
        self.node_port = free_port(host) if tls and not ha else 0
        if tls:  # a throwaway CA, a master certificate for `host`, node client certificates
            node_ids = [f"node-{i}" for i in range(nodes + MTLS_SPARE_NODES)] if self.node_port else []
            self.tls = make_dev_pki(self.run_dir / "tls", [host], node_ids)
            self._env[ENV_TLS_CA] = str(self.tls.ca_file)  # nodes verify the master with it
        for token in admin_tokens:  # tokens the caller holds already (a test session's)
            self._tokens.add(KIND_ADMIN, token, shm=True, label="given to LocalCluster")
        self._credentials_written: list[str] = []  # addresses whose per-user file we wrote
        self.masters: list[Child] = []
        self.nodes: list[Child] = []
        self.etcd: EtcdServer | None = None
        self._node_count = nodes
        self._next_node = 0
        self._restarts = 0
        self._ha_ports: list[tuple[int, int]] = []  # (grpc, http) of each ha master
        self._started = False
        self._stopped = False

    # ---- public surface --------------------------------------------------------------------

    @property
    def master(self) -> Child | None:
        """The master (with ha=True: master-0, which need not lead; see `leader()`)."""
        return self.masters[0] if self.masters else None

    @property
    def address(self) -> str:
        """What `cellar.connect` and `cellar node --master` take: the master's gRPC address
        HOST:PORT, or with ha=True the cluster's `etcd://HOST:PORT/NAME`."""
        if self.ha:
            return self.etcd_url
        if self.master is None or not self.master.address:
            raise ClusterError("the cluster is not started")
        return self.master.address

    @property
    def etcd_url(self) -> str:
        """`etcd://HOST:PORT/NAME` of an ha cluster."""
        if self.etcd is None or not self.etcd.client_port:
            raise ClusterError("no etcd: the cluster is not started, or not ha")
        return self.etcd.etcd_url(self.cluster_name)

    @property
    def http_url(self) -> str:
        """The master's status/metrics base URL (with ha=True: the current leader's)."""
        if self.ha:
            return base_url(self.masters[self.leader()].http)
        if self.master is None or not self.master.http:
            raise ClusterError("the cluster is not started")
        return base_url(self.master.http)

    @property
    def master_http(self) -> str:
        """The single master's HTTP address from its fixed port (https:// with tls): the same
        across its restarts, and known while it is down, unlike `http_url`."""
        return advertised(self.host, self.http_port, self.tls is not None)

    @property
    def http_ca(self) -> str | None:
        """The CA file its https ports are verified with (tls=True), else None."""
        return str(self.tls.ca_file) if self.tls is not None else None

    def master_status(self, index: int = 0,
                      timeout_s: float = STATUS_PROBE_TIMEOUT_S) -> dict[str, Any] | None:
        """Master `index`'s `/api/v1/status`, or None when it does not answer (dead, stopped)."""
        child = self.masters[index]
        if not child.http or not child.alive():
            return None
        return fetch_status(child.http, timeout_s, self.http_ca)

    def roles(self) -> list[str]:
        """Each master's `role` ("leader", "standby", "single"; "" when it does not answer)."""
        out = []
        for i in range(len(self.masters)):
            status = self.master_status(i)
            out.append(str(status.get("role", "")) if status else "")
        return out

    def leader(self, timeout_s: float = DEFAULT_LEADER_WAIT_S, *,
               not_index: int | None = None) -> int:
        """Index of the master that says it leads, polling until exactly one does (and it is
        not `not_index`, e.g. the one just killed); ClusterError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            roles = self.roles()
            leaders = [i for i, role in enumerate(roles) if role in ("leader", "single")]
            if len(leaders) == 1 and leaders[0] != not_index:
                return leaders[0]
            if time.monotonic() > deadline:
                raise ClusterError(f"no single leader among the masters within {timeout_s:g}s "
                                   f"(roles {roles})")
            time.sleep(POLL_INTERVAL_S * 5)

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
            if self.ha:
                self._start_ha_masters()
            else:
                self.masters = [self._spawn("master", self._master_argv())]
                self._wait_ready(self.masters)
            for _ in range(self._node_count):
                self.nodes.append(self._spawn_node())
            self._wait_ready(self.nodes)
        except BaseException:
            self.stop()
            raise
        if not self.ha:
            # pin the bound ports: a restarted master must be found at the same address
            self.port = int(self.masters[0].address.rsplit(":", 1)[1])
            self.http_port = int(self.masters[0].http.rsplit(":", 1)[1])
        self._write_credentials()
        return self

    def token_for(self, tenant: str, *, shm: bool = False, admin: bool = False,
                  unlimited: bool = True) -> str:
        """A new token of `tenant` (or an admin token), valid at once on the running master;
        a tenant the master does not know is created through the admin API: unlimited
        (`quota_bytes` 0, explicit), or with `unlimited=False` with no quota set, so the
        master gives it its default quota (`default_tenant_quota_fraction` of capacity)."""
        self._tokens.refresh()
        if admin:
            return self._tokens.create(KIND_ADMIN, label="LocalCluster.token_for")[1]
        token = self._tokens.create(KIND_TENANT, tenant, shm=shm, label="LocalCluster.token_for")[1]
        known = self.admin_request("GET", "/api/v1/tenants")
        if not any(t.get("name") == tenant for t in known):
            self.admin_request("POST", "/api/v1/tenants",
                               {"name": tenant, **({"quota_bytes": 0} if unlimited else {})})
        return token

    def admin_request(self, method: str, path: str, body: Any = None, *,
                      token: str | None = None) -> Any:
        """One call of the (leader) master's JSON admin API with the admin token; the decoded
        reply. urllib.error.HTTPError on a refusal."""
        data = None if body is None else json.dumps(body).encode()
        return fetch_json(self.http_url, path, method=method, data=data, ca_file=self.http_ca,
                          timeout_s=STATUS_PROBE_TIMEOUT_S * 10, headers={
                              "Authorization": f"Bearer {self.admin_token if token is None else token}",
                              "Content-Type": "application/json"})

    def _write_credentials(self) -> None:
        """The tokens, 0600, under the run dir and in the per-user credentials directory, for
        the cluster's address and (ha) each master's own address (`cellar status` probes them)."""
        value: dict[str, Any] = {
            "tenant": "default", "token": self.token, "admin_token": self.admin_token,
            "http": [m.http for m in self.masters], "run_dir": str(self.run_dir)}
        if self.tls is not None:
            value["tls_ca"] = str(self.tls.ca_file)
        addresses = [self.address] + ([m.address for m in self.masters] if self.ha else [])
        for address in addresses:
            write_private_json(self.run_dir / "credentials" / file_name(address),
                               {"address": address, **value})
            write_credentials(address, value)
            self._credentials_written.append(address)

    def _remove_credentials(self) -> None:
        for address in self._credentials_written:
            current = read_credentials(address)
            if current is not None and current.get("token") == self.token:  # not a newer cluster's
                remove_credentials(address)
        self._credentials_written.clear()

    def _start_ha_masters(self) -> None:
        """etcd, then the masters on fixed ports (each advertises its own address, so the
        port cannot be 0), then wait until one of them leads."""
        # A fresh cluster gets a fresh etcd: a reused run directory (cellar up) must not bring
        # back the previous run's leader record (it would hold the election for a lease TTL).
        data_dir, log_path = self.run_dir / "etcd-data", self.run_dir / "etcd.log"
        shutil.rmtree(data_dir, ignore_errors=True)
        log_path.unlink(missing_ok=True)
        tls = (make_dev_pki(self.run_dir / "etcd-tls", [self.host], [ETCD_CLIENT_ID])
               if self.etcd_tls else None)
        self.etcd = EtcdServer(host=self.host, client_port=self.etcd_port,
                               data_dir=data_dir, log_path=log_path,
                               start_timeout_s=self.start_timeout_s,
                               stop_grace_s=self.stop_grace_s, tls=tls)
        self.etcd_env = self.etcd.client_env()
        self._env.update(self.etcd_env)  # the masters and nodes reach etcd with it
        self.etcd.start()
        for i in range(self._master_count):
            self.masters.append(self._spawn(f"master-{i}", self._ha_master_argv(i)))
        for i in range(self._master_count):
            self._await_ha_master(i)
        self.leader(self.start_timeout_s)

    def _await_ha_master(self, index: int) -> None:
        """Wait for master `index`'s ready line. Its ports were picked free before it started
        and another process may take one in between (seen in CI): then it starts again on new
        free ports, at most PORT_CLASH_RETRIES times. Ports the caller fixed are never moved."""
        for attempt in range(PORT_CLASH_RETRIES + 1):
            child = self.masters[index]
            try:
                self._wait_ready([child])
                return
            except ClusterError:
                clash = PORT_CLASH.search(tail_of(child.log_path))
                if self.port or self.http_port or clash is None or attempt == PORT_CLASH_RETRIES:
                    raise
            if child.alive():
                assert child.proc is not None
                child.stopping = True
                child.proc.kill()
                child.proc.wait(self.stop_grace_s)
            self._keep_log(child)
            self._ha_ports[index] = (free_port(self.host), free_port(self.host))
            self.masters[index] = self._spawn(child.name, self._ha_master_argv(index))

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
        """Send `sig` (e.g. SIGSTOP, SIGCONT) to node `index` if it is running; a SIGSTOP
        returns once every thread of the node has stopped (`children.send_signal`)."""
        child = self.nodes[index]
        if child.alive():
            assert child.proc is not None
            send_signal(child.proc, sig)

    def kill_master(self, index: int = 0, sig: int = signal.SIGKILL) -> None:
        """kill -9 (or `sig`) master `index` and reap it."""
        child = self.masters[index]
        assert child.proc is not None
        child.stopping = True
        if child.alive():
            child.proc.send_signal(sig)
            child.proc.send_signal(signal.SIGCONT)  # a stopped master must see a SIGTERM
        try:
            child.proc.wait(self.stop_grace_s)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()

    def restart_master(self, index: int = 0) -> Child:
        """kill -9 master `index` and start it again on the same ports (a single master
        rebuilds its table from the nodes' reports; an HA one comes back as a standby);
        return when it is ready. The old log is kept."""
        self.kill_master(index)
        return self.start_master(index)

    def start_master(self, index: int = 0) -> Child:
        """Start master `index` again (after `kill_master`) with the same argv and ports."""
        old = self.masters[index]
        if old.alive():
            raise ClusterError(f"{old.name} is still running")
        self._keep_log(old)
        argv = self._ha_master_argv(index) if self.ha else self._master_argv()
        deadline = time.monotonic() + RESTART_PORT_WAIT_S
        while True:  # the port may linger for a moment after the kill
            child = self._spawn(old.name, argv)
            self.masters[index] = child
            try:
                self._wait_ready([child])
                return child
            except ClusterError:
                if time.monotonic() > deadline:
                    raise
                child.stopping = True
                if child.alive():
                    assert child.proc is not None
                    child.proc.kill()
                    child.proc.wait(self.stop_grace_s)
                time.sleep(RESTART_RETRY_INTERVAL_S)

    def signal_master(self, sig: int, index: int = 0) -> None:
        """Send `sig` (e.g. SIGSTOP, SIGCONT) to master `index` if it is running; a SIGSTOP
        returns once every thread of the master has stopped."""
        child = self.masters[index]
        if child.alive():
            assert child.proc is not None
            send_signal(child.proc, sig)

    def wait_prefaulted(self, timeout_s: float = DEFAULT_PREFAULT_WAIT_S) -> bool:
        """Wait until every node's segments ended their background pre-fault (their log says
        so); False if timeout_s passed first. For benchmarks: until then a node's kernel is
        still mapping segment pages on the same cores the measurement runs on."""
        segments = int(self.node_flags.get("segments", 1))
        deadline = time.monotonic() + timeout_s
        while True:
            ended = 0
            for child in self.nodes:
                try:
                    text = child.log_path.read_text(errors="replace")
                except OSError:
                    text = ""
                ended += min(segments, len(PREFAULT_ENDED.findall(text)))
            if ended >= segments * len(self.nodes):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_INTERVAL_S * 10)

    def dead_children(self) -> list[Child]:
        """Children that exited although nobody asked them to."""
        children = self.masters + self.nodes
        return [c for c in children if c.proc is not None and not c.stopping and not c.alive()]

    def stop(self) -> None:
        """SIGTERM every child (nodes first, then the master), SIGKILL after the grace period,
        then remove the segment files (and the run directory if this object created it)."""
        if self._stopped:
            return
        self._stopped = True
        self._terminate(self.nodes)
        self._terminate(self.masters)
        if self.etcd is not None:
            self.etcd.close()
        self._remove_credentials()
        if self._own_shm_dir:
            shutil.rmtree(self.shm_dir, ignore_errors=True)
        if self._own_run_dir and not self.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        pids = [c.pid for c in self.masters + self.nodes if c.proc is not None]
        if self.etcd is not None and self.etcd.proc is not None:
            pids.append(self.etcd.pid)
        return pids

    # ---- internals -------------------------------------------------------------------------

    def _master_argv(self) -> list[str]:
        return cluster_argv.master_argv(self)

    def _ha_master_argv(self, index: int) -> list[str]:
        """Master `index` of an ha cluster: ports fixed at first use (port + index when a base
        port was given, else free ones), since the advertised address must be the real one."""
        while len(self._ha_ports) <= index:
            i = len(self._ha_ports)
            grpc_port = self.port + i if self.port else free_port(self.host)
            http_port = self.http_port + i if self.http_port else free_port(self.host)
            self._ha_ports.append((grpc_port, http_port))
        return cluster_argv.ha_master_argv(self, index, *self._ha_ports[index])

    def _spawn_node(self, extra_flags: Mapping[str, Any] | None = None) -> Child:
        assert self.masters
        i = self._next_node
        self._next_node += 1
        return self._spawn(f"node-{i}", cluster_argv.node_argv(self, i, extra_flags or {}))

    def _spawn(self, name: str, argv: list[str]) -> Child:
        return spawn(name, argv, self.run_dir / f"{name}.log", self._env)

    def _keep_log(self, child: Child) -> None:
        self._restarts += 1
        keep_log(child, self._restarts)

    def _wait_ready(self, children: list[Child]) -> None:
        wait_ready(children, self.start_timeout_s)

    def _terminate(self, children: list[Child]) -> None:
        terminate(children, self.stop_grace_s)
