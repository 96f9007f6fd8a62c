"""`cellar soak`: random traffic from several client processes while a chaos loop breaks things.

What it owns
    A soak run: a `LocalCluster` with short liveness settings, N worker processes
    (`python -m cellar.devtools.soak --worker ...`) doing random put/upsert/get/remove on their own key
    spaces, a chaos loop in this (parent) process injecting one fault at a time (each of the four
    kinds once per round, in random order: kill -9 + restart a node, SIGSTOP a node, kill -9 +
    restart the master, SIGSTOP the master), a watcher
    thread polling the master's HTTP API, and the verdict at the end.

    `--ha`: etcd + 2 masters (lease `--lease-ttl-s`, 3 s) + the nodes; workers connect through
    `etcd://`. The master faults become leader faults, again each kind once per round with the
    node faults: kill -9 the current leader (wait for the standby to take over, then restart
    the old one, which comes back as a standby), SIGSTOP the leader past its lease (the standby
    takes over; SIGCONT, and the old leader must step down), and a brief etcd outage shorter
    than the lease (SIGSTOP/SIGCONT of etcd, or stop + restart; the leader should keep leading).
    Each fault records the serving leader's epoch before and after it, so a leader change is a
    fact of the fault log, not an assumption. The watcher follows whichever master serves as
    leader. Two more verdicts with --ha (exit 1, logs kept): a leader stopped past its lease
    that no standby replaced while it was stopped, and an etcd outage within the leader's
    fence window (TTL - fence margin - keep-alive interval, ~2.2 s of a 3 s lease) after which
    a new leader serves. A longer outage, even one shorter than the lease, may depose the
    leader by design (it cannot tell that etcd will keep its lease): counted, not a failure.

The model (what a worker knows)
    Every value is self-describing: a header carries the key, a version and a BLAKE2b digest of
    (key, version, body), so any read is verified on its own. Each worker owns a disjoint key
    space and remembers, per key, what it last had acknowledged: an acknowledged put/upsert ->
    that version is expected; an acknowledged remove -> absent; an operation that raised
    (Unavailable, Timeout, ...) -> "unknown" until the next acknowledged write or remove.
    A read is then
    - CORRUPT when the digest, the key or the framing is wrong, or the version was never
      written (newer than any attempted): must never happen;
    - STALE when it returns an older version than the last acknowledged write, or a value for
      a key whose removal was acknowledged ("resurrected");
    - a LOSS when it answers NotFound (or a remove answers False) for a key whose last
      acknowledged operation was a write.
    After each acknowledged write a worker asks the master where the replicas are (one
    GetReplicas whose pin rides on the next lookup), so a loss can be explained precisely.

Loss causes (decided in the parent from the fault log)
    - evicted: the master's eviction counter (`master_evicted_key_count`) went up between the
      write's acknowledgement and the miss;
    - replica_nodes_expired: every node that held a replica was expired (stopped past the
      expiry) in that window; there is no re-replication, so an object that lost one copy to an
      expiry lives on one node until it is rewritten;
    - replica_nodes_killed: every replica's node was expired or killed -9 (a killed node
      restarts with the same id and should re-attach its objects, so this is suspicious and
      listed separately);
    - unexplained: anything else. The run exits non-zero on any corrupt read or unexplained
      loss.

What it must never do
    Run more than one fault at a time, wait without a bound, or leave a process behind (workers
    and cluster children die with this process, see `cellar.lifecycle`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellar.lifecycle import PARENT_PID_ENV, die_with_parent_if_asked
from cellar.units import format_size, parse_duration_s, parse_size_bytes

KIB = 1 << 10
MIB = 1 << 20
MAGIC = b"CSK1"
HEADER = struct.Struct("<4sHQI16s")  # magic, key length, version, body length, digest
DIGEST_BYTES = 16

FAULT_KINDS = ("node_kill_restart", "node_stop", "master_kill_restart", "master_stop")
HA_FAULT_KINDS = ("node_kill_restart", "node_stop", "leader_kill_restart", "leader_stop",
                  "etcd_outage")
DEFAULT_LEASE_TTL_S = 3
LEADER_WAIT_S = 30.0           # a new leader must be serving within this after a leader fault
ETCD_OUTAGE_MAX_FRACTION = 0.6  # of the lease: an outage the leader must ride out
MASTER_FLAGS = {
    "node_suspect_after_s": 1, "node_expire_after_s": 3, "pin_ttl_s": 3,
    "write_grant_ttl_s": 5, "heartbeat_interval_s": 0.3, "new_node_ramp_s": 0,
    "rebuild_grace_s": 5,
}
CLIENT_TIMEOUT_S = 15.0
PROGRESS_INTERVAL_S = 10.0
STATS_INTERVAL_S = 2.0
WATCH_INTERVAL_S = 0.5
HTTP_TIMEOUT_S = 1.0
RECOVERY_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 90.0
WORKER_FINISH_TIMEOUT_S = 300.0
FINAL_PASS_ATTEMPTS = 5


# ---- values ---------------------------------------------------------------------------------

def _digest(key: bytes, version: int, body: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(key)
    h.update(version.to_bytes(8, "little"))
    h.update(body)
    return h.digest()


def make_value(key: str, version: int, size: int, rng: random.Random) -> bytes:
    """A value of `size` bytes (at least the header) that says which key and version it is."""
    kb = key.encode()
    body_len = max(0, size - HEADER.size - len(kb))
    body = rng.randbytes(body_len)
    return HEADER.pack(MAGIC, len(kb), version, body_len, _digest(kb, version, body)) + kb + body


def check_value(key: str, value: bytes) -> tuple[int | None, str]:
    """(version, "") for a well-formed value of `key`; (None, why) for a corrupt one."""
    if len(value) < HEADER.size:
        return None, f"{len(value)} bytes is shorter than the header"
    magic, key_len, version, body_len, digest = HEADER.unpack_from(value)
    if magic != MAGIC:
        return None, f"bad magic {magic!r}"
    if HEADER.size + key_len + body_len != len(value):
        return None, f"length {len(value)} != header {HEADER.size}+{key_len}+{body_len}"
    kb = value[HEADER.size:HEADER.size + key_len]
    if kb != key.encode():
        return None, f"value of key {kb[:80]!r}"
    body = memoryview(value)[HEADER.size + key_len:]
    if _digest(kb, version, body) != digest:
        return None, f"digest mismatch (version {version})"
    return version, ""


# ---- the worker -----------------------------------------------------------------------------

PRESENT, ABSENT, UNKNOWN = "present", "absent", "unknown"


@dataclass
class KeyModel:
    state: str = ABSENT
    version: int = 0                 # the acknowledged version when PRESENT
    attempted: int = 0               # highest version ever attempted (any write)
    ack_time: float = 0.0            # wall time of the last acknowledged write
    nodes: list[str] | None = None   # replica node ids after the last acknowledged write
    removed_at: float = 0.0          # wall time of the last acknowledged remove
    removed_how: str = ""            # "<state before>:<what remove answered>"
    possible: set[int | None] = field(default_factory=set)  # UNKNOWN: what a read may return


class Worker:
    """One client process: random operations on its own keys, checked against its model."""

    def __init__(self, args: argparse.Namespace) -> None:
        import cellar  # the SDK only in workers: the parent never loads it

        self.cellar = cellar
        self.args = args
        self.dir = Path(args.dir)
        self.rng = random.Random(args.seed)
        self.keys = [f"soak/{args.run_id}/c{args.id}/k{i}" for i in range(args.keys)]
        self.model = {k: KeyModel() for k in self.keys}
        self.ops: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.stale: list[dict[str, Any]] = []
        self.corrupt: list[dict[str, Any]] = []
        self.losses: list[dict[str, Any]] = []
        self.unverified = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self.client = cellar.connect(args.master, timeout_s=CLIENT_TIMEOUT_S)
        self._channel: Any = None
        self._stub: Any = None
        self._stub_address = ""
        self._pending_pin = 0
        self._discovery: Any = None  # etcd:// (--ha): where the leader is
        self._leader_address = ""
        from cellar.coord.target import is_etcd_url, parse_etcd_url
        if is_etcd_url(args.master):
            from cellar.coord.discovery import LeaderDiscovery
            self._discovery = LeaderDiscovery(parse_etcd_url(args.master))
        self._log_min = math.log(args.min_size)
        self._log_max = math.log(args.max_size)

    # -- one operation --

    def _size(self) -> int:
        return int(math.exp(self.rng.uniform(self._log_min, self._log_max)))

    def _error(self, op: str, exc: BaseException) -> None:
        self.errors[f"{op}:{type(exc).__name__}"] += 1

    def step(self) -> None:
        key = self.rng.choice(self.keys)
        m = self.model[key]
        r = self.rng.random()
        if m.state == ABSENT:
            if r < 0.75:
                self.write(key, m, upsert=False)
            else:
                self.read(key, m)
        elif m.state == PRESENT:
            if r < 0.55:
                self.read(key, m)
            elif r < 0.85:
                self.write(key, m, upsert=True)
            else:
                self.remove(key, m)
        else:
            if r < 0.4:
                self.read(key, m)
            elif r < 0.9:
                self.write(key, m, upsert=True)
            else:
                self.remove(key, m)

    def write(self, key: str, m: KeyModel, *, upsert: bool) -> None:
        op = "upsert" if upsert else "put"
        m.attempted += 1
        version = m.attempted
        value = make_value(key, version, self._size(), self.rng)
        self.ops[op] += 1
        before = self._possible(m)
        try:
            if upsert:
                self.client.upsert(key, value, replicas=self.args.replicas)
            else:
                self.client.put(key, value, replicas=self.args.replicas)
        except self.cellar.AlreadyExists as exc:
            # we believed the key absent: a removed value came back, or an earlier failed
            # write did land after all (then the key was UNKNOWN, not ABSENT)
            self._error(op, exc)
            self.stale.append({"key": key, "kind": "put_already_exists", "t": time.time(),
                               "expected": "absent", "ack_time": m.removed_at,
                               "removed": m.removed_how})
            self._unknown(m, before)
            return
        except (self.cellar.NoSpace, self.cellar.QuotaExceeded, self.cellar.InvalidArgument) as exc:
            self._error(op, exc)  # refused before anything was written: the state holds
            return
        except Exception as exc:
            self._error(op, exc)
            self._unknown(m, before | {version})
            return
        self.bytes_written += len(value)
        m.state, m.version, m.ack_time, m.possible = PRESENT, version, time.time(), set()
        m.nodes = self._locate(key)

    def remove(self, key: str, m: KeyModel) -> None:
        self.ops["remove"] += 1
        before = self._possible(m)
        try:
            existed = self.client.remove(key)
        except Exception as exc:
            self._error("remove", exc)
            self._unknown(m, before | {None})
            return
        if m.state == PRESENT and not existed:
            self._loss(key, m, "remove returned False")
        m.removed_how = f"{m.state}:{existed}"
        m.state, m.possible, m.nodes, m.removed_at = ABSENT, set(), None, time.time()

    def read(self, key: str, m: KeyModel, *, final: bool = False) -> bool:
        """Read and judge `key`; False if the read itself failed (Unavailable, ...)."""
        self.ops["final_get" if final else "get"] += 1
        try:
            value = self.client.get(key)
        except self.cellar.NotFound:
            if m.state == PRESENT:
                self._loss(key, m, "get: NotFound")
                m.state, m.possible, m.nodes = ABSENT, set(), None
            elif m.state == UNKNOWN and None not in m.possible:
                self.errors["get:NotFound(unknown state)"] += 1
            return True
        except Exception as exc:
            self._error("final_get" if final else "get", exc)
            return False
        self.bytes_read += len(value)
        version, why = check_value(key, value)
        now = time.time()
        if version is None or version > m.attempted:
            why = why or f"version {version} was never written (highest attempted {m.attempted})"
            self.corrupt.append({"key": key, "t": now, "why": why, "size": len(value)})
            return True
        if m.state == PRESENT and version < m.version:
            self.stale.append({"key": key, "kind": "older_version", "t": now,
                               "expected": m.version, "got": version, "ack_time": m.ack_time})
        elif m.state == ABSENT:
            self.stale.append({"key": key, "kind": "resurrected", "t": now, "got": version,
                               "ack_time": m.removed_at, "removed": m.removed_how})
            self._unknown(m, {version})
        elif m.state == UNKNOWN and m.possible and version not in m.possible:
            newest = max((v for v in m.possible if v is not None), default=0)
            if version < newest:
                self.stale.append({"key": key, "kind": "older_version_unknown_state", "t": now,
                                   "possible": sorted(str(v) for v in m.possible),
                                   "got": version, "ack_time": max(m.ack_time, m.removed_at)})
        return True

    # -- model helpers --

    @staticmethod
    def _possible(m: KeyModel) -> set[int | None]:
        if m.state == PRESENT:
            return {m.version}
        if m.state == ABSENT:
            return {None}
        return set(m.possible)

    @staticmethod
    def _unknown(m: KeyModel, possible: set[int | None]) -> None:
        m.state, m.possible, m.nodes = UNKNOWN, possible, None

    def _loss(self, key: str, m: KeyModel, how: str) -> None:
        self.losses.append({"key": key, "version": m.version, "ack_time": m.ack_time,
                            "detect_time": time.time(), "nodes": m.nodes, "how": how})

    def _master_address(self) -> str | None:
        """The gRPC address to ask for replicas: the master, or (etcd://) the leader in etcd."""
        if self._discovery is None:
            return str(self.args.master)
        if not self._leader_address:
            try:
                record = self._discovery.leader(timeout_s=1.0)
            except self.cellar.Unavailable:
                return None
            if record is None:  # an election is under way
                return None
            self._leader_address = record.address
        return self._leader_address

    def _forget_master(self) -> None:
        """After a failed call: ask etcd again next time (the leader may have changed)."""
        if self._discovery is None:
            return
        self._leader_address = ""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
        self._stub_address = ""
        self._pending_pin = 0  # a pin lives on the master that granted it

    def _locate(self, key: str) -> list[str] | None:
        """The node ids holding `key`'s replicas (None if the master cannot say right now)."""
        import grpc

        from cellar.proto import cellar_pb2 as pb
        from cellar.proto import cellar_pb2_grpc as pb_grpc

        address = self._master_address()
        if address is None:
            return None
        if self._stub is None or self._stub_address != address:
            if self._channel is not None:
                self._channel.close()
            self._channel = grpc.insecure_channel(address)
            self._stub = pb_grpc.MasterStub(self._channel)
            self._stub_address = address
        from cellar.credentials import default_token

        header = pb.RequestHeader(tenant="default", client_id=f"soak-locate-{self.args.id}",
                                  token=default_token(address) or "")
        unpin = [self._pending_pin] if self._pending_pin else []
        try:
            reply = self._stub.GetReplicas(
                pb.GetReplicasRequest(header=header, keys=[key], unpin_ids=unpin), timeout=2.0)
        except grpc.RpcError:
            self._forget_master()
            return None
        self._pending_pin = 0
        if len(reply.results) != 1 or reply.results[0].status != pb.OK:
            return None
        result = reply.results[0]
        self._pending_pin = result.pin_id
        return sorted({r.node_id for r in result.replicas})

    # -- the run --

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.args.id, "ops": dict(self.ops), "errors": dict(self.errors),
            "stale": len(self.stale), "corrupt": len(self.corrupt), "losses": len(self.losses),
            "bytes_written": self.bytes_written, "bytes_read": self.bytes_read,
        }

    def _write_json(self, name: str, data: dict[str, Any]) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.dir / name)

    def run(self) -> int:
        next_stats = 0.0
        while time.time() < self.args.load_until:
            self.step()
            if time.monotonic() >= next_stats:
                self._write_json(f"stats-{self.args.id}.json", self.stats())
                next_stats = time.monotonic() + STATS_INTERVAL_S
        self._write_json(f"stats-{self.args.id}.json", self.stats())
        settled = self.dir / "settled"
        deadline = time.monotonic() + SETTLE_TIMEOUT_S + RECOVERY_TIMEOUT_S
        while not settled.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.final_pass()
        result = self.stats()
        result.update({"stale_reads": self.stale, "corrupt_reads": self.corrupt,
                       "lost": self.losses, "unverified": self.unverified,
                       "believed_present": sum(m.state == PRESENT for m in self.model.values()),
                       "unknown_at_end": sum(m.state == UNKNOWN for m in self.model.values())})
        self._write_json(f"result-{self.args.id}.json", result)
        self.client.close()
        if self._channel is not None:
            self._channel.close()
        if self._discovery is not None:
            self._discovery.close()
        return 0

    def final_pass(self) -> None:
        """Read every key believed present (and probe the removed ones for resurrection)."""
        for key, m in self.model.items():
            if m.state == UNKNOWN:
                continue
            for attempt in range(FINAL_PASS_ATTEMPTS):
                if self.read(key, m, final=True):
                    break
                time.sleep(0.5 * (attempt + 1))
            else:
                self.unverified += 1


