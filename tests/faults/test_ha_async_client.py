"""The asyncio face through a master failover: an `AsyncClient` given the etcd address keeps
working when the leader is killed (kill -9): its channel asks etcd (the authority in
`cellar.coord.follow`), follows the new leader, and the flows re-place or re-read what the
change voided. Objects stored before the kill read back exact; puts after it succeed."""

from __future__ import annotations

import asyncio
import signal

import pytest
from hakit import ha_cluster

import cellar
from cellar.errors import Status

OBJECTS = 50


@pytest.mark.timeout(180)
def test_async_client_follows_the_new_leader_after_kill_9():
    with ha_cluster(nodes=2, lease_ttl_s=3) as cluster:
        old = cluster.leader()

        async def body() -> None:
            async with cellar.AsyncClient(cluster.etcd_url, timeout_s=30.0) as client:
                before = {f"ha-async/{i}": bytes([i]) * (1000 + i) for i in range(OBJECTS)}
                assert await client.put_many(before, replicas=2) == [Status.OK] * OBJECTS
                first_master = client.master_address
                cluster.kill_master(old)
                # the first calls after the kill wait out the lease, then land at the new leader
                values = await asyncio.gather(*(client.get(k) for k in before))
                assert values == list(before.values())
                await client.put("ha-async/after", b"new leader")
                assert await client.get("ha-async/after") == b"new leader"
                assert await client.prefix_len(list(before)) == OBJECTS
                assert client.master_address != first_master
                return client.master_address

        followed = asyncio.run(body())
        new = cluster.leader(not_index=old)  # waits until one master other than old leads
        assert followed == cluster.masters[new].address, "the client ended at another master"
        assert cluster.roles()[old] == ""  # killed: it answers nothing


@pytest.mark.timeout(180)
def test_async_client_leaves_a_frozen_leader_for_the_one_etcd_names():
    """SIGSTOP the leader: it answers nothing and refuses nothing. The client's calls ask etcd
    while they wait and move to the new leader once its lease has passed, well inside their
    own timeout (without that, a call would sit on the frozen master until it timed out)."""
    with ha_cluster(nodes=2, lease_ttl_s=3) as cluster:
        old = cluster.leader()

        async def body() -> str:
            async with cellar.AsyncClient(cluster.etcd_url, timeout_s=25.0) as client:
                await client.put("ha-frozen/before", b"v1")
                assert client.master_address == cluster.masters[old].address
                cluster.signal_master(signal.SIGSTOP, old)
                try:
                    assert await client.get("ha-frozen/before") == b"v1"
                    await client.put("ha-frozen/after", b"v2")
                    assert await client.exists_many(["ha-frozen/before", "ha-frozen/after"]) \
                        == [True, True]
                    return client.master_address  # where the calls above were answered
                finally:
                    cluster.signal_master(signal.SIGCONT, old)

        answered_by = asyncio.run(body())
        new = cluster.leader(not_index=old)  # waits until one master other than old leads
        assert answered_by == cluster.masters[new].address, "the frozen leader answered"
        assert cluster.roles()[old] != "leader"
