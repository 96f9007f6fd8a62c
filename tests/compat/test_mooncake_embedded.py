"""global_segment_size > 0: the store's process contributes memory through an embedded
`cellar node` child. Another client reads the objects while the store is up; after close()
they are gone and the child has exited (the reference's section 4.3 warning, as a test)."""

from __future__ import annotations

import os

from mooncake_helpers import setup_args

from cellar.compat.mooncake import MooncakeDistributedStore

MIB = 1 << 20


def test_embedded_segment_lives_and_dies_with_the_store(make_cluster, connect_to, monkeypatch):
    cluster = make_cluster(nodes=0)  # the embedded node is the only memory in the cluster
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)  # what a node needs to mount
    reader = connect_to(cluster)
    assert reader.status()["capacity_bytes"] == 0

    store = MooncakeDistributedStore()
    assert store.setup(*setup_args(cluster, segment="32 MB")) == 0
    node = store.embedded_node
    assert node is not None and node.alive() and node.segment_bytes == 32 * MIB
    status = reader.status()
    assert status["capacity_bytes"] == 32 * MIB
    assert [n["node_id"] for n in status["nodes"]] == [node.node_id]

    values = {f"emb/{i}": os.urandom(256 << 10) for i in range(8)}
    assert store.put_batch(list(values), list(values.values())) == 0
    for key, value in values.items():
        assert reader.get(key) == value  # another client, reading the store's own memory
    pid = node.pid

    assert store.close() == 0
    assert not node.alive()
    assert not _process_exists(pid)
    assert reader.status()["capacity_bytes"] == 0
    assert reader.get_many(list(values)) == [None] * len(values)


def test_embedded_segment_setup_refusals(make_cluster, monkeypatch):
    cluster = make_cluster(nodes=0)
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)
    store = MooncakeDistributedStore()
    # below the node's 1 MiB minimum: the node refuses its configuration, setup says so
    assert store.setup(*setup_args(cluster, segment="64 KB")) == -600
    assert store.health_check() == 1  # nothing half set up
    assert store.setup(*setup_args(cluster, segment="8MB")) == 0
    store.close()


def test_embedded_node_without_the_cluster_secret_is_refused(make_cluster, monkeypatch, tmp_path):
    cluster = make_cluster(nodes=0)
    monkeypatch.delenv("CELLAR_CLUSTER_SECRET", raising=False)
    monkeypatch.setenv("CELLAR_TOKEN", cluster.token)  # the client itself may connect
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.cellar/cluster-secret either
    store = MooncakeDistributedStore()
    assert store.setup(*setup_args(cluster, segment="8MB")) == -600
    assert not (tmp_path / ".cellar").exists()  # no secret of its own was invented
    assert store.health_check() == 1


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_enable_ssd_offload_mounts_a_disk_tier_under_the_embedded_segment(
        make_cluster, connect_to, monkeypatch, tmp_path):
    """Mooncake's enable_ssd_offload + ssd_offload_path: the embedded node gets a disk tier
    (4 x its segment by default); puts past its DRAM stay readable (demoted or spilled), where
    without it a DRAM-only node would have evicted most of them."""
    cluster = make_cluster(nodes=0, heartbeat_interval_s=0.1, tick_interval_s=0.05)
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)
    monkeypatch.delenv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", raising=False)
    reader = connect_to(cluster)
    store = MooncakeDistributedStore()
    args = setup_args(cluster, segment="8MB")
    assert store.setup(*args, enable_ssd_offload=True, ssd_offload_path=str(tmp_path)) == 0
    try:
        tiers = reader.status()["tiers"]
        assert (tiers["dram"]["capacity_bytes"], tiers["disk"]["capacity_bytes"]) == (8 * MIB, 32 * MIB)
        assert list(tmp_path.glob("*.seg")), "no disk-tier file in ssd_offload_path"
        values = {f"ssd/{i:02d}": os.urandom(MIB) for i in range(24)}  # 3x the DRAM
        for key, value in values.items():
            assert store.put(key, value) == 0
        assert [reader.get(k) for k in values] == list(values.values())
        assert reader.status()["tiers"]["disk"]["objects"] > 0
    finally:
        assert store.close() == 0