def worker_main(args: argparse.Namespace) -> int:
    die_with_parent_if_asked()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    return Worker(args).run()


# ---- the parent: cluster, chaos, watcher, verdict ------------------------------------------

def _now() -> float:
    return time.time()


def _stamp(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


class Watcher(threading.Thread):
    """Polls the master's HTTP API: node states (expiries) and the eviction counter. With HA it
    polls whichever master serves as leader (role "leader" and serving: a deposed leader thawed
    from a SIGSTOP may still say "leader" for a moment, and its table must not count)."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(name="soak-watcher", daemon=True)
        self.cluster = cluster
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.node_states: dict[str, str] = {}
        self.expiries: list[tuple[float, str]] = []           # (time seen, node id)
        self.evictions: list[tuple[float, float, int]] = []    # (from, to, keys evicted)
        self.leader_changes: list[tuple[float, int, int]] = []  # (time seen, old, new epoch)
        self.evicted_total = 0
        self.max_used_fraction = 0.0
        self._last_evicted: int | None = None
        self._last_epoch: int | None = None
        self._last_poll = _now()
        self._leader_http = ""  # HA: the HTTP address of the master last seen serving as leader

    def _get_from(self, http: str, path: str) -> bytes:
        with urllib.request.urlopen(f"http://{http}{path}", timeout=HTTP_TIMEOUT_S) as response:
            data: bytes = response.read()
            return data

    @staticmethod
    def _serves(status: dict[str, Any]) -> bool:
        return status.get("role") in ("leader", "single") and status.get("serving", True) is True

    def leader_status(self) -> tuple[str, dict[str, Any]] | None:
        """(HTTP address, /api/v1/status) of the master serving as leader, or None."""
        if not self.cluster.ha:
            http = f"127.0.0.1:{self.cluster.http_port}"
            return http, json.loads(self._get_from(http, "/api/v1/status"))
        candidates = [self._leader_http] if self._leader_http else []
        candidates += [m.http for m in list(self.cluster.masters)
                       if m.http and m.http != self._leader_http and m.alive()]
        for http in candidates:
            try:
                status = json.loads(self._get_from(http, "/api/v1/status"))
            except Exception:  # stopped, dead or restarting: try the next one
                continue
            if self._serves(status):
                self._leader_http = http
                return http, status
        return None

    def poll(self) -> None:
        found = self.leader_status()
        if found is None:
            return
        http, status = found
        metrics = self._get_from(http, "/metrics").decode()
        now = _now()
        match = re.search(r"^master_evicted_key_count(?:\{[^}]*\})? ([0-9.e+]+)$", metrics, re.M)
        evicted = int(float(match.group(1))) if match else 0
        epoch = int(status.get("epoch", 0))
        with self.lock:
            if status.get("capacity"):
                self.max_used_fraction = max(self.max_used_fraction,
                                             status["used"] / status["capacity"])
            # an expired node's segments leave the table: a node that vanishes while the same
            # master runs was expired (a new master starts empty: that is not an expiry)
            states = {seg["node"]: seg["state"] for seg in status.get("segments", [])}
            if epoch == self._last_epoch:
                for node in self.node_states.keys() - states.keys():
                    self.expiries.append((now, node))
            elif self._last_epoch is not None:
                self.leader_changes.append((now, self._last_epoch, epoch))
            self.node_states = states
            # a new master counts from 0
            delta = evicted - (self._last_evicted or 0) if epoch == self._last_epoch else evicted
            if delta > 0:
                self.evictions.append((self._last_poll, now, delta))
                self.evicted_total += delta
            self._last_evicted, self._last_epoch, self._last_poll = evicted, epoch, now

    def run(self) -> None:
        while not self.stop_event.wait(WATCH_INTERVAL_S):
            with contextlib.suppress(Exception):  # a stopped or restarting master: try again
                self.poll()

    def leader_epoch(self) -> int | None:
        """The epoch of the master serving as leader right now, or None if none answers."""
        try:
            found = self.leader_status()
        except Exception:
            return None
        return int(found[1].get("epoch", 0)) if found is not None else None

    def all_active(self, node_ids: list[str]) -> bool:
        try:
            found = self.leader_status()
        except Exception:
            return False
        if found is None:
            return False
        states = {seg["node"]: seg["state"] for seg in found[1].get("segments", [])}
        return all(states.get(n) == "ACTIVE" for n in node_ids)


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    end: float = 0.0
    detail: str = ""
    recovered_s: float = 0.0
    epoch_before: int | None = None  # the serving leader's epoch before/after (None: none)
    epoch_after: int | None = None
    outage_s: float = 0.0            # etcd_outage: how long etcd did not answer

    @property
    def leader_changed(self) -> bool:
        """A new master (epoch) serves after the fault: its table was rebuilt from the nodes."""
        return (self.kind == "master_kill_restart"
                or (self.epoch_after is not None and self.epoch_after != self.epoch_before))


class Chaos:
    """One fault at a time, then wait until the cluster is whole again."""

    def __init__(self, cluster: Any, watcher: Watcher, rng: random.Random,
                 expire_after_s: float, log: Any, *, lease_ttl_s: float = 0.0) -> None:
        self.cluster = cluster
        self.watcher = watcher
        self.rng = rng
        self.expire_after_s = expire_after_s
        self.lease_ttl_s = lease_ttl_s
        self.log = log
        self.kinds = HA_FAULT_KINDS if cluster.ha else FAULT_KINDS
        self.faults: list[Fault] = []
        self._round: list[str] = []

    def _next_kind(self) -> str:
        """Every kind once per round, in a random order: a short run still sees them all."""
        if not self._round:
            self._round = list(self.kinds)
            self.rng.shuffle(self._round)
        return self._round.pop()

    def _node_ids(self) -> list[str]:
        return [c.name for c in self.cluster.nodes]

    def inject(self) -> Fault:
        kind = self._next_kind()
        epoch_before = self.watcher.leader_epoch() if self.cluster.ha else None
        t0 = _now()
        if kind == "node_kill_restart":
            i = self.rng.randrange(len(self.cluster.nodes))
            fault = Fault(kind, f"node-{i}", t0, detail="kill -9, restart with the same id")
            self.log(f"fault: kill -9 node-{i} and restart it")
            self.cluster.restart_node(i)
        elif kind == "node_stop":
            i = self.rng.randrange(len(self.cluster.nodes))
            stop_s = self.rng.uniform(0.5, 2.0 * self.expire_after_s)
            past = stop_s > self.expire_after_s
            fault = Fault(kind, f"node-{i}", t0,
                          detail=f"SIGSTOP {stop_s:.1f}s{' (past expiry)' if past else ''}")
            self.log(f"fault: SIGSTOP node-{i} for {stop_s:.1f}s"
                     f"{' (past the expiry)' if past else ''}")
            self.cluster.signal_node(i, signal.SIGSTOP)
            try:
                time.sleep(stop_s)
            finally:
                self.cluster.signal_node(i, signal.SIGCONT)
        elif kind == "master_kill_restart":
            fault = Fault(kind, "master", t0, detail="kill -9, restart on the same port")
            self.log("fault: kill -9 the master and restart it")
            self.cluster.restart_master()
        elif kind == "master_stop":
            stop_s = self.rng.uniform(1.0, 2.0 * self.expire_after_s)
            fault = Fault(kind, "master", t0, detail=f"SIGSTOP {stop_s:.1f}s")
            self.log(f"fault: SIGSTOP the master for {stop_s:.1f}s")
            self.cluster.signal_master(signal.SIGSTOP)
            try:
                time.sleep(stop_s)
            finally:
                self.cluster.signal_master(signal.SIGCONT)
        elif kind == "leader_kill_restart":
            fault = self._leader_kill_restart(t0)
        elif kind == "leader_stop":
            fault = self._leader_stop(t0)
        else:
            fault = self._etcd_outage(t0)
        fault.epoch_before = epoch_before
        fault.end = _now()
        self.faults.append(fault)
        self.wait_whole()
        fault.recovered_s = _now() - fault.end
        if self.cluster.ha:
            fault.epoch_after = self.watcher.leader_epoch()
            if fault.leader_changed:
                fault.detail += f"; leader epoch {fault.epoch_before} -> {fault.epoch_after}"
        self.log(f"  recovered {fault.recovered_s:.1f}s after {kind} ended"
                 f"{' (new leader)' if fault.leader_changed else ''}")
        return fault

    # -- HA faults --

    def _leader_kill_restart(self, t0: float) -> Fault:
        """kill -9 the leader; once the standby serves, start the old one again (a standby)."""
        old = self.cluster.leader()
        name = self.cluster.masters[old].name
        self.log(f"fault: kill -9 the leader {name}, restart it once the standby took over")
        self.cluster.kill_master(old)
        new = self.cluster.leader(LEADER_WAIT_S, not_index=old)
        took_over_s = _now() - t0
        self.cluster.start_master(old)
        role = self._role_of(old)
        self.log(f"  {self.cluster.masters[new].name} leads {took_over_s:.1f}s after the kill; "
                 f"{name} restarted as {role or '?'}")
        return Fault("leader_kill_restart", name, t0,
                     detail=f"kill -9, {self.cluster.masters[new].name} led after "
                            f"{took_over_s:.1f}s, restarted as {role or '?'}")

    def _leader_stop(self, t0: float) -> Fault:
        """SIGSTOP the leader past its lease, then SIGCONT it. A standby must take over while
        it is stopped (watched here, since the thawed master may win the next election itself
        and the epochs alone would not tell); if none did, the fault says NO TAKEOVER."""
        old = self.cluster.leader()
        name = self.cluster.masters[old].name
        stop_s = self.rng.uniform(1.5 * self.lease_ttl_s, 2.5 * self.lease_ttl_s)
        self.log(f"fault: SIGSTOP the leader {name} for {stop_s:.1f}s (lease {self.lease_ttl_s:g}s)")
        self.cluster.signal_master(signal.SIGSTOP, old)
        taker, took_over_s = "", 0.0
        try:
            until = time.monotonic() + stop_s
            while time.monotonic() < until:
                for i in range(len(self.cluster.masters)):
                    if not taker and i != old and self._role_of(i) == "leader":
                        taker, took_over_s = self.cluster.masters[i].name, _now() - t0
                time.sleep(min(0.2, max(0.0, until - time.monotonic())))
        finally:
            self.cluster.signal_master(signal.SIGCONT, old)
        if taker:
            after = f"{taker} took over {took_over_s:.1f}s after the stop"
        else:
            after = "NO TAKEOVER by a standby while the leader was stopped"
        try:
            after += f"; then master-{self.cluster.leader(LEADER_WAIT_S)} leads"
        except Exception as exc:  # noqa: BLE001 - the log says so; wait_whole decides
            after += f"; then {exc}"
        self.log(f"  {after}; {name} is {self._role_of(old) or '?'}")
        return Fault("leader_stop", name, t0, detail=f"SIGSTOP {stop_s:.1f}s past the lease; {after}")

    def _etcd_outage(self, t0: float) -> Fault:
        """etcd gone for less than the lease: paused (SIGSTOP/SIGCONT) or stopped and started
        again on the same data; the leader should ride it out."""
        etcd = self.cluster.etcd
        assert etcd is not None
        leader = self.cluster.leader()
        budget_s = ETCD_OUTAGE_MAX_FRACTION * self.lease_ttl_s
        if self.rng.random() < 0.5:
            pause_s = self.rng.uniform(0.3, budget_s)
            self.log(f"fault: pause etcd (SIGSTOP) for {pause_s:.1f}s")
            etcd.pause()
            try:
                time.sleep(pause_s)
            finally:
                etcd.resume()
            how = f"SIGSTOP {pause_s:.1f}s"
        else:
            down_s = self.rng.uniform(0.1, budget_s / 2)
            self.log(f"fault: stop etcd, restart it after {down_s:.1f}s")
            etcd.stop()
            time.sleep(down_s)
            etcd.start()
            how = "stop + restart"
        outage_s = _now() - t0
        note = "" if outage_s < self.lease_ttl_s else " (LONGER than the lease)"
        self.log(f"  etcd back after {outage_s:.1f}s{note}")
        return Fault("etcd_outage", "etcd", t0, outage_s=outage_s,
                     detail=f"{how}, out {outage_s:.1f}s{note}; leader before "
                            f"{self.cluster.masters[leader].name}")

    def _role_of(self, index: int) -> str:
        status = self.cluster.master_status(index)
        return str(status.get("role", "")) if status else ""

    def wait_whole(self) -> None:
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = self.cluster.dead_children()
            if dead:
                raise RuntimeError(f"a cluster process died: {dead[0].describe_exit()}")
            etcd = self.cluster.etcd
            if etcd is not None and not etcd.alive():
                raise RuntimeError(f"etcd died: {etcd.describe_exit()}")
            if self.watcher.all_active(self._node_ids()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the cluster was not whole {RECOVERY_TIMEOUT_S:g}s after a fault")

    def dropping_events(self) -> list[tuple[float, float, str, str]]:
        """(from, to, node, how) for each event that may have destroyed a node's replicas."""
        out: list[tuple[float, float, str, str]] = []
        for f in self.faults:
            if f.kind == "node_kill_restart":
                out.append((f.start, f.end + f.recovered_s, f.target, "killed"))
            elif f.kind == "node_stop" and "past expiry" in f.detail:
                out.append((f.start, f.end + f.recovered_s, f.target, "expired"))
        with self.watcher.lock:
            for t, node in self.watcher.expiries:
                out.append((t - WATCH_INTERVAL_S * 2, t, node, "expired"))
        return out


def classify_loss(loss: dict[str, Any], chaos: Chaos, watcher: Watcher,
                  replicas: int) -> str:
    t0, t1 = loss["ack_time"], loss["detect_time"]
    with watcher.lock:
        if any(a <= t1 and b >= t0 for a, b, _n in watcher.evictions):
            return "evicted"
    hits: dict[str, set[str]] = {}
    for a, b, node, how in chaos.dropping_events():
        if a <= t1 and b >= t0:
            hits.setdefault(node, set()).add(how)
    nodes = loss.get("nodes")
    if nodes:
        if all("expired" in hits.get(n, set()) for n in nodes):
            return "replica_nodes_expired"
        if all(hits.get(n) for n in nodes):
            return "replica_nodes_killed"
        return "unexplained"
    if len(hits) >= replicas:  # placement unknown: enough distinct nodes failed
        return "replica_nodes_failed_placement_unknown"
    return "unexplained"


def classify_stale(stale: dict[str, Any], chaos: Chaos, rebuild_window_s: float) -> str:
    """Why a read returned a value older than the acknowledged state.

    - ack_before_master_restart: the acknowledged remove/upsert preceded a master kill -9; the
      node had not heard of the freed range yet (freed notices ride on heartbeat replies, and
      the killed master's outbox is gone), so the new master re-adopted the old value.
    - ack_during_master_rebuild: the new master acknowledged it while nodes were still
      reporting; a node that reported the same replica later re-created the removed object.
    - ack_while_node_away: acknowledged while a node holding a replica was down or expired
      (killed and restarting, or stopped past the expiry); the node reported its old replica
      when it came back and the master re-created the removed object from it.
    - ack_before_leader_change, ack_during_leader_takeover (--ha): the same two, for a fault
      after which a new leader served (a leader killed or stopped past its lease, or any
      fault whose before/after epochs differ): the new leader rebuilt its table from the
      nodes' reports exactly as a restarted master does.
    - other: none of these; nothing explains it."""
    t0, t1 = stale.get("ack_time", 0.0), stale["t"]
    for f in chaos.faults:
        if not f.leader_changed or f.start > t1:
            continue
        ha = f.kind != "master_kill_restart"
        if t0 <= f.start:
            stale["ack_before_restart_s"] = round(f.start - t0, 3)
            return "ack_before_leader_change" if ha else "ack_before_master_restart"
        if t0 <= f.end + f.recovered_s + rebuild_window_s:
            stale["ack_after_restart_s"] = round(t0 - f.end, 3)
            return "ack_during_leader_takeover" if ha else "ack_during_master_rebuild"
    for f in chaos.faults:
        away = f.kind == "node_kill_restart" or (f.kind == "node_stop" and "past expiry" in f.detail)
        if away and f.start <= t0 <= f.end + f.recovered_s + rebuild_window_s and f.start <= t1:
            stale["node_away"] = f.target
            return "ack_while_node_away"
    return "other"


def run_soak(args: argparse.Namespace) -> int:
    from cellar.devtools.local_cluster import LocalCluster

    duration_s = parse_duration_s(args.duration)
    chaos_interval_s = parse_duration_s(args.chaos_interval)
    segment_bytes = parse_size_bytes(args.segment_size)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    rng = random.Random(seed)
    run_id = f"{int(time.time())}-{os.getpid()}"
    started = _now()

    def log(message: str) -> None:
        print(f"[{_stamp(_now())} +{_now() - started:6.1f}s] {message}", flush=True)

    master_flags = {**MASTER_FLAGS, "default_replicas": args.replicas}
    expire_after_s = float(master_flags["node_expire_after_s"])
    log(f"soak: seed {seed}, {args.nodes} nodes x {format_size(segment_bytes)}, "
        f"{args.clients} clients x {args.keys} keys, replicas {args.replicas}, "
        f"duration {duration_s:g}s, a fault every ~{chaos_interval_s:g}s")
    if args.ha:
        log(f"high availability: etcd + {args.masters} masters, lease {args.lease_ttl_s}s")
        cluster = LocalCluster(args.nodes, segment_bytes, master_flags=master_flags,
                               node_flags={"heartbeat_interval_s": 0.3}, ha=True,
                               masters=args.masters, lease_ttl_s=args.lease_ttl_s,
                               cluster_name=f"soak{os.getpid()}", tls=args.tls)
    else:
        cluster = LocalCluster(args.nodes, segment_bytes, master_flags=master_flags,
                               node_flags={"heartbeat_interval_s": 0.3}, tls=args.tls)
    workers: list[subprocess.Popen[bytes]] = []
    watcher = Watcher(cluster)
    chaos = Chaos(cluster, watcher, rng, expire_after_s, log,
                  lease_ttl_s=float(args.lease_ttl_s) if args.ha else 0.0)
    work_dir = cluster.run_dir / "soak"
    failure = ""
    try:
        cluster.start()
        log(f"cluster up: {'etcd ' if args.ha else 'master '}{cluster.address}, "
            f"logs in {cluster.run_dir}")
        work_dir.mkdir(parents=True, exist_ok=True)
        watcher.start()
        load_until = _now() + duration_s
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        for i in range(args.clients):
            argv = [sys.executable, "-m", "cellar.devtools.soak", "--worker", "--id", str(i),
                    "--master", cluster.address, "--dir", str(work_dir),
                    "--load-until", repr(load_until), "--seed", str(seed * 1000 + i),
                    "--keys", str(args.keys), "--replicas", str(args.replicas),
                    "--min-size", str(parse_size_bytes(args.min_size)),
                    "--max-size", str(parse_size_bytes(args.max_size)), "--run-id", run_id]
            with open(work_dir / f"worker-{i}.log", "wb") as out:
                workers.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, env=env))
        next_fault = time.monotonic() + chaos_interval_s * rng.uniform(0.5, 1.5)
        next_progress = time.monotonic() + PROGRESS_INTERVAL_S
        while _now() < load_until:
            if any(w.poll() is not None for w in workers):
                failure = "a worker exited early (see its log in " + str(work_dir) + ")"
                break
            if time.monotonic() >= next_progress:
                log(progress_line(work_dir, chaos, watcher))
                next_progress = time.monotonic() + PROGRESS_INTERVAL_S
            if time.monotonic() >= next_fault and _now() < load_until - 1.0:
                chaos.inject()
                next_fault = time.monotonic() + chaos_interval_s * rng.uniform(0.5, 1.5)
            time.sleep(0.1)
        if not failure:
            log("load over: settling the cluster for the final pass")
            chaos.wait_whole()
            if any(f.leader_changed for f in chaos.faults[-1:]):
                time.sleep(float(master_flags["rebuild_grace_s"]))
            (work_dir / "settled").touch()
            log("final pass: every worker reads every key it believes present")
            deadline = time.monotonic() + WORKER_FINISH_TIMEOUT_S
            for w in workers:
                try:
                    w.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    failure = "a worker did not finish its final pass in time"
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
        log(f"soak aborted: {failure}")
    finally:
        watcher.stop_event.set()
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        for child in [*cluster.masters, *cluster.nodes]:
            if child is not None and child.alive():
                assert child.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGCONT)
        if cluster.etcd is not None and cluster.etcd.paused:
            cluster.etcd.resume()
        report = build_report(args, seed, started, work_dir, chaos, watcher, failure)
        ha_failures = (report.get("leader_stops_without_takeover", 0)
                       + report.get("etcd_outages_within_fence_window_that_changed_leader", 0))
        keep = bool(failure or report["corrupt_reads"] or report["lost"]["unexplained"]
                    or ha_failures)
        if keep:  # keep the logs for the post-mortem
            cluster.keep_run_dir = True
            report["run_dir"] = str(cluster.run_dir)
        cluster.stop()
    print_summary(report, log)
    if args.report:
        report_path = Path(args.report)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2, default=str))
        log(f"report written to {args.report}")
    # HA: a leader stopped past its lease that no standby replaced, or a leader deposed by an
    # etcd outage it should have ridden out, is a failover failure too
    ok = (not failure and report["corrupt_reads"] == 0 and report["lost"]["unexplained"] == 0
          and not ha_failures)
    return 0 if ok else 1


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def progress_line(work_dir: Path, chaos: Chaos, watcher: Watcher) -> str:
    ops: Counter[str] = Counter()
    errors = stale = corrupt = losses = 0
    for path in sorted(work_dir.glob("stats-*.json")):
        data = _read_json(path)
        if data is None:
            continue
        ops.update(data["ops"])
        errors += sum(data["errors"].values())
        stale += data["stale"]
        corrupt += data["corrupt"]
        losses += data["losses"]
    faults = Counter(f.kind for f in chaos.faults)
    return (f"ops {sum(ops.values())} ({', '.join(f'{k} {v}' for k, v in sorted(ops.items()))}), "
            f"errors {errors}, faults {sum(faults.values())}, corrupt {corrupt}, stale {stale}, "
            f"lost {losses}, evicted {watcher.evicted_total}, "
            f"max used {watcher.max_used_fraction:.0%}")


