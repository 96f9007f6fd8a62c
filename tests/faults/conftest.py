"""The `fault_cluster` fixture (see faultkit.py): clusters are stopped when a test ends, and a
failing test prints the tail of every process log (restarted processes' logs included)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultkit import FAST, FaultCluster

from cellar.devtools.local_cluster import LocalCluster


@pytest.fixture
def fault_cluster(request: pytest.FixtureRequest) -> Iterator[Callable[..., FaultCluster]]:
    clusters: list[FaultCluster] = []

    def factory(nodes: int = 2, segment_size: str = "64MiB", *,
                node_flags: dict[str, Any] | None = None, **master_flags: Any) -> FaultCluster:
        flags = {**FAST, **master_flags}
        cluster = FaultCluster(nodes, segment_size, master_flags=flags, node_flags=node_flags)
        clusters.append(cluster)
        cluster.start()
        return cluster

    broken: list[str] = []
    try:
        yield factory
    finally:
        for cluster in clusters:
            for child in [cluster.master, *cluster.nodes]:
                if child is not None and child.proc is not None and child.alive():
                    child.proc.send_signal(signal.SIGCONT)
            if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
                _print_logs(cluster)
            elif cluster.master is not None and cluster.master.alive():
                try:  # the master's tables stayed consistent through the faults (state/audit.py)
                    cluster.check_master_invariants()
                except AssertionError as exc:
                    broken.append(str(exc))
            cluster.stop()
    assert broken == []


def _print_logs(cluster: LocalCluster) -> None:
    for path in sorted(Path(cluster.run_dir).glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()[-40:]
        print(f"---- {path.name} ----")
        print("\n".join(lines))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
