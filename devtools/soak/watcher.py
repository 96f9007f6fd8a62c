"""The soak's watcher: a thread that polls the master's HTTP API for the verdict's facts.

What it owns
    Node states (so an expiry is a recorded fact with its time), the eviction counter
    (`master_evicted_key_count`, so an eviction between a write and its miss explains a loss),
    leader changes (epochs), the highest use of capacity and, with a disk tier, its hits and
    moves (demotions, promotions, spills, disk evictions) summed over masters, and re-replication's
    copies, failed copies and the objects short of a replica. With HA it polls whichever master
    serves as leader. Also the wall clock helpers the parent's log lines share (`now_s`,
    `stamp`).

What it must never do
    Block the chaos loop: every request has a bound (`HTTP_TIMEOUT_S`), and a master that does
    not answer is asked again on the next tick.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from typing import Any

from cellar.devtools.soak.settings import HTTP_TIMEOUT_S, WATCH_INTERVAL_S
from cellar.http_fetch import fetch
from cellar.proto.tiers import MOVE_COUNTERS

DISK_COUNTERS = ("hits", *MOVE_COUNTERS)  # the disk row's counters the report sums
# Re-replication's counters (master/repair.py), summed over masters like the disk tier's: a
# copy that keeps failing leaves objects a replica short while every value still reads back
# from the other one (TLS data ports did, until the copier verified them: test_repair.py)
REPAIR_METRICS = {"copies": "master_repair_copies_total",
                  "copy_failures": "master_repair_copy_failures_total"}


def now_s() -> float:
    return time.time()


def stamp(t: float) -> str:
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
        # (from, to, keys evicted, the cluster's used fraction then: the higher of both polls)
        self.evictions: list[tuple[float, float, int, float]] = []
        self.leader_changes: list[tuple[float, int, int]] = []  # (time seen, old, new epoch)
        self.evicted_total = 0
        self.max_used_fraction = 0.0
        self._last_evicted: int | None = None
        self._last_epoch: int | None = None
        self._last_poll = now_s()
        self._last_used_fraction = 0.0
        self._leader_http = ""  # HA: the HTTP address of the master last seen serving as leader
        # The disk tier's counters (disk hits and moves): each master counts from its start,
        # so the run's totals are the last values of each epoch, summed
        self._disk_before: dict[str, int] = {}
        self._disk_now: dict[str, int] = {}
        self._repair_before: dict[str, int] = {}  # the same for re-replication's counters
        self._repair_now: dict[str, int] = {}
        self.under_replicated = 0  # objects short of a replica at the last poll

    def _get_from(self, http: str, path: str) -> bytes:
        return fetch(http, path, timeout_s=HTTP_TIMEOUT_S, ca_file=self.cluster.http_ca)

    @staticmethod
    def _serves(status: dict[str, Any]) -> bool:
        return status.get("role") in ("leader", "single") and status.get("serving", True) is True

    def leader_status(self) -> tuple[str, dict[str, Any]] | None:
        """(HTTP address, /api/v1/status) of the master serving as leader, or None."""
        if not self.cluster.ha:
            http = self.cluster.master_http
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
        now = now_s()
        evicted = _metric(metrics, "master_evicted_key_count")
        epoch = int(status.get("epoch", 0))
        with self.lock:
            used_fraction = status["used"] / status["capacity"] if status.get("capacity") else 0.0
            self.max_used_fraction = max(self.max_used_fraction, used_fraction)
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
                self.evictions.append((self._last_poll, now, delta,
                                       max(used_fraction, self._last_used_fraction)))
                self.evicted_total += delta
            disk = (status.get("tiers") or {}).get("disk")
            if disk is not None:
                self._disk_now = _carried(self._disk_before, self._disk_now,
                                          epoch != self._last_epoch,
                                          {name: int(disk.get(name, 0)) for name in DISK_COUNTERS})
            self._repair_now = _carried(self._repair_before, self._repair_now,
                                        epoch != self._last_epoch,
                                        {name: _metric(metrics, metric)
                                         for name, metric in REPAIR_METRICS.items()})
            self.under_replicated = _metric(metrics, "master_objects_under_replicated")
            self._last_evicted, self._last_epoch, self._last_poll = evicted, epoch, now
            self._last_used_fraction = used_fraction

    def disk_counts(self) -> dict[str, int]:
        """The disk tier's hits and moves over the run (every master's), {} without one."""
        with self.lock:
            names = self._disk_before.keys() | self._disk_now.keys()
            return {name: self._disk_before.get(name, 0) + self._disk_now.get(name, 0)
                    for name in DISK_COUNTERS if name in names}

    def repair_counts(self) -> dict[str, int]:
        """Re-replication over the run (every master's copies and failed copies) and the
        objects short of a replica at the last poll."""
        with self.lock:
            counts = {name: self._repair_before.get(name, 0) + self._repair_now.get(name, 0)
                      for name in REPAIR_METRICS}
            counts["under_replicated_last_seen"] = self.under_replicated
            return counts

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


def _metric(text: str, name: str) -> int:
    """A counter or gauge of the master's /metrics text (0 when absent)."""
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


def _carried(before: dict[str, int], now: dict[str, int], new_master: bool,
             values: dict[str, int]) -> dict[str, int]:
    """`values` as the current master's counts; a new master counts from 0, so the last
    counts of the one before are added to `before` first."""
    if new_master:
        for name, count in now.items():
            before[name] = before.get(name, 0) + count
    return values
