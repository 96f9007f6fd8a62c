"""Every SDK argument is validated with a clear exception of the right class.

Checks happen in the client before anything is sent where they can (keys, buffers, counts);
BufferTooSmall is raised after the size is known but before any byte is transferred.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import cellar
from cellar.devtools.ports import free_port
from cellar.errors import Status
from tests.support.faces import FACE_TRANSPORT_IDS, FACE_TRANSPORTS, AsyncFace, open_face

LONG_KEY = "é" * 513  # 1026 bytes in UTF-8, over the master's 1024


@pytest.fixture(scope="module")
def cluster(module_cluster):
    return module_cluster(nodes=2, segment_size="16MiB", allow_unknown_tenants="true")


@pytest.fixture(params=FACE_TRANSPORTS, ids=FACE_TRANSPORT_IDS)
def client(request, cluster):
    """Each test runs over both faces (Client, AsyncClient) and both transports (tcp, shm),
    each in its own tenant (its own key namespace) on the module's cluster."""
    c = open_face(*request.param, cluster.address, timeout_s=30.0, tenant="-".join(request.param),
                  token=cluster.token_for("-".join(request.param), shm=True))
    c.upsert("bad/present", b"0123456789")
    yield c
    c.close()


BAD_KEYS = [("", "empty"), (b"bytes", "str"), (7, "str"), (None, "str"), (LONG_KEY, "1026 bytes")]


@pytest.mark.parametrize("key, why", BAD_KEYS)
def test_bad_keys_everywhere(client, key, why):
    calls = [
        lambda: client.put(key, b"v"), lambda: client.upsert(key, b"v"),
        lambda: client.get(key), lambda: client.get_into(key, bytearray(8)),
        lambda: client.exists(key), lambda: client.remove(key), lambda: client.size(key),
        lambda: client.put_many([(key, b"v")]), lambda: client.put_many({key: b"v"}),
        lambda: client.get_many(["ok", key]), lambda: client.get_many_into([key], [bytearray(1)]),
        lambda: client.exists_many([key]), lambda: client.prefix_len(["ok", key]),
    ]
    if isinstance(key, str):
        calls.append(lambda: client.remove_prefix(key))
    for call in calls:
        with pytest.raises(cellar.InvalidArgument, match=why):
            call()


def test_key_sequences_must_be_sequences(client):
    for call in (client.get_many, client.exists_many, client.prefix_len):
        with pytest.raises(cellar.InvalidArgument, match="sequence of str"):
            call("bad/present")
        with pytest.raises(cellar.InvalidArgument):
            call(5)


@pytest.mark.parametrize("value", ["text", 5, None, [1, 2], 3.0, object()])
def test_wrong_value_types(client, value):
    with pytest.raises(cellar.InvalidArgument, match="bytes-like"):
        client.put("bad/v", value)
    with pytest.raises(cellar.InvalidArgument, match="bytes-like"):
        client.put_many([("bad/v", value)])
    assert not client.exists("bad/v")


@pytest.mark.parametrize("buffer", ["text", 5, None, [0] * 16, object()])
def test_wrong_buffer_types(client, buffer):
    with pytest.raises(cellar.InvalidArgument, match="bytes-like"):
        client.get_into("bad/present", buffer)
    with pytest.raises(cellar.InvalidArgument, match="bytes-like"):
        client.get_many_into(["bad/present"], [buffer])


def test_empty_value_is_refused(client):
    for value in (b"", bytearray(), np.zeros(0, dtype=np.uint8)):
        with pytest.raises(cellar.InvalidArgument, match="empty"):
            client.put("bad/empty", value)


def test_too_small_buffer(client):
    buf = bytearray(b"\xee" * 9)
    with pytest.raises(cellar.BufferTooSmall) as info:
        client.get_into("bad/present", buf)
    assert info.value.needed_bytes == 10 and "9 bytes" in str(info.value)
    assert buf == bytearray(b"\xee" * 9), "nothing transferred into a too-small buffer"
    bufs = [bytearray(64), np.zeros(3, dtype=np.uint8)]
    with pytest.raises(cellar.BufferTooSmall):
        client.get_many_into(["bad/present", "bad/present"], bufs)
    assert bufs[0] == bytearray(64), "the batch is checked before any transfer"
    assert client.get_into("bad/present", bytearray(10)) == 10


def test_non_contiguous_numpy(client):
    strided = np.zeros(40, dtype=np.uint8)[::2]
    with pytest.raises(cellar.InvalidArgument, match="C-contiguous"):
        client.put("bad/strided", strided)
    with pytest.raises(cellar.InvalidArgument, match="C-contiguous"):
        client.get_into("bad/present", strided)
    with pytest.raises(cellar.InvalidArgument, match="C-contiguous"):
        client.get_into("bad/present", np.asfortranarray(np.zeros((8, 8))))
    client.put("bad/fortran-ok", np.zeros((8, 1)))  # contiguous in both orders: accepted
    assert client.remove("bad/fortran-ok")


def test_read_only_destination(client):
    frozen = np.zeros(16, dtype=np.uint8)
    frozen.flags.writeable = False
    for dest in (bytes(16), memoryview(bytes(16)), frozen):
        with pytest.raises(cellar.InvalidArgument, match="read-only"):
            client.get_into("bad/present", dest)
        with pytest.raises(cellar.InvalidArgument, match="read-only"):
            client.get_many_into(["bad/present"], [dest])


