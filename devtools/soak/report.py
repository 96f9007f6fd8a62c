"""The soak's verdict: the workers' counts, each loss and stale read classified, the report.

Loss causes (decided from the fault log and the watcher's facts)
    - evicted: the master's eviction counter (`master_evicted_key_count`) went up between the
      write's acknowledgement and the miss, while the cluster was at least
      EVICTION_EXPLAINS_FROM_USED full (an eviction in a cluster less full than that is itself
      the fault: `make soak-ha` found a new leader emptying its one mounted node at 37% use,
      for 2-replica put-ahead asks it could never place, and counted those losses as evicted);
    - replica_nodes_expired: every node that held a replica was expired (stopped past the
      expiry) in that window; there is no re-replication, so an object that lost one copy to an
      expiry lives on one node until it is rewritten;
    - replica_nodes_killed: every replica's node was expired or killed -9 (a killed node
      restarts with the same id and should re-attach its objects, so this is suspicious and
      listed separately);
    - unexplained: anything else.
    Stale reads (an acknowledged remove or upsert undone) fail a run: removes and upserts are
    durable (cellar.master.serving.removal_log). `classify_stale` names the fault nearest to
    each (an acknowledgement just before a master restart or leader change, during the new
    master's rebuild, or while a replica's node was away), so a failure says where to look.
    With --ha, two more counts fail a run: a leader stopped past its lease that no
    standby replaced while it was stopped, and an etcd outage within the leader's fence window
    (TTL - fence margin - keep-alive interval, ~2.2 s of a 3 s lease) after which a new leader
    serves. A longer outage, even one shorter than the lease, may depose the leader by design
    (it cannot tell that etcd will keep its lease): counted, not a failure.

Also the progress line printed every 10 s and the summary printed at the end.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from cellar.devtools.soak.chaos import Chaos
from cellar.devtools.soak.settings import ERROR_SAMPLES_PER_KIND, MASTER_FLAGS
from cellar.devtools.soak.watcher import Watcher, now_s, stamp
from cellar.units import format_size

EVICTION_EXPLAINS_FROM_USED = 0.5  # used/capacity below which no eviction is expected here

# What each worker's client session counted (worker.py `stats`), summed in the report:
# put_ahead: writes under put-ahead allocations (client/put_ahead.py); one_step_puts: of
# them single puts made as one write and one PutEnd (client/one_put.py); trusted_reads: gets
# read without asking (client/gets.py); one_step_lookups: gets of keys not known made as one
# lookup and one read (client/one_read.py); early_commit_groups: shm COMMIT groups sent while
# their batch still copied (transfer/shm_commits.py).
SESSION_COUNTERS = ("put_ahead", "one_step_puts", "trusted_reads", "one_step_lookups",
                    "early_commit_groups")


def explained_evictions(watcher: Watcher) -> list[tuple[float, float, int, float]]:
    """The evictions the cluster's fill explains (module docstring)."""
    with watcher.lock:
        return [e for e in watcher.evictions if e[3] >= EVICTION_EXPLAINS_FROM_USED]


