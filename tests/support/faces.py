"""Both SDK faces behind one blocking interface, so one test body checks `Client` and
`AsyncClient` alike: `AsyncFace` runs a real `AsyncClient` on its own event loop thread and
turns each of its coroutine methods into a blocking call (the test's view only; the client
itself does asyncio I/O on its loop)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import cellar

FACES = ("sync", "async")


class AsyncFace:
    def __init__(self, address: str, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="async-face",
                                        daemon=True)
        self._thread.start()
        try:
            self.client: cellar.AsyncClient = self.run(cellar.connect_async(address, **kwargs))
        except BaseException:
            self._stop()
            raise

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(attr(*args, **kwargs))

        return call

    def close(self) -> None:
        if self.loop.is_running():
            self.run(self.client.aclose())
        self._stop()

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self.loop.is_running():
            self.loop.close()


def connect_face(face: str, address: str, **kwargs: Any) -> Any:
    """A sync `Client`, or an `AsyncClient` behind `AsyncFace`."""
    if face == "sync":
        return cellar.connect(address, **kwargs)
    if face == "async":
        return AsyncFace(address, **kwargs)
    raise ValueError(face)


def face_factory() -> tuple[Callable[..., Any], Callable[[], None]]:
    """(connect(face, address, **kw), close_all) for a fixture."""
    opened: list[Any] = []

    def connect(face: str, address: str, **kwargs: Any) -> Any:
        client = connect_face(face, address, **kwargs)
        opened.append(client)
        return client

    def close_all() -> None:
        for client in opened:
            client.close()

    return connect, close_all


# Every face over every transport this machine has (rdma is exercised where a device exists,
# by tests/integration/test_rdma_device.py).
FACE_TRANSPORTS = [("sync", "tcp"), ("async", "tcp"), ("sync", "shm"), ("async", "shm")]
FACE_TRANSPORT_IDS = [f"{face}-{transport}" for face, transport in FACE_TRANSPORTS]
# Transports that may be absent from a machine: only these may turn into a skip. tcp and shm
# exist wherever Cellar runs, so failing to open one is a failure, never a skip (a TypeError in
# ShmTransport.__init__ once left the shm half of every faces suite skipped, none failed).
OPTIONAL_TRANSPORTS = frozenset({"rdma"})
# (face, transport) -> how many tests opened it; tests/conftest.py prints it after the run.
OPENED: Counter[tuple[str, str]] = Counter()


def open_face(face: str, transport: str, address: str, **kwargs: Any) -> Any:
    """`connect_face` over one transport, counted in `OPENED`. Only an optional transport
    (`OPTIONAL_TRANSPORTS`) that this machine lacks is skipped, with the reason."""
    import pytest

    try:
        client = connect_face(face, address, transport=transport, **kwargs)
    except cellar.InvalidArgument as exc:
        if transport in OPTIONAL_TRANSPORTS and "not available" in str(exc):
            pytest.skip(f"{face} face over {transport}: {exc}")
        raise
    OPENED[face, transport] += 1
    return client


@contextlib.contextmanager
def tenant_clients(face: str, transport: str, cluster: Any,
                   timeout_s: float = 30.0) -> Iterator[Callable[[str], Any]]:
    """A factory of clients of one face and transport of a LocalCluster, each with its
    tenant's token (shm rights over shm); all closed at the end."""
    opened: list[Any] = []

    def factory(tenant: str) -> Any:
        client = open_face(face, transport, cluster.address, tenant=tenant,
                           token=cluster.token_for(tenant, shm=transport == "shm"),
                           timeout_s=timeout_s)
        opened.append(client)
        return client

    try:
        yield factory
    finally:
        for client in opened:
            client.close()


def client_locations(client: Any) -> Any:
    """The `Locations` of a sync client or an AsyncFace (client/early_reads.py)."""
    inner = client.client if isinstance(client, AsyncFace) else client
    found = inner._s.locations
    assert found is not None, "early reads (and so trusted reads) are on by default"
    return found


def opened_summary() -> list[str]:
    """Lines for the end of a run: each face x transport combination and its count of tests."""
    if not OPENED:
        return []
    ran = [f"{face}-{transport}: {OPENED[face, transport]}"
           for face, transport in FACE_TRANSPORTS if OPENED[face, transport]]
    missing = [f"{face}-{transport}" for face, transport in FACE_TRANSPORTS
               if not OPENED[face, transport]]
    lines = [f"face x transport combinations run: {len(ran)} of {len(FACE_TRANSPORTS)} "
             f"(tests each: {', '.join(ran)})"]
    if missing:
        lines.append(f"face x transport combinations NOT run: {', '.join(missing)}")
    return lines


def open_pair(face: str, transport: str, cluster: Any, tenant: str) -> tuple[Any, Any]:
    """Two clients of `tenant` (a writer and a reader, say) over one face and transport, with
    the tenant's token (shm rights over shm), each counted as `open_face` counts them."""
    token = cluster.token_for(tenant, shm=transport == "shm")
    first = open_face(face, transport, cluster.address, tenant=tenant, token=token)
    try:
        return first, open_face(face, transport, cluster.address, tenant=tenant, token=token)
    except BaseException:
        first.close()
        raise
