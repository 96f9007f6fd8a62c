"""Placement at a cluster's start: two fresh nodes (started a moment apart, as `cellar up` does)
share 300 puts made right after the cluster is up, each holding 40-60% of them. The new-node
ramp (`new_node_ramp_s`, 10 s by default) is for a newcomer joining nodes that already hold
data (tests/unit/test_master_removal_log.py checks that it still ramps); before this, the first
node to mount took every one of the 300."""

from __future__ import annotations

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.errors import Status

PUTS = 300


@pytest.mark.timeout(120)
def test_two_fresh_nodes_share_the_first_puts() -> None:
    with LocalCluster(2, "32MiB") as cluster, cellar.connect(cluster.address, timeout_s=20) as client:
        values = {f"start/{i}": bytes([i % 251]) * 4096 for i in range(PUTS)}
        assert client.put_many(values) == [Status.OK] * PUTS
        held = {s["node_id"]: s["object_count"] for s in client.status()["segments"]}
    assert len(held) == 2 and sum(held.values()) == PUTS, held
    for node_id, count in held.items():
        assert 0.4 * PUTS <= count <= 0.6 * PUTS, f"{node_id} holds {count} of {PUTS}: {held}"
