"""Shared fixtures for integration tests: real clusters of real processes on 127.0.0.1.

    def test_something(make_cluster):
        cluster = make_cluster(nodes=3, segment_size="64MiB", node_expire_after_s=5)
        with cellar.connect(cluster.address) as client:
            ...

`make_cluster(nodes=3, segment_size="64MiB", *, node_flags=None, **master_flags)` starts a
`cellar.devtools.local_cluster.LocalCluster` (the same class behind `cellar up`): master flags are
passed as `--name-with-dashes VALUE`. Every cluster a test starts is stopped when the test
ends, pass or fail; a failing test prints the tail of every child's log. `module_cluster` is
the same factory with module scope, for suites that share one cluster across tests.
`connect_to(cluster, **kwargs)` opens a client that is closed at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import FACE_TRANSPORT_IDS, FACE_TRANSPORTS, tenant_clients

ClusterFactory = Callable[..., LocalCluster]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.stash.setdefault(_FAILED, True)


_FAILED = pytest.StashKey[bool]()


def _print_logs(cluster: LocalCluster) -> None:
    for path in sorted(Path(cluster.run_dir).glob("*.log")):
        try:
            lines = path.read_text(errors="replace").splitlines()[-30:]
        except OSError:
            continue
        print(f"---- {path.name} (last {len(lines)} lines) ----")
        print("\n".join(lines))


class _Factory:
    def __init__(self) -> None:
        self.clusters: list[LocalCluster] = []

    def __call__(self, nodes: int = 3, segment_size: str | int = "64MiB", *,
                 node_flags: dict[str, Any] | None = None, **master_flags: Any) -> LocalCluster:
        cluster = LocalCluster(nodes, segment_size, master_flags=master_flags,
                               node_flags=node_flags)
        self.clusters.append(cluster)
        cluster.start()
        return cluster

    def stop_all(self, failed: bool) -> None:
        for cluster in self.clusters:
            if failed:
                _print_logs(cluster)
            cluster.stop()


@pytest.fixture
def make_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterFactory]:
    """Start clusters for one test; all are stopped when it ends."""
    factory = _Factory()
    try:
        yield factory
    finally:
        factory.stop_all(request.node.stash.get(_FAILED, False))


@pytest.fixture(scope="module")
def module_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterFactory]:
    """Start clusters shared by one test module; stopped after its last test."""
    factory = _Factory()
    try:
        yield factory
    finally:
        failed = request.session.testsfailed > 0
        factory.stop_all(failed)


@pytest.fixture
def connect_to() -> Iterator[Callable[..., cellar.Client]]:
    """`connect_to(cluster, **connect_kwargs)`: a client closed when the test ends."""
    clients: list[cellar.Client] = []

    def factory(cluster: LocalCluster, **kwargs: Any) -> cellar.Client:
        kwargs.setdefault("timeout_s", 30.0)
        client = cellar.connect(cluster.address, **kwargs)
        clients.append(client)
        return client

    try:
        yield factory
    finally:
        for client in clients:
            client.close()


@pytest.fixture(params=FACE_TRANSPORTS, ids=FACE_TRANSPORT_IDS)
def tenant_client(request: pytest.FixtureRequest, cluster: LocalCluster) -> Iterator[Any]:
    """`tenant_client(tenant)`: a client of the module's `cluster` fixture with that tenant's
    token, on every face over every transport; closed when the test ends."""
    with tenant_clients(*request.param, cluster) as factory:
        yield factory
