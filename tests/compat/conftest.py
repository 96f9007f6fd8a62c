"""Fixtures for the Mooncake-compatibility tests: real clusters (the integration fixtures) and
stores set up against them, closed when the test ends.

    def test_x(mc_cluster, new_store):
        store = new_store()                  # setup() against mc_cluster, returns 0 or fails
        assert store.put("k", b"v") == 0

`Buffers` hands out ctypes buffers (real process memory, as an engine's host pool) and keeps
them alive for the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mooncake_helpers import Buffers, setup_args

from cellar.compat.mooncake import MooncakeDistributedStore
from cellar.devtools.local_cluster import LocalCluster
from tests.integration.conftest import (  # noqa: F401  (fixtures re-exported for this folder)
    connect_to,
    make_cluster,
    module_cluster,
    pytest_runtest_makereport,
)

MIB = 1 << 20


@pytest.fixture(scope="module")
def mc_cluster(module_cluster: Callable[..., LocalCluster]) -> LocalCluster:  # noqa: F811
    """One master and two 64 MiB nodes shared by a test module; any tenant name is
    accepted (OTHER_TENANT is the second one the tests use)."""
    return module_cluster(nodes=2, segment_size=64 * MIB,
                          allow_unknown_tenants="true")


@pytest.fixture
def new_store(mc_cluster: LocalCluster) -> Iterator[Callable[..., MooncakeDistributedStore]]:
    stores: list[MooncakeDistributedStore] = []

    def factory(**kwargs: Any) -> MooncakeDistributedStore:
        store = MooncakeDistributedStore()
        stores.append(store)
        assert store.setup(*setup_args(mc_cluster, **kwargs)) == 0
        return store

    try:
        yield factory
    finally:
        for store in stores:
            store.close()


@pytest.fixture
def buffers() -> Buffers:
    return Buffers()
