"""A master killed while its demotions wait on the node: no old move lands in a new value.

One node (64 MiB DRAM, 512 MiB disk) whose tier moves each take MOVE_DELAY_S (a slow disk,
tests/faults/slow_node/sitecustomize.py). Puts push DRAM past its watermark, so master A
orders demotions, which queue on the node; A is killed with -9 and started again (master B).
The node mounts B and reports its index, in which the queued moves' targets are not: B treats
those disk ranges as free, and the next puts, which find DRAM full, spill into them and are
acknowledged (B demotes nothing, so its own moves do not take those ranges first). Every
acknowledged value must read back byte-exact. On the mover before 2026-12-06 the old moves
ran after the remount and pwrote the old objects over the spilled values (one read failed its
checksum), then the mover thread died on the seal's WriteRefused (no move ran again).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from faultkit import FaultCluster, node_status

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.errors import IntegrityError, Status
from tests.support.http import master_metric

MIB = 1 << 20
MOVE_DELAY_S = 0.5  # each tier move's wait on the node: ~25 demotions queue for ~12 s
FIRST, SECOND = 60, 40  # 1 MiB values before and after the master restart (DRAM: 64 MiB)
SLOW_NODE = Path(__file__).resolve().parent / "slow_node"
MASTER_FLAGS = {"heartbeat_interval_s": 0.1, "tick_interval_s": 0.05,
                "node_suspect_after_s": 5, "node_expire_after_s": 30}


def _eventually(predicate, timeout_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait(what: str, predicate, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    assert _eventually(predicate, timeout_s), f"{what}: not reached in {timeout_s} s"


def _node_moves(cluster: LocalCluster) -> dict[str, int]:
    """Node 0's `disk_tier` status block (moved, failed, queued, ...), for the report."""
    return dict(node_status(cluster, 0).get("disk_tier") or {})


def _values(prefix: str, count: int, seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}/{i:03d}": rng.integers(0, 256, MIB, dtype=np.uint8).tobytes()
            for i in range(count)}


def _put(client: cellar.Client, values: dict[str, bytes], timeout_s: float = 30.0) -> None:
    """Put every value, 8 a batch; a batch refused while the master rebuilds is put again."""
    keys = list(values)
    deadline = time.monotonic() + timeout_s
    for start in range(0, len(keys), 8):
        batch = {k: values[k] for k in keys[start:start + 8]}
        while (statuses := client.put_many(batch)) != [Status.OK] * len(batch):
            assert set(statuses) <= {Status.OK, Status.UNAVAILABLE}, statuses
            assert time.monotonic() < deadline, f"puts refused for {timeout_s} s: {statuses}"
            batch = {k: v for (k, v), st in zip(batch.items(), statuses, strict=True)
                     if st != Status.OK}
            time.sleep(0.1)


@pytest.mark.timeout(240)
def test_demotions_queued_for_a_killed_master_never_overwrite_acknowledged_values(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    path = os.pathsep.join(p for p in (str(SLOW_NODE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "CELLAR_TEST_MOVE_DELAY_S": str(MOVE_DELAY_S)}
    cluster = FaultCluster(1, 64 * MIB, master_flags=MASTER_FLAGS, env=env,
                           node_flags={"disk_dir": str(disk), "disk_size": 512 * MIB,
                                       "http": "127.0.0.1:0"})
    try:
        cluster.start()
        first = _values("a", FIRST, 1)
        with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
            _put(client, first)
        _wait("a backlog of demotions on the node",
              lambda: _node_moves(cluster).get("queued", 0) >= 10)
        at_restart = _node_moves(cluster)
        # Master B demotes nothing (else its own demotions would take the free disk ranges
        # first, and their copies, queued behind the old ones, would hide the damage): the
        # puts below, which find DRAM full, spill into the lowest free disk ranges, the very
        # targets of A's moves still queued on the node.
        cluster.master_flags.update(demote_high_watermark=0.99, demote_low_watermark=0.98)
        cluster.restart_master()  # kill -9; the node mounts the new master, its moves queued
        second = _values("b", SECOND, 2)
        with cellar.connect(cluster.address, timeout_s=30, transport="tcp") as client:
            _put(client, second)
            spilled = master_metric(cluster, "master_tier_spills")
            # let the node's mover reach every move it still holds (old ones, on the old code)
            time.sleep(30 * MOVE_DELAY_S)
            drained = _eventually(lambda: master_metric(cluster, "master_tier_moves_pending") == 0)
            wrong = []
            for key, value in {**first, **second}.items():
                try:
                    got = client.get(key)
                except IntegrityError:  # what the old moves left: other bytes
                    wrong.append(f"{key} (checksum mismatch)")
                    continue
                if got != value:
                    wrong.append(key if got is None else f"{key} (other bytes)")
        print(f"\nnode's moves at the restart: {at_restart}, at the end: {_node_moves(cluster)}; "
              f"{spilled:.0f} puts spilled to disk after the restart; wrong: {wrong}")
        assert spilled > 0, "no put spilled into the disk ranges the old moves targeted"
        assert wrong == []
        assert drained, "the moves were never reported (the mover died?)"
        cluster.check_master_invariants()
    finally:
        cluster.stop()
