"""The LMCache connector's hold on Cellar: one `cellar.AsyncClient` on LMCache's event loop.

Why it exists
    LMCache 0.5.6 runs every connector coroutine on one event loop of its own (a thread of the
    storage manager) and calls a few synchronous methods (exists_sync, batched_contains,
    remove_sync) from the engine's threads. This class gives the connector one AsyncClient on
    that loop, opened on first use (so an engine starts even while Cellar is down), and the
    bridge from the engine's threads onto it.

Invariants
    The client is opened, used and closed on `loop` only (an AsyncClient belongs to the loop
    that opened it). `run` awaits Cellar without blocking that loop: the SDK's asyncio face
    waits on grpc.aio and the loop's own sockets. `in_flight` is touched on the loop only.
    A master unreachable at open is asked again no sooner than `RECONNECT_BACKOFF_S` later;
    meanwhile every call raises `cellar.Unavailable` at once instead of waiting its timeout.

What it must never do
    Block the loop waiting for Cellar, or wait on the loop from the loop's own thread (the sync
    bridge refuses that instead of deadlocking).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import cellar
from cellar.errors import CellarError

T = TypeVar("T")
# A master unreachable at open time is asked again no sooner than this.
RECONNECT_BACKOFF_S = 2.0
# How much longer than the client's own timeout a thread waits on the loop for a sync call.
SYNC_GRACE_S = 5.0
# What a Cellar call may raise that the engine must never see (the SDK maps transport errors to
# CellarError; OSError covers a socket error it did not wrap).
FAILURES = (CellarError, OSError)


class CellarSession:
    """The AsyncClient of one connector, on `loop`, opened lazily (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, master: str, *, tenant: str,
                 timeout_s: float, transport: str,
                 on_open: Callable[[cellar.AsyncClient], Awaitable[None]]) -> None:
        self.loop = loop
        self.master, self.tenant, self.timeout_s, self.transport = (master, tenant, timeout_s,
                                                                    transport)
        self._on_open = on_open
        self._client: cellar.AsyncClient | None = None
        self._opening: asyncio.Lock | None = None  # made on the loop, at first use
        self._next_try_s = 0.0
        self._closed = False
        self.in_flight = 0  # calls under way (observability; the outage tests wait on it)

    async def client(self) -> cellar.AsyncClient:
        if self._closed:
            raise cellar.Unavailable("the Cellar connector is closed")
        if self._client is not None:
            return self._client
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._client is None:
                now = time.monotonic()
                if now < self._next_try_s:
                    raise cellar.Unavailable(f"Cellar master {self.master} unreachable; next "
                                             f"try in {self._next_try_s - now:.1f} s")
                try:
                    client = await cellar.connect_async(
                        self.master, tenant=self.tenant, timeout_s=self.timeout_s,
                        transport=self.transport)
                except FAILURES:
                    self._next_try_s = time.monotonic() + RECONNECT_BACKOFF_S
                    raise
                self._client = client
                await self._on_open(client)
        assert self._client is not None
        return self._client

    async def run(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]]) -> T:
        """`fn(client)` on the loop; raises what the SDK raises (the connector maps it)."""
        assert asyncio.get_running_loop() is self.loop, "CellarSession.run off its loop"
        self.in_flight += 1
        try:
            return await fn(await self.client())
        finally:
            self.in_flight -= 1

    def run_sync(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]]) -> T:
        """`run(fn)` from an engine thread: submitted to the loop, waited for here."""
        if getattr(self.loop, "_thread_id", None) == threading.get_ident():
            raise cellar.Unavailable("a blocking Cellar call on LMCache's own loop thread "
                                     "would deadlock it; use the async methods there")
        future = asyncio.run_coroutine_threadsafe(self.run(fn), self.loop)
        try:
            return future.result(self.timeout_s + SYNC_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise cellar.Timeout(f"no answer from LMCache's loop within "
                                 f"{self.timeout_s + SYNC_GRACE_S:.0f} s") from None

    async def aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


__all__ = ["FAILURES", "RECONNECT_BACKOFF_S", "CellarSession"]
