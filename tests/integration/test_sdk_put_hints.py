"""`cellar.client.PutHints` on both SDK faces against a real cluster: a preferred host takes the
first replica (every put form), a hard pin needs the tenant's right, and hints the master
would refuse are refused before anything is sent."""

from __future__ import annotations

import pytest

from cellar.client import PutHints
from cellar.errors import InvalidArgument, PermissionDenied, Status
from tests.support.faces import FACES, connect_face


def _objects_by_node(client) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {n["node_id"]: int(n["object_count"]) for n in client.status()["nodes"]}


@pytest.mark.parametrize("face", FACES)
def test_preferred_host_takes_the_first_replica(make_cluster, face):
    cluster = make_cluster(nodes=0)
    cluster.add_node(host_id="host-a", node_id="node-a")
    cluster.add_node(host_id="host-b", node_id="node-b")
    client = connect_face(face, cluster.address)
    try:
        for host, node in (("host-b", "node-b"), ("host-a", "node-a")):
            hints = PutHints(preferred_host_id=host)
            before = _objects_by_node(client)
            keys = [f"{host}/{i}" for i in range(6)]
            statuses = client.put_many([(k, b"v" * 1000) for k in keys[:4]], hints=hints)
            assert statuses == [Status.OK] * 4
            client.put(keys[4], b"w", hints=hints)
            client.put_parts(keys[5], [b"x", b"y"], hints=hints)
            assert _objects_by_node(client)[node] - before[node] == len(keys)
    finally:
        client.close()


@pytest.mark.parametrize("face", FACES)
def test_hard_pin_needs_the_right_and_bad_hints_are_refused(make_cluster, face):
    cluster = make_cluster(nodes=1, segment_size="16MiB")
    client = connect_face(face, cluster.address)
    try:
        with pytest.raises(PermissionDenied):
            client.put("hard", b"v", hints=PutHints(hard_pin=True))
        for bad, soft_pin in ((PutHints(soft_pin_ttl_ms=1000), False),  # a TTL needs a soft pin
                              (PutHints(soft_pin_ttl_ms=-1), True),
                              (PutHints(hard_pin=True), True),          # exclusive
                              (PutHints(preferred_host_id="h" * 257), False)):
            with pytest.raises(InvalidArgument):
                client.put("bad", b"v", soft_pin=soft_pin, hints=bad)
        with pytest.raises(InvalidArgument):
            client.put("bad", b"v", hints={"hard_pin": True})  # not a PutHints
        client.put("soft", b"v", soft_pin=True, hints=PutHints(soft_pin_ttl_ms=60_000))
        assert client.get("soft") == b"v"
    finally:
        client.close()
