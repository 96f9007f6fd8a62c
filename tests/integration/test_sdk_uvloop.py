"""The AsyncClient on uvloop (a dependency of cellar-kv, and the loop serving engines run):
the same calls as on asyncio's default loop, with its metadata on the fast line.

uvloop's transports do not subclass asyncio.Transport; the fast line used to refuse them, so
every call fell back to gRPC (which timed out on uvloop here). Here
the gets, probes and puts must answer, and none of them may take gRPC once the line is known.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster

uvloop = pytest.importorskip("uvloop")

KEYS = 64
VALUE_BYTES = 64 << 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(1, "64MiB") as c:
        yield c


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_async_client_on_uvloop_uses_the_fast_line(cluster: LocalCluster, transport: str) -> None:
    keys = [f"uv-{transport}/{i:02d}" for i in range(KEYS)]
    values = [bytes([i]) * VALUE_BYTES for i in range(KEYS)]

    async def body() -> list[str]:
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        async with cellar.AsyncClient(cluster.address, transport=transport,
                                      timeout_s=20.0) as client:
            await client.exists("warm")  # learns the fast line
            grpc_calls: list[str] = []
            real = client._master._call_grpc

            async def spy(method: str, request: Any, deadline: float, learn: bool = False) -> Any:
                grpc_calls.append(method)
                return await real(method, request, deadline, learn)

            client._master._call_grpc = spy  # type: ignore[method-assign]
            assert await client.put_many(list(zip(keys, values, strict=True))) == \
                [cellar.Status.OK] * KEYS
            got = await asyncio.gather(*(client.get(k) for k in keys))  # one coalesced batch
            assert got == values
            assert await client.exists_many(keys + ["absent"]) == [True] * KEYS + [False]
            assert await client.prefix_len(keys + ["absent"]) == KEYS
            assert grpc_calls == []
            assert await client.remove_prefix(f"uv-{transport}/") == KEYS
            return grpc_calls

    assert uvloop.run(body()) == ["RemovePrefix"]  # the one call with no fast-line form
