"""ReplicateConfig.with_soft_pin reaches the master: soft-pinned objects are evicted only in the
second pass, so when a cluster fills to three times its capacity they outlive unpinned objects
written at the same time."""

from __future__ import annotations

import os

from mooncake_helpers import setup_args

from cellar.compat.mooncake import MooncakeDistributedStore, ReplicateConfig

MIB = 1 << 20
EACH = 8


def test_soft_pinned_objects_outlive_unpinned_ones(make_cluster):
    cluster = make_cluster(nodes=1, segment_size=32 * MIB)
    store = MooncakeDistributedStore()
    assert store.setup(*setup_args(cluster, local_buffer="2MB")) == 0
    soft = ReplicateConfig()
    soft.with_soft_pin = True
    page = os.urandom(MIB)
    pinned = [f"soft/{i}" for i in range(EACH)]
    plain = [f"plain/{i}" for i in range(EACH)]
    for a, b in zip(pinned, plain, strict=True):  # interleaved: the same age
        assert store.put(a, page, soft) == 0
        assert store.put(b, page) == 0
    for i in range(3 * 32):  # three times the capacity, unpinned
        assert store.put(f"fill/{i}", page) == 0
    assert store.batch_is_exist(pinned) == [1] * EACH
    assert all(store.get(k) == page for k in pinned)
    assert sum(store.batch_is_exist(plain)) <= 2  # the same age, no pin: evicted
    store.close()
