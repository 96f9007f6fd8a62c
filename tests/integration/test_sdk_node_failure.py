"""kill -9 one storage node under a live client.

- Right after the kill (the master still believes the node alive): every object with a replica
  on another node reads back exactly; objects whose only replica died read as a miss or raise
  Unavailable, never wrong bytes; new puts succeed (the SDK retries them on other nodes).
- After the master expires the node: the same holds, and puts keep working on the survivors.
Where each single-copy object lived is asked of the master before the kill: only those on the
killed node may miss, and the test checks that some did and some did not.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import cellar
from cellar.errors import Status
from tests.support.faces import FACES, connect_face
from tests.support.placement import allowed_misses, evicted_keys, replica_nodes

KIB = 1 << 10


def payload(seed: int, size: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def make_values(prefix: str, count: int, seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}/{i}": payload(seed * 100_000 + i, int(rng.integers(1, 256 * KIB)))
            for i in range(count)}


def check_readable(client: cellar.Client, values: dict[str, bytes]) -> None:
    keys = list(values)
    for k in keys[::2]:
        assert client.get(k) == values[k], k
    assert client.get_many(keys) == [values[k] for k in keys]


def check_single_copies(client: cellar.Client, values: dict[str, bytes], may_miss: set[str]) -> int:
    """Objects with one copy: right bytes, or (only those whose copy was on the dead node) a
    clean miss. Returns how many read back."""
    readable = 0
    for k, v in values.items():
        try:
            got = client.get(k)
        except (cellar.Unavailable, cellar.NotFound):
            assert k in may_miss, f"{k} lived on a surviving node and is lost"
            continue
        assert got == v, k
        readable += 1
    for k, got in zip(values, client.get_many(list(values)), strict=True):
        assert got == values[k] or (got is None and k in may_miss), k
    return readable


def put_and_check(client: cellar.Client, prefix: str, seed: int) -> None:
    fresh = make_values(prefix, 60, seed)
    items = list(fresh.items())
    for k, v in items[:20]:
        client.put(k, v)                        # replicas=1: any live node
    assert client.put_many(items[20:40], replicas=2) == [Status.OK] * 20
    for k, v in items[40:]:
        client.put(k, v, replicas=2)
    check_readable(client, fresh)


@pytest.fixture(params=FACES)
def face(request):
    return request.param


@pytest.mark.timeout(120)
def test_kill_9_one_node(make_cluster, face):
    cluster = make_cluster(nodes=3, segment_size="64MiB", node_suspect_after_s=1.5,
                           node_expire_after_s=3)
    client = connect_face(face, cluster.address, timeout_s=20)
    try:
        _kill_9_one_node(cluster, client)
    finally:
        client.close()


def _kill_9_one_node(cluster, client):
    doubles = make_values("two", 150, 1)
    singles = make_values("one", 90, 2)
    assert client.put_many(doubles, replicas=2) == [Status.OK] * len(doubles)
    assert client.put_many(singles, replicas=1) == [Status.OK] * len(singles)
    check_readable(client, doubles)
    placed = replica_nodes(cluster.address, cluster.token_for("default", admin=True), list(singles))
    assert set(placed) == set(singles)
    may_miss = allowed_misses(placed, {"node-0"})
    assert 0 < len(may_miss) < len(singles), "placement put all or none of the singles on node-0"

    cluster.kill_node(0)

    # The master has not noticed yet: reads fall back, writes avoid the dead node.
    check_readable(client, doubles)
    readable = check_single_copies(client, singles, may_miss)
    assert readable >= len(singles) - len(may_miss)
    put_and_check(client, "after-kill", 3)

    # Wait for the master to expire the node, then the same again.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = {n["node_id"]: n["state"] for n in client.status()["nodes"]}
        if states.get("node-0", "EXPIRED") == "EXPIRED":
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the master never expired node-0: {states}")
    check_readable(client, doubles)
    assert check_single_copies(client, singles, may_miss) == readable
    assert evicted_keys(cluster.http_url) == 0, "evictions make misses legitimate"
    put_and_check(client, "after-expiry", 4)
    live = [n for n in client.status()["nodes"] if n["state"] == "ACTIVE"]
    assert {n["node_id"] for n in live} == {"node-1", "node-2"}
