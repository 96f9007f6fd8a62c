"""Rank rules and sharing across instances, each rank or instance a process of its own:
tp 2 with MHA (every rank stores its own heads under its rank's keys) and MLA (one rank-less
object per page, written by the storage-writer rank only, read by every rank); a second
instance prefetches what the first wrote; another model or KV dtype prefetches nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_harness import Engine, Shape

import cellar
from cellar.devtools.ports import free_port

WORKER = Path(__file__).with_name("sglang_worker.py")
WORKER_TIMEOUT_S = 240


def run_ranks(address: str, model: str, shape: dict[str, Any], steps: list[dict[str, Any]],
              world_size: int) -> list[list[dict[str, Any]]]:
    """Run `steps` on `world_size` ranks (one process each, one gloo group); their results."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        spec = {"address": address, "model": model, "shape": shape, "steps": steps,
                "rank": rank, "world_size": world_size, "port": port}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=dict(os.environ)))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=WORKER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, f"worker failed:\n{err[-3000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_mha_tp2_each_rank_stores_and_prefetches_its_own_heads(cluster) -> None:
    pages, seed = 10, 21
    steps = [{"op": "backup", "pages": pages, "seed": seed}, {"op": "wipe"},
             {"op": "prefetch", "pages": pages, "seed": seed},
             {"op": "keys", "pages": pages, "seed": seed}]
    r0, r1 = run_ranks(cluster.address, "tp2-mha", {"layout": "page_first"}, steps, 2)
    for res in (r0, r1):
        assert res[0]["tokens"] == pages * 16
        assert res[2] == {"hit": pages, "completed": pages, "exact": pages}
    k0, k1 = r0[3]["keys"], r1[3]["keys"]
    assert all(".r0" in k for k in k0) and all(".r1" in k for k in k1)
    with cellar.connect(cluster.address) as c:
        assert all(c.exists_many(k0 + k1))


def test_mla_tp2_one_writer_rankless_objects_read_by_every_rank(cluster) -> None:
    pages, seed = 10, 22
    steps = [{"op": "backup", "pages": pages, "seed": seed}, {"op": "wipe"},
             {"op": "prefetch", "pages": pages, "seed": seed},
             {"op": "keys", "pages": pages, "seed": seed}]
    r0, r1 = run_ranks(cluster.address, "tp2-mla", {"layout": "layer_first", "mla": True},
                       steps, 2)
    assert (r0[0]["tokens"], r1[0]["tokens"]) == (pages * 16, 0)  # rank 1 never writes
    for res in (r0, r1):
        assert res[2] == {"hit": pages, "completed": pages, "exact": pages}
    # One object per page, the same key on both ranks, no rank in it.
    assert r0[3]["keys"] == r1[3]["keys"] and len(r0[3]["keys"]) == pages
    assert all(k.endswith(".kv") and ".r" not in k.rsplit("/", 1)[1] for k in r0[3]["keys"])


def test_second_instance_prefetches_what_the_first_wrote(cluster) -> None:
    pages, seed = 9, 23
    writer = Engine(cluster.address, model="shared", shape=Shape(layout="page_first_direct"))
    try:
        assert writer.backup(pages, seed) == pages * 16
    finally:
        writer.close()
    (res,) = run_ranks(cluster.address, "shared", {"layout": "page_first_direct"},
                       [{"op": "prefetch", "pages": pages, "seed": seed}], 1)
    assert res[0] == {"hit": pages, "completed": pages, "exact": pages}


@pytest.mark.parametrize("other", [{"model": "other-model"}, {"dtype": "float16"},
                                   {"layout": "layer_first"}],
                         ids=["model", "dtype", "layout"])
def test_another_format_prefetches_nothing(cluster, other: dict[str, str]) -> None:
    pages, seed = 6, 24
    writer = Engine(cluster.address, model="fmt", shape=Shape(layout="page_first"))
    try:
        assert writer.backup(pages, seed) == pages * 16
        same = writer.prefetch(pages, seed)
        assert same.completed_pages == pages  # the writer's own format does hit
    finally:
        writer.close()
    shape = Shape(layout=other.get("layout", "page_first"), dtype=other.get("dtype", "bfloat16"))
    reader = Engine(cluster.address, model=other.get("model", "fmt"), shape=shape)
    try:
        got = reader.prefetch(pages, seed)
        assert (got.hit_pages, got.completed_pages) == (0, 0)
    finally:
        reader.close()
