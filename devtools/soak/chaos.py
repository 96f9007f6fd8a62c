"""The soak's chaos loop: one fault at a time, each kind in turn, recorded with its window.

What it owns
    `Chaos.inject` picks the next kind (each kind once per round, in random order) and runs it:
    kill -9 + restart a node, SIGSTOP a node past its expiry, kill -9 + restart the master,
    SIGSTOP the master. With `--ha` (etcd + 2 masters) the master faults become leader faults:
    kill -9 the current leader (wait for the standby to take over, then restart the old one,
    which comes back as a standby), SIGSTOP the leader past its lease (the standby takes over;
    SIGCONT, and the old leader must step down), and a brief etcd outage shorter than the lease
    (SIGSTOP/SIGCONT of etcd, or stop + restart; the leader should keep leading). Each fault
    (`Fault`) records the serving leader's epoch before and after it, so a leader change is a
    fact of the fault log, not an assumption. `wait_whole` brings the cluster back whole before
    the final pass; `dropping_events` lists the windows in which a node's objects may have gone.

What it must never do
    Run more than one fault at a time, wait without a bound, or leave a process stopped.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from typing import Any

from cellar.devtools.soak.settings import (
    ETCD_OUTAGE_MAX_FRACTION,
    FAULT_KINDS,
    HA_FAULT_KINDS,
    LEADER_STOP_ALLOWANCE_S,
    LEADER_WAIT_S,
    RECOVERY_TIMEOUT_S,
    WATCH_INTERVAL_S,
)
from cellar.devtools.soak.watcher import Watcher, now_s


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
        t0 = now_s()
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
        fault.end = now_s()
        self.faults.append(fault)
        self.wait_whole()
        fault.recovered_s = now_s() - fault.end
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
        took_over_s = now_s() - t0
        self.cluster.start_master(old)
        role = self._role_of(old)
        self.log(f"  {self.cluster.masters[new].name} leads {took_over_s:.1f}s after the kill; "
                 f"{name} restarted as {role or '?'}")
        return Fault("leader_kill_restart", name, t0,
                     detail=f"kill -9, {self.cluster.masters[new].name} led after "
                            f"{took_over_s:.1f}s, restarted as {role or '?'}")

    def _leader_stop(self, t0: float) -> Fault:
        """SIGSTOP the leader past its lease (and LEADER_STOP_ALLOWANCE_S for etcd's revoke and
        the standby's campaign), then SIGCONT it. A standby must take over while it is stopped
        (watched here, since the thawed master may win the next election itself and the epochs
        alone would not tell); if none did, the fault says NO TAKEOVER."""
        old = self.cluster.leader()
        name = self.cluster.masters[old].name
        stop_s = LEADER_STOP_ALLOWANCE_S + self.rng.uniform(1.5 * self.lease_ttl_s,
                                                            2.5 * self.lease_ttl_s)
        self.log(f"fault: SIGSTOP the leader {name} for {stop_s:.1f}s (lease {self.lease_ttl_s:g}s)")
        self.cluster.signal_master(signal.SIGSTOP, old)
        taker, took_over_s = "", 0.0
        try:
            until = time.monotonic() + stop_s
            while time.monotonic() < until:
                for i in range(len(self.cluster.masters)):
                    if not taker and i != old and self._role_of(i) == "leader":
                        taker, took_over_s = self.cluster.masters[i].name, now_s() - t0
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
        outage_s = now_s() - t0
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
