"""The AsyncClient's coalesced gets against a real cluster: the `get` calls of one loop turn
travel as batches of at most PIPELINED_GETS, and gets made while a batch is in flight form the next one; whatever the batching, each
caller gets its own key's bytes or its own exception.
"""

from __future__ import annotations

import asyncio

import pytest

import cellar
from cellar.client import aio_gets
from cellar.devtools.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(module_cluster) -> LocalCluster:
    return module_cluster(1, "64MiB")


def value(i: int) -> bytes:
    return bytes([i % 251]) * (1000 + 37 * i)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_one_turn_of_gets_larger_than_a_batch(cluster, monkeypatch, transport: str) -> None:
    monkeypatch.setattr(aio_gets, "PIPELINED_GETS", 8)
    keys = [f"coal-{transport}/{i:02d}" for i in range(21)]

    async def body() -> None:
        async with cellar.AsyncClient(cluster.address, transport=transport) as client:
            await client.put_many([(k, value(i)) for i, k in enumerate(keys)], upsert=True)
            batches: list[int] = []
            real = aio_gets.operations.get_each

            def spy(s, names, deadline=None):
                batches.append(len(names))
                return real(s, names, deadline)

            monkeypatch.setattr(aio_gets.operations, "get_each", spy)
            asked = keys + ["coal-absent"]
            got = await asyncio.gather(*(client.get(k) for k in asked), return_exceptions=True)
            assert got[:-1] == [value(i) for i in range(len(keys))]
            assert isinstance(got[-1], cellar.NotFound)
            assert batches == [8, 8, 6]  # 22 gets of one turn, in batches of at most 8
            await client.remove_prefix(f"coal-{transport}/")

    asyncio.run(body())


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_gets_made_while_a_batch_is_in_flight(cluster, transport: str) -> None:
    """16 tasks each looping over its own keys (one of them absent): the gets of a task woken
    by one batch join the next; every result is that task's own."""
    keys = [f"loop-{transport}/{i:02d}" for i in range(32)]

    async def body() -> None:
        async with cellar.AsyncClient(cluster.address, transport=transport) as client:
            await client.put_many([(k, value(i)) for i, k in enumerate(keys)], upsert=True)

            async def worker(w: int) -> int:
                mine = [(i, keys[i]) for i in range(w, len(keys), 16)]
                done = 0
                for _ in range(20):
                    for i, key in mine:
                        assert await client.get(key) == value(i)
                        done += 1
                    with pytest.raises(cellar.NotFound):
                        await client.get(f"loop-{transport}/absent-{w}")
                return done

            assert sum(await asyncio.gather(*(worker(w) for w in range(16)))) == 20 * 32
            assert not client._gets.queue and not client._gets.tasks  # nothing left behind
            await client.remove_prefix(f"loop-{transport}/")

    asyncio.run(body())