def classify_loss(loss: dict[str, Any], chaos: Chaos, watcher: Watcher,
                  replicas: int) -> str:
    t0, t1 = loss["ack_time"], loss["detect_time"]
    if any(a <= t1 and b >= t0 for a, b, _n, _used in explained_evictions(watcher)):
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
    """Which fault a read that returned a value older than the acknowledged state follows.
    Each is a failure (the removal log should have prevented it); the cause says what broke.

    - ack_before_master_restart: the acknowledged remove/upsert preceded a master kill -9; the
      node had not heard of the freed range yet (freed notices ride on heartbeat replies, and
      the killed master's outbox is gone) and the new master re-adopted the old value: the
      removal log lost the bound or rebuild did not apply it.
    - ack_during_master_rebuild: the new master acknowledged it while nodes were still
      reporting; a node that reported the same replica later re-created the removed object,
      or (an upsert) reported an older value a tier move had given a higher alloc id
      (found 2026-12-05; a PutEnd the master holds no put for now waits for the whole table,
      master/put_ends.py).
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
    error_samples: dict[str, list[str]] = {}
    stale: list[dict[str, Any]] = []
    corrupt: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    unverified = believed = unknown = 0
    bytes_written = bytes_read = 0
    counted: Counter[str] = Counter()  # SESSION_COUNTERS over all workers
    # per face and per transport (kinds.py): clients, ops and SESSION_COUNTERS
    by_kind: dict[str, dict[str, Counter[str]]] = {"face": {}, "transport": {}}
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
        for kind, samples in data.get("error_samples", {}).items():
            kept = error_samples.setdefault(kind, [])
            for at, message in samples:
                if len(kept) < ERROR_SAMPLES_PER_KIND and not any(message in k for k in kept):
                    kept.append(f"{stamp(at)} {message}")
        stale += data.get("stale_reads", [])
        corrupt += data.get("corrupt_reads", [])
        lost += data.get("lost", [])
        unverified += data.get("unverified", 0)
        believed += data.get("believed_present", 0)
        unknown += data.get("unknown_at_end", 0)
        bytes_written += data.get("bytes_written", 0)
        bytes_read += data.get("bytes_read", 0)
        kinds = [groups.setdefault(str(data.get(dimension, "")), Counter())
                 for dimension, groups in by_kind.items()]
        for kind in kinds:
            kind["clients"] += 1
            kind["ops"] += sum(data["ops"].values())
        for name in SESSION_COUNTERS:
            counted[name] += data.get(name, 0)
            for kind in kinds:
                kind[name] += data.get(name, 0)
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
        "seed": seed, "duration_s": round(now_s() - started, 1),
        "clients": args.clients, "nodes": args.nodes, "replicas": args.replicas,
        "ops_total": sum(ops.values()), "ops": dict(sorted(ops.items())),
        "bytes_written": bytes_written, "bytes_read": bytes_read,
        **{name: counted[name] for name in SESSION_COUNTERS},
        # the same, and clients and ops, per SDK face and per transport of the workers (kinds.py)
        **{f"by_{dimension}": {kind: dict(sorted(c.items())) for kind, c in sorted(groups.items())}
           for dimension, groups in by_kind.items()},
        "errors_total": sum(errors.values()), "errors": dict(sorted(errors.items())),
        "error_samples": dict(sorted(error_samples.items())),  # the first messages of each kind
        "faults_total": len(chaos.faults),
        "faults": dict(sorted(Counter(f.kind for f in chaos.faults).items())),
        "fault_log": [{"kind": f.kind, "target": f.target, "at": stamp(f.start),
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
        # keys evicted while the cluster was under EVICTION_EXPLAINS_FROM_USED full: a failure
        "evicted_below_half_full": watcher.evicted_total - sum(
            e[2] for e in explained_evictions(watcher)),
        "max_used_fraction": round(watcher.max_used_fraction, 3),
        "node_expiries_seen": len(watcher.expiries),
        "repair": watcher.repair_counts(),
        "failure": failure,
        **({"disk_size": args.disk_size, "disk": watcher.disk_counts()}
           if getattr(args, "disk_size", "") else {}),
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
        *(f"    {kind} {dimension}: {c.get('clients', 0)} client(s), {c.get('ops', 0)} ops, "
          f"{c.get('one_step_puts', 0)} one-step puts, {c.get('one_step_lookups', 0)} one-step "
          f"lookups, {c.get('trusted_reads', 0)} trusted reads"
          for dimension in ("face", "transport") for kind, c in report[f"by_{dimension}"].items()),
        f"  bytes: written {format_size(report['bytes_written'])}, "
        f"read {format_size(report['bytes_read'])}",
        f"  errors: {report['errors_total']} {report['errors']}",
        *(f"    {kind}: {message}" for kind, messages in report["error_samples"].items()
          for message in messages),
        f"  faults injected: {report['faults_total']} {report['faults']}",
        f"  corrupt reads: {report['corrupt_reads']}",
        f"  stale reads: {report['stale_reads']} {report['stale_by_kind']}, by cause "
        f"{report['stale_by_cause']}",
        f"  acknowledged objects lost: {report['lost']}",
        f"  keys believed present at the end: {report['keys_believed_present_at_end']} "
        f"(unknown state: {report['keys_unknown_at_end']}, final reads unverified: "
        f"{report['final_reads_unverified']})",
        f"  evicted keys seen: {report['evicted_keys_seen']} (under "
        f"{EVICTION_EXPLAINS_FROM_USED:.0%} full, a failure: {report['evicted_below_half_full']}), "
        f"max used {report['max_used_fraction']:.0%}, node expiries seen: "
        f"{report['node_expiries_seen']}",
        f"  re-replication: {report['repair']}",
    ]
    if "disk" in report:
        lines.append(f"  disk tier ({report['disk_size']} a node): {report['disk']}")
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