def build_report(args: argparse.Namespace, seed: int, started: float, work_dir: Path,
                 chaos: Chaos, watcher: Watcher, failure: str) -> dict[str, Any]:
    ops: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    stale: list[dict[str, Any]] = []
    corrupt: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    unverified = believed = unknown = 0
    bytes_written = bytes_read = 0
    missing = []
    for i in range(args.clients):
        data = _read_json(work_dir / f"result-{i}.json")
        if data is None:
            missing.append(i)
            data = _read_json(work_dir / f"stats-{i}.json")
            if data is None:
                continue
        ops.update(data["ops"])
        errors.update(data["errors"])
        stale += data.get("stale_reads", [])
        corrupt += data.get("corrupt_reads", [])
        lost += data.get("lost", [])
        unverified += data.get("unverified", 0)
        believed += data.get("believed_present", 0)
        unknown += data.get("unknown_at_end", 0)
        bytes_written += data.get("bytes_written", 0)
        bytes_read += data.get("bytes_read", 0)
    causes: Counter[str] = Counter()
    for loss in lost:
        loss["cause"] = classify_loss(loss, chaos, watcher, args.replicas)
        causes[loss["cause"]] += 1
    stale_kinds = Counter(s["kind"] for s in stale)
    rebuild_window_s = float(MASTER_FLAGS["rebuild_grace_s"]) + 1.0
    stale_causes = Counter(classify_stale(s, chaos, rebuild_window_s) for s in stale)
    if missing and not failure:
        failure = f"no final result from worker(s) {missing}"
    return {
        "seed": seed, "duration_s": round(_now() - started, 1),
        "clients": args.clients, "nodes": args.nodes, "replicas": args.replicas,
        "ops_total": sum(ops.values()), "ops": dict(sorted(ops.items())),
        "bytes_written": bytes_written, "bytes_read": bytes_read,
        "errors_total": sum(errors.values()), "errors": dict(sorted(errors.items())),
        "faults_total": len(chaos.faults),
        "faults": dict(sorted(Counter(f.kind for f in chaos.faults).items())),
        "fault_log": [{"kind": f.kind, "target": f.target, "at": _stamp(f.start),
                       "lasted_s": round(f.end - f.start, 2), "detail": f.detail,
                       "recovered_s": round(f.recovered_s, 2),
                       "leader_changed": f.leader_changed} for f in chaos.faults],
        "corrupt_reads": len(corrupt), "corrupt_details": corrupt[:50],
        "stale_reads": len(stale), "stale_by_kind": dict(stale_kinds),
        "stale_by_cause": dict(stale_causes), "stale_details": stale[:500],
        "lost": {"total": len(lost), **{c: causes.get(c, 0) for c in (
            "evicted", "replica_nodes_expired", "replica_nodes_killed",
            "replica_nodes_failed_placement_unknown", "unexplained")}},
        "lost_details": lost[:100],
        "keys_believed_present_at_end": believed, "keys_unknown_at_end": unknown,
        "final_reads_unverified": unverified,
        "evicted_keys_seen": watcher.evicted_total,
        "max_used_fraction": round(watcher.max_used_fraction, 3),
        "node_expiries_seen": len(watcher.expiries),
        "failure": failure,
        **(ha_report(chaos, watcher) if args.ha else {}),
    }


