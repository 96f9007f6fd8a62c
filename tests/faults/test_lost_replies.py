"""Issue 19, finding 4: a call carried twice returns the first call's result.

Seen: on a loaded machine the first `put` of a fresh cluster raised AlreadyExists for its own
key: the PutStart reached the master over the fast line, the reply did not come back in time,
the call was carried again over gRPC and found the key WRITING (by itself). The same holds for
a retried Remove (NOT_FOUND: "it was not there") and RemovePrefix/RemoveAll (0 removed).

Here a proxy (tests/support/lost_replies.py) loses the first reply of every call on the fast
line and on gRPC, after the master acted. Every put, remove and unpin must still return what
one delivery would have: the SDK stamps each mutating call with a request id and carries the
same id on every retry and line switch; the master answers a repeat with the first reply.
Negative control: with the SDK's request ids switched off (every id 0, as before) the first
put raises AlreadyExists (`test_without_request_ids_the_repeat_is_refused`).
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

import cellar
from cellar.client import request_ids
from cellar.devtools.local_cluster import LocalCluster
from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc
from cellar.proto.fastline import PORT_METADATA
from tests.support.lost_replies import LostReplies

KiB = 1024


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # pins outlive the test (TTL 120 s): a pin count of 0 proves the Unpin calls, not the TTL
    c = LocalCluster(2, "64MiB", master_flags={"pin_ttl_s": 120})
    try:
        c.start()
        c.test_token = c.token_for("default")  # type: ignore[attr-defined]
        yield c
    finally:
        c.stop()


@pytest.fixture
def proxy(cluster: LocalCluster) -> Iterator[LostReplies]:
    with grpc.insecure_channel(cluster.address) as channel:
        _, call = pb_grpc.MasterStub(channel).ClusterStatus.with_call(
            pb.ClusterStatusRequest(header=pb.RequestHeader(token=cluster.test_token)), timeout=10)
    port = int(dict(call.trailing_metadata())[PORT_METADATA])
    p = LostReplies(cluster.address, port)
    try:
        yield p
    finally:
        p.close()


def _metric(cluster: LocalCluster, name: str) -> float:
    with urllib.request.urlopen(cluster.http_url + "/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name}")


def _pins(cluster: LocalCluster) -> float:
    return _metric(cluster, "master_pin_count")


def _await_no_pins(cluster: LocalCluster, wait_s: float = 60.0) -> None:
    """Until the master holds no pin (a bound far below the pin TTL, not a timed figure)."""
    deadline = time.monotonic() + wait_s
    while _pins(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _pins(cluster) == 0


def test_every_call_survives_its_lost_first_reply(cluster: LocalCluster,
                                                  proxy: LostReplies) -> None:
    values = {f"sync/{i}": os.urandom(64 * KiB) for i in range(6)}
    with cellar.connect(proxy.address, token=cluster.test_token, timeout_s=20) as client:
        for key, value in list(values.items())[:3]:
            client.put(key, value)  # AlreadyExists here before request ids
        client.put_many(list(values.items())[3:])
        client.upsert("sync/0", values["sync/0"][::-1])
        values["sync/0"] = values["sync/0"][::-1]
        for key, value in values.items():
            assert client.get(key) == value
        _await_no_pins(cluster)  # the queued Unpin calls, carried twice each, released them
        assert client.remove("sync/5") is True  # False ("not there") before request ids
        assert client.remove_many(["sync/4", "sync/3"]) == [True, True]
        assert client.remove_prefix("sync/2") == 1
        assert client.remove_all() == 2  # sync/0, sync/1
        assert client.list_all_keys() == []
    assert proxy.dropped["fast"] > 0 and proxy.dropped["grpc"] > 0, proxy.dropped
    for method in ("PutStart", "PutEnd", "Remove", "RemovePrefix", "RemoveAll"):
        assert proxy.calls.get(method, 0) >= 2, (method, proxy.calls)
    assert proxy.calls.get("Unpin", 0) + proxy.calls.get("fast:5", 0) >= 2, proxy.calls
    assert _metric(cluster, "master_request_repeats_total") > 0


def test_the_asyncio_face_too(cluster: LocalCluster, proxy: LostReplies) -> None:
    async def body() -> None:
        values = {f"aio/{i}": os.urandom(32 * KiB) for i in range(4)}
        async with await cellar.connect_async(proxy.address, token=cluster.test_token,
                                                    timeout_s=20) as client:
            for key, value in values.items():
                await client.put(key, value)
            for key, value in values.items():
                assert await client.get(key) == value
            assert await client.remove("aio/0") is True
            assert await client.remove_prefix("aio/") == 3
    asyncio.run(body())
    assert proxy.dropped["grpc"] > 0


def test_without_request_ids_the_repeat_is_refused(cluster: LocalCluster, proxy: LostReplies,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: the same lost replies, with every request id 0 (the SDK before)."""
    monkeypatch.setattr(request_ids, "ENABLED", False)
    with (cellar.connect(proxy.address, token=cluster.test_token, timeout_s=20) as client,
          pytest.raises(cellar.AlreadyExists)):
        client.put("control/0", b"x" * KiB)
