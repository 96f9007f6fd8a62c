"""The metadata bench of `make bench` (bench/worker.py `metadata`) against a real master.

The bench signs the receipts a node would, so its PutEnds must carry what the master checks
(the key tag since receipts name the stored key). When they did not, every put was refused,
the loader threads died with a traceback and the report said "0 keys/s" with no error; a put
refused now fails the step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cellar.bench import worker
from cellar.devtools.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB") as c:
        yield c


def test_the_metadata_bench_puts_and_reads_every_key(cluster: LocalCluster,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", cluster.secret)
    worker.metadata(cluster.address, [300], 64, 0.3, 2, warmup_s=0.1)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_op = {row["op"]: row for row in rows if row["kind"] == "metadata"}
    assert by_op["put"]["keys_per_s"] > 0
    assert by_op["get"]["keys_per_s"] > 0
    assert by_op["get"]["misses"] == 0  # every preloaded key was stored
    assert by_op["get"]["objects_in_table"] >= 300


def test_a_refused_put_fails_the_step(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # A secret the master does not hold: receipts it cannot verify, every PutEnd refused.
    monkeypatch.setenv("CELLAR_CLUSTER_SECRET", "ab" * 32)
    with pytest.raises(RuntimeError, match="puts refused"):
        worker.metadata(cluster.address, [64], 64, 0.1, 1, warmup_s=0.0)