def fence_window_s(lease_ttl_s: float) -> float:
    """The longest etcd outage a leader surely rides out: its own deadline is the last
    keep-alive *sent* + TTL - the fence margin, and the last one may have been sent a keep-alive
    interval before etcd went away (cellar.coord.election). A longer outage, even one shorter
    than the lease, may depose it by design; then a new election follows once etcd is back."""
    from cellar.coord.election import KEEPALIVES_PER_TTL, fence_margin_s

    interval_s = max(0.2, lease_ttl_s / KEEPALIVES_PER_TTL)
    return lease_ttl_s - fence_margin_s(lease_ttl_s) - interval_s


def ha_report(chaos: Chaos, watcher: Watcher) -> dict[str, Any]:
    """What the leader faults did: how many changed the leader, by kind, and how long the
    cluster took to be whole again. An etcd outage within the leader's fence window must change
    nothing; a longer one (still shorter than the lease) may."""
    changed = Counter(f.kind for f in chaos.faults if f.leader_changed)
    window_s = fence_window_s(chaos.lease_ttl_s)
    outages = [f for f in chaos.faults if f.kind == "etcd_outage"]
    recovery: dict[str, list[float]] = {}
    for f in chaos.faults:
        recovery.setdefault(f.kind, []).append(f.end - f.start + f.recovered_s)
    with watcher.lock:
        seen = len(watcher.leader_changes)
    return {
        "ha": True,
        "leader_changes_by_fault": dict(sorted(changed.items())),
        "leader_changes_seen_by_watcher": seen,
        "etcd_outages_that_changed_leader": changed.get("etcd_outage", 0),
        "etcd_outage_fence_window_s": round(window_s, 2),
        "etcd_outages_within_fence_window": sum(1 for f in outages if f.outage_s < window_s),
        "etcd_outages_within_fence_window_that_changed_leader": sum(
            1 for f in outages if f.outage_s < window_s and f.leader_changed),
        "leader_stops_without_takeover": sum(
            1 for f in chaos.faults if f.kind == "leader_stop" and "NO TAKEOVER" in f.detail),
        "leader_faults_without_leader_change": sum(
            1 for f in chaos.faults
            if f.kind in ("leader_kill_restart", "leader_stop") and not f.leader_changed),
        "fault_to_whole_s_max": {k: round(max(v), 2) for k, v in sorted(recovery.items())},
    }