def test_other_arguments(client):
    for replicas in (0, -1, "2", 2.0, True, 99):
        with pytest.raises(cellar.InvalidArgument, match="replicas"):
            client.put("bad/r", b"v", replicas=replicas)
        with pytest.raises(cellar.InvalidArgument, match="replicas"):
            client.put_many({"bad/r": b"v"}, replicas=replicas)
    with pytest.raises(cellar.InvalidArgument, match="2 keys but 1 buffers"):
        client.get_many_into(["a", "b"], [bytearray(1)])
    with pytest.raises(cellar.InvalidArgument, match="one buffer per key"):
        client.get_many_into(["a"], bytearray(1))
    with pytest.raises(cellar.InvalidArgument, match="twice"):
        client.put_many([("bad/d", b"1"), ("bad/d", b"2")])
    with pytest.raises(cellar.InvalidArgument, match="pair"):
        client.put_many([("bad/d",)])
    with pytest.raises(cellar.InvalidArgument, match="mapping or a sequence"):
        client.put_many(42)
    with pytest.raises(cellar.InvalidArgument, match="empty"):
        client.remove_prefix("")


def test_semantic_errors(client):
    with pytest.raises(cellar.AlreadyExists):
        client.put("bad/present", b"x")
    assert client.put_many({"bad/present": b"x"}) == [Status.ALREADY_EXISTS]
    for call in (lambda: client.get("bad/absent"), lambda: client.size("bad/absent"),
                 lambda: client.get_into("bad/absent", bytearray(4))):
        with pytest.raises(cellar.NotFound) as info:
            call()
        assert isinstance(info.value, KeyError) and "bad/absent" in str(info.value)
    assert client.remove("bad/absent") is False
    assert client.size("bad/present") == 10


def test_connect_arguments(cluster):
    with pytest.raises(cellar.InvalidArgument, match="transport"):
        cellar.connect(cluster.address, transport="carrier-pigeon")
    with pytest.raises(cellar.InvalidArgument, match="host:port"):
        cellar.connect("no-port-here")
    with pytest.raises(cellar.InvalidArgument, match="host:port"):
        cellar.connect(("127.0.0.1", 1))
    with pytest.raises(cellar.InvalidArgument, match="timeout_s"):
        cellar.connect(cluster.address, timeout_s=0)
    with pytest.raises(cellar.InvalidArgument, match="tenant"):
        cellar.connect(cluster.address, tenant="")
    with cellar.connect(cluster.address, transport="tcp") as c:
        c.upsert("bad/present", b"0123456789")
        assert c.get("bad/present") == b"0123456789"
    port = free_port()  # a port with nobody listening
    with pytest.raises(cellar.Unavailable):
        cellar.connect(f"127.0.0.1:{port}", timeout_s=0.5)


def test_closed_client(cluster):
    c = cellar.connect(cluster.address)
    c.close()
    c.close()  # idempotent
    for call in (lambda: c.get("bad/present"), lambda: c.exists_many(["a"]),
                 lambda: c.get_many_into(["a"], [bytearray(1)], timeout_s=0)):
        with pytest.raises(cellar.ClientClosed, match="closed"):
            call()


def test_async_connect_arguments_match_the_sync_ones(cluster):
    for kwargs, match in [({"transport": "carrier-pigeon"}, "transport"),
                          ({"timeout_s": 0}, "timeout_s"), ({"tenant": ""}, "tenant"),
                          ({"token": 5}, "token")]:
        with pytest.raises(cellar.InvalidArgument, match=match):
            cellar.AsyncClient(cluster.address, **kwargs)
    with pytest.raises(cellar.InvalidArgument, match="host:port"):
        asyncio.run(cellar.connect_async("no-port-here"))
    port = free_port()
    with pytest.raises(cellar.Unavailable):
        asyncio.run(cellar.connect_async(f"127.0.0.1:{port}", timeout_s=0.5))


def test_closed_async_client(cluster):
    async def body() -> None:
        c = await cellar.connect_async(cluster.address, transport="tcp")
        await c.upsert("bad/async-closed", b"x")
        await c.aclose()
        await c.aclose()  # idempotent
        for call in (c.get("bad/async-closed"), c.exists_many(["a"]), c.put("k", b"v"),
                     c.get_many_into(["a"], [bytearray(1)], timeout_s=0)):
            with pytest.raises(cellar.ClientClosed, match="closed"):
                await call
        never_opened = cellar.AsyncClient(cluster.address)
        with pytest.raises(cellar.ClientClosed, match="not open"):
            await never_opened.get("k")

    asyncio.run(body())


def test_an_async_client_used_from_another_loop(cluster):
    face = AsyncFace(cluster.address, transport="tcp")
    try:
        face.upsert("bad/loop", b"v")

        async def from_here() -> None:
            with pytest.raises(cellar.InvalidArgument, match="another event loop"):
                await face.client.get("bad/loop")

        asyncio.run(from_here())
        assert face.get("bad/loop") == b"v"  # still fine on its own loop
    finally:
        face.close()


def test_closing_an_async_client_ends_its_calls_in_flight(cluster):
    async def body() -> None:
        c = await cellar.connect_async(cluster.address, transport="tcp")
        await c.upsert("bad/inflight", b"v" * 1000)
        gets = [asyncio.ensure_future(c.get("bad/inflight")) for _ in range(8)]
        await asyncio.sleep(0)  # queued, not yet answered
        await c.aclose()
        results = await asyncio.gather(*gets, return_exceptions=True)
        assert all(r == b"v" * 1000 or isinstance(r, cellar.ClientClosed) for r in results), \
            results

    asyncio.run(body())
