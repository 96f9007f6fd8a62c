"""The soak watcher's bookkeeping (devtools/soak/watcher.py) over canned master answers: the
re-replication counters summed over masters (each counts from its own start), the objects
short of a replica at the last poll, and the eviction counter read the same way."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cellar.devtools.soak.watcher import Watcher, _metric


def metrics(copies: int, failures: int, under: int, evicted: int = 0) -> str:
    return (f"# HELP master_repair_copies_total copies\n"
            f"master_repair_copies_total {copies}.0\n"
            f"master_repair_copies_created 1.7e9\n"
            f"master_repair_copy_failures_total {failures}.0\n"
            f'master_auth_refusals_total{{reason="bad_token"}} 3.0\n'
            f"master_objects_under_replicated {under}\n"
            f"master_evicted_key_count {evicted}\n")


def answering(epoch: int, text: str) -> Watcher:
    watcher = Watcher(SimpleNamespace(ha=False, master_http="127.0.0.1:1", http_ca=None))
    status = {"role": "single", "epoch": epoch, "used": 1, "capacity": 4, "segments": []}
    watcher._get_from = lambda http, path: (  # type: ignore[method-assign]
        json.dumps(status).encode() if path == "/api/v1/status" else text.encode())
    return watcher


def test_metrics_are_read_with_or_without_labels_and_absent_ones_are_zero():
    text = metrics(7, 2, 5)
    assert _metric(text, "master_repair_copies_total") == 7
    assert _metric(text, "master_auth_refusals_total") == 3
    assert _metric(text, "master_objects_under_replicated") == 5
    assert _metric(text, "master_nothing_total") == 0


def test_repair_counts_add_up_over_a_master_change():
    watcher = answering(1, metrics(10, 4, 3))
    watcher.poll()
    watcher._get_from = answering(1, metrics(25, 6, 0)).__dict__["_get_from"]
    watcher.poll()
    assert watcher.repair_counts() == {"copies": 25, "copy_failures": 6,
                                       "under_replicated_last_seen": 0}
    # a new master (another epoch) counts from 0: the old one's last counts are kept
    watcher._get_from = answering(2, metrics(3, 1, 2, evicted=4)).__dict__["_get_from"]
    watcher.poll()
    assert watcher.repair_counts() == {"copies": 28, "copy_failures": 7,
                                       "under_replicated_last_seen": 2}
    assert watcher.evicted_total == 4 and watcher.leader_changes[0][1:] == (1, 2)