def print_summary(report: dict[str, Any], log: Any) -> None:
    log("summary:")
    lines = [
        f"  ops: {report['ops_total']} {report['ops']}",
        f"  bytes: written {format_size(report['bytes_written'])}, "
        f"read {format_size(report['bytes_read'])}",
        f"  errors: {report['errors_total']} {report['errors']}",
        f"  faults injected: {report['faults_total']} {report['faults']}",
        f"  corrupt reads: {report['corrupt_reads']}",
        f"  stale reads: {report['stale_reads']} {report['stale_by_kind']}, by cause "
        f"{report['stale_by_cause']}",
        f"  acknowledged objects lost: {report['lost']}",
        f"  keys believed present at the end: {report['keys_believed_present_at_end']} "
        f"(unknown state: {report['keys_unknown_at_end']}, final reads unverified: "
        f"{report['final_reads_unverified']})",
        f"  evicted keys seen: {report['evicted_keys_seen']}, max used "
        f"{report['max_used_fraction']:.0%}, node expiries seen: {report['node_expiries_seen']}",
    ]
    if report.get("ha"):
        lines.append(
            f"  leader changes by fault: {report['leader_changes_by_fault']} (seen by the "
            f"watcher: {report['leader_changes_seen_by_watcher']}; etcd outages that changed "
            f"the leader: {report['etcd_outages_that_changed_leader']}, of them within the "
            f"{report['etcd_outage_fence_window_s']}s fence window: "
            f"{report['etcd_outages_within_fence_window_that_changed_leader']} of "
            f"{report['etcd_outages_within_fence_window']}; leader faults without "
            f"a change: {report['leader_faults_without_leader_change']}; leader stops no standby "
            f"took over: {report['leader_stops_without_takeover']})")
        lines.append(f"  fault start to cluster whole, max by kind (s): "
                     f"{report['fault_to_whole_s_max']}")
    if report["failure"]:
        lines.append(f"  FAILURE: {report['failure']}")
    for detail in report["corrupt_details"][:5]:
        lines.append(f"  corrupt: {detail}")
    for detail in [d for d in report["lost_details"] if d["cause"] == "unexplained"][:5]:
        lines.append(f"  unexplained loss: {detail}")
    if report.get("run_dir"):
        lines.append(f"  logs kept in {report['run_dir']}")
    print("\n".join(lines), flush=True)


