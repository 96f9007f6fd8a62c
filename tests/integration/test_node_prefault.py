"""A node pre-faults its segments in the background and says when it is done.

Benchmarks wait for that (`LocalCluster.wait_prefaulted`) so their first rows do not measure
the kernel mapping pages; the line must therefore appear once per segment, and the segment's
bytes must be usable meanwhile and after.
"""

from __future__ import annotations

import cellar
from cellar.devtools.local_cluster import PREFAULT_ENDED


def test_every_segment_reports_its_prefault_and_data_survives(make_cluster):
    cluster = make_cluster(2, "64MiB", node_flags={"segments": 2})
    with cellar.connect(cluster.address, timeout_s=30.0) as client:
        client.upsert("before-prefault-ends", b"x" * 70_000)  # may race the pre-fault
        assert cluster.wait_prefaulted(timeout_s=60.0)
        for node in cluster.nodes:
            lines = PREFAULT_ENDED.findall(node.log_path.read_text())
            assert len(lines) == 2, f"{node.name}: {lines}"
        assert client.get("before-prefault-ends") == b"x" * 70_000


def test_wait_prefaulted_times_out_for_a_node_that_never_says_so(make_cluster):
    cluster = make_cluster(1, "32MiB")
    assert cluster.wait_prefaulted(timeout_s=60.0)
    cluster.node_flags["segments"] = 3  # one node cannot have logged three segments
    assert not cluster.wait_prefaulted(timeout_s=0.3)
