"""Helpers for the HA fault tests: a real etcd, 2 masters and nodes on 127.0.0.1.

    def test_something():
        with ha_cluster(nodes=3, lease_ttl_s=3) as cluster:
            leader = cluster.leader()            # index into cluster.masters
            cluster.kill_master(leader)          # kill -9
            cluster.etcd.stop(kill=True); cluster.etcd.start()

`ha_cluster` is `LocalCluster(ha=True)` (the class behind `cellar up --ha`); when the test
fails it prints the tail of every log (masters, nodes, etcd). `master_stub(cluster, i)` is a raw
gRPC stub on master i, for grants and redirects. Every wait is a poll with a deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from faultkit import TEST_ADMIN_TOKEN

from cellar.devtools.local_cluster import LocalCluster

LOG_TAIL_LINES = 40


def dump_logs(cluster: LocalCluster) -> None:
    for path in sorted(Path(cluster.run_dir).glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        print(f"---- {path.name} ----")
        print("\n".join(lines))


@contextlib.contextmanager
def ha_cluster(nodes: int = 3, *, lease_ttl_s: int = 3,
               segment_size: str = "64MiB", **master_flags: Any) -> Iterator[LocalCluster]:
    """Start etcd + 2 masters + `nodes` nodes; stop everything afterwards, printing the logs
    if the body raised (a failed assertion included)."""
    cluster = LocalCluster(nodes, segment_size, ha=True, masters=2, lease_ttl_s=lease_ttl_s,
                           cluster_name=f"t{time.monotonic_ns() % 10**9}",
                           master_flags=master_flags, admin_tokens=[TEST_ADMIN_TOKEN])
    try:
        cluster.start()
        yield cluster
    except BaseException:
        dump_logs(cluster)
        raise
    finally:
        cluster.stop()


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 20.0,
               interval_s: float = 0.1) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:g}s waiting for {what} (last: {last!r})")


def status(cluster: LocalCluster, index: int) -> dict[str, Any]:
    return cluster.master_status(index) or {}


def takeover_complete(cluster: LocalCluster, index: int, nodes: int) -> dict[str, Any] | None:
    """Master `index`'s status once it leads and every one of `nodes` nodes re-mounted on it."""
    st = status(cluster, index)
    takeover = st.get("takeover") or {}
    if st.get("role") == "leader" and takeover.get("complete") and len(st.get("segments", [])) >= nodes:
        return st
    return None


def master_stub(cluster: LocalCluster, index: int) -> tuple[grpc.Channel, Any]:
    from cellar.proto import cellar_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(cluster.masters[index].address)
    return channel, pb_grpc.MasterStub(channel)
