"""The soak in its short form: 45 s of random checksummed traffic from 4 client processes while
the chaos loop injects faults (`make soak` / `make soak-ha` run 10 minutes). It must end with
no corrupt read, no stale read (an acknowledged remove or upsert undone: the removal log makes
them durable; the report lists any by cause), no unexplained loss and no eviction while the
cluster is under half full (exit 0), having injected
faults of several kinds and done real work. Half its writes are of one size (an engine's
page), so puts also go under put-ahead allocations through every fault, and gets of keys read
moments before are read without asking the master (trusted reads) (docs/sdk.md). The four
clients are the four kinds: the plain and the asyncio face, each over shared memory and over
tcp; a fifth of their steps are batched (get_many, get_many_into with a prefetch's budget
and prefix, put_many, remove_many).

- single master: kills, stops and restarts nodes and the master;
- `--ha` (etcd + 2 masters + 3 nodes): also kills -9 and SIGSTOPs the leader (past its lease)
  and briefly takes etcd away; every leader fault must be followed by a new leader, and no etcd
  outage within the leader's fence window may change the leader;
- `--disk-size` (`make soak-disk`): a disk tier under each node's small DRAM; the same
  verdict (with disk room, an eviction is a failure), and the disk must have taken spills,
  demotions and reads. It found two faults of the disk tier: 2-replica puts evicted instead
  of spilling, and an old value moved to disk while an upsert was written came back over it
  after a master kill (docs/disk-tier.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK_S = 45  # each variant (make test's budget); make soak, soak-ha and soak-disk run 10 minutes
MIN_OPS = 200          # ~10^4 on an idle 2-core machine; this only proves traffic flowed
MIN_FAULT_KINDS = 3    # ~8 faults in 45 s over 4-5 kinds; a loaded machine injects fewer


# `make soak-disk` in short: every node 16 MiB of DRAM over a 256 MiB disk tier, about twice
# all DRAM live, so puts spill and objects demote and promote through the faults
DISK_FLAGS = ("--segment-size", "16MiB", "--disk-size", "256MiB")


@pytest.mark.parametrize("variant", ["single", "ha", "disk"])
@pytest.mark.timeout(SOAK_S + 300)
def test_soak_short(tmp_path: Path, variant: str) -> None:
    ha, disk = variant == "ha", variant == "disk"
    report_path = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cellar", "soak", *(["--ha"] if ha else []),
         *(DISK_FLAGS if disk else ()), "--duration", f"{SOAK_S}s",
         "--clients", "4", "--nodes", "3", "--report", str(report_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=SOAK_S + 280, check=False)
    output = proc.stdout.decode(errors="replace")
    print(output[-6000:])
    assert report_path.exists(), "the soak wrote no report"
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0, f"soak failed: {report.get('failure')!r}, corrupt " \
        f"{report['corrupt_reads']}, stale {report['stale_by_cause']}, lost {report['lost']}"
    assert report["corrupt_reads"] == 0
    assert report["stale_reads"] == 0, (report["stale_by_cause"], report["stale_details"][:10])
    assert report["ops"].get("remove", 0) > 0 and report["ops"].get("upsert", 0) > 0
    assert report["ops"].get("put_over", 0) > 0  # refused puts of present keys, checked after
    # batched operations, each key judged as its single operation would be (worker.py)
    assert all(report["ops"].get(op, 0) > 0 for op in (
        "get_many", "get_many_into", "put_many", "upsert_many", "remove_many")), report["ops"]
    assert report["put_ahead"] > 0, "no write went under a put-ahead allocation"
    assert report["one_step_puts"] > 0, "no single put was one write and one PutEnd"
    assert report["trusted_reads"] > 0, "no get was read without asking (client/gets.py)"
    assert report["one_step_lookups"] > 0, "no get was one lookup and one read (one_read.py)"
    # both SDK faces and both transports ran under the faults (devtools/soak/kinds.py: the
    # four clients are sync and async over shared memory and over tcp), each kind through its
    # own one-step put and get paths
    for dimension, kinds in (("face", {"sync", "async"}), ("transport", {"auto", "tcp"})):
        counted_by_kind = report[f"by_{dimension}"]
        assert set(counted_by_kind) == kinds, counted_by_kind
        for kind, counted in counted_by_kind.items():
            assert counted["clients"] == 2 and counted["ops"] > MIN_OPS // 4, (kind, counted)
            assert counted["one_step_puts"] > 0 and counted["one_step_lookups"] > 0, (kind, counted)
    assert report["lost"]["unexplained"] == 0
    # 3 nodes of 256 MiB stay under half full: an eviction is a fault (make soak-ha found a new
    # leader emptying its one mounted node for 2-replica put-ahead asks it could not place)
    assert report["evicted_below_half_full"] == 0, report["max_used_fraction"]
    assert len(report["faults"]) >= MIN_FAULT_KINDS, report["faults"]
    if disk:  # the disk tier took part: replicas spilled to it and objects moved both ways
        assert report["disk"]["spills"] > 0 and report["disk"]["demotions"] > 0, report["disk"]
        assert report["disk"]["hits"] > 0, report["disk"]
    assert report["ops_total"] > MIN_OPS, report["ops"]
    # each error kind a worker raised comes with its first messages, so a run says why
    assert set(report["error_samples"]) <= set(report["errors"]), report["error_samples"]
    assert all(1 <= len(messages) <= 3 for messages in report["error_samples"].values())
    if ha:
        assert report["ha"] is True
        assert report["leader_faults_without_leader_change"] == 0, report["fault_log"]
        assert report["leader_stops_without_takeover"] == 0, report["fault_log"]
        # an outage longer than the leader's fence window (TTL - margin - keep-alive
        # interval, ~2.2 s of the 3 s lease) may depose it by design; a shorter one must not
        assert report["etcd_outages_within_fence_window_that_changed_leader"] == 0, \
            report["fault_log"]