# ---- the command ----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cellar soak",
        description="Run random checksummed traffic from several client processes against a "
                    "local cluster while killing, stopping and restarting its nodes and master; "
                    "exit 1 on any corrupt read or unexplained loss (with --ha also when no "
                    "standby took over from a stopped leader, or a short etcd outage deposed it).")
    parser.add_argument("--duration", default="600s", help="how long the load runs (default 600s)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--nodes", type=int, default=3, help="storage nodes (default 3)")
    parser.add_argument("--segment-size", default="256MiB", help="DRAM per node (default 256MiB)")
    parser.add_argument("--chaos-interval", default="5s",
                        help="mean time between faults (default 5s)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--replicas", type=int, default=2, help="replicas per object (default 2)")
    parser.add_argument("--keys", type=int, default=64,
                        help="keys per client (default 64; sized so nothing needs evicting)")
    parser.add_argument("--min-size", default="1KiB", help="smallest value (default 1KiB)")
    parser.add_argument("--max-size", default="2MiB",
                        help="largest value (default 2MiB; sizes are log-uniform)")
    parser.add_argument("--report", default="", help="write the counts as JSON to this file")
    parser.add_argument("--ha", action="store_true",
                        help="etcd + --masters masters; the master faults become leader faults "
                             "(kill -9, SIGSTOP past the lease) and a brief etcd outage")
    parser.add_argument("--masters", type=int, default=2, help="masters with --ha (default 2)")
    parser.add_argument("--tls", action="store_true",
                        help="gRPC and the fast line over TLS (cellar up --tls; needs cryptography)")
    parser.add_argument("--lease-ttl-s", type=int, default=DEFAULT_LEASE_TTL_S,
                        help=f"leader lease with --ha, whole seconds (default {DEFAULT_LEASE_TTL_S})")
    # worker mode (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--master", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--load-until", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--run-id", default="", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        args.min_size = int(args.min_size)
        args.max_size = int(args.max_size)
        return worker_main(args)
    try:
        parse_duration_s(args.duration)
        parse_duration_s(args.chaos_interval)
        parse_size_bytes(args.segment_size)
        min_size, max_size = parse_size_bytes(args.min_size), parse_size_bytes(args.max_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.clients < 1 or args.nodes < 1 or args.keys < 1:
        parser.error("--clients, --nodes and --keys must be at least 1")
    if args.ha and (args.masters < 2 or args.lease_ttl_s < 1):
        parser.error("--ha needs --masters >= 2 (a standby to take over) and --lease-ttl-s >= 1")
    if not 1 <= args.replicas <= args.nodes:
        parser.error("--replicas must be between 1 and --nodes")
    if not HEADER.size + 200 <= min_size <= max_size:
        parser.error(f"need {HEADER.size + 200} <= --min-size <= --max-size")
    return run_soak(args)


if __name__ == "__main__":
    sys.exit(main())
