"""Fixtures for the Mooncake-compatibility tests: real clusters (the integration fixtures) and
stores set up against them, closed when the test ends.

    def test_x(mc_cluster, new_store):
        store = new_store()                  # setup() against mc_cluster, returns 0 or fails
        assert store.put("k", b"v") == 0

`Buffers` hands out ctypes buffers (real process memory, as an engine's host pool) and keeps
them alive for the test.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cellar.compat.mooncake import MooncakeDistributedStore
from cellar.local_cluster import LocalCluster
from tests.integration.conftest import (  # noqa: F401  (fixtures re-exported for this folder)
    connect_to,
    make_cluster,
    module_cluster,
    pytest_runtest_makereport,
)

MIB = 1 << 20


@pytest.fixture(scope="module")
def mc_cluster(module_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    """One master and two 64 MiB nodes shared by a test module."""
    return module_cluster(nodes=2, segment_size=64 * MIB)


def setup_args(cluster: LocalCluster, *, segment: Any = 0, local_buffer: Any = "16MB",
               protocol: str = "tcp") -> tuple[Any, ...]:
    """Mooncake's seven positional setup arguments for `cluster`."""
    return ("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, protocol, "", cluster.address)


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


class Buffers:
    """ctypes buffers kept alive for one test; `.ptr(buf)` is the address Mooncake takes."""

    def __init__(self) -> None:
        self._keep: list[Any] = []

    def make(self, nbytes: int, fill: bytes | None = None) -> Any:
        buf = (ctypes.c_ubyte * nbytes)()
        if fill is not None:
            ctypes.memmove(buf, fill, min(nbytes, len(fill)))
        self._keep.append(buf)
        return buf

    @staticmethod
    def ptr(buf: Any) -> int:
        return ctypes.addressof(buf)

    @staticmethod
    def read(buf: Any, nbytes: int | None = None, offset: int = 0) -> bytes:
        data = bytes(buf)
        return data[offset:] if nbytes is None else data[offset:offset + nbytes]


@pytest.fixture
def buffers() -> Buffers:
    return Buffers()
