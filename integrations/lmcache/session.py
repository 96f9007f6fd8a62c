"""The LMCache connector's hold on Cellar: one `cellar.AsyncClient` on an event loop of its own.

Why its own loop
    LMCache 0.5.6 runs every connector coroutine on one event loop (a thread of its storage
    manager) that also carries every other request's lookups and transfers. The AsyncClient
    never waits on that loop, but it does CPU work where it runs: the shm transport copies
    inline, payload checksums are computed and large tcp frames are received there (measured
    with `python -m cellar.bench.engines_lmcache`: with the client on LMCache's loop, a
    192 MiB batched get held that loop for 130-630 ms at a time). So the client lives on a
    loop thread owned by this session, and LMCache's loop only awaits the result: the time it
    cannot run other work is the hand-over, not the transfer. The copies themselves release the GIL (memcpy through
    ctypes, recv_into), so the two threads overlap.

Invariants
    The client is opened, used and closed on `self.loop` only (an AsyncClient belongs to the
    loop that opened it), opened on first use so an engine starts even while Cellar is down.
    `run` can be awaited from any other loop; `run_sync` serves LMCache's synchronous entry
    points from the engine's threads. `in_flight` is touched on `self.loop` only. A master
    unreachable at open is asked again no sooner than `RECONNECT_BACKOFF_S` later; meanwhile
    every call raises `cellar.Unavailable` at once instead of waiting its timeout. Cancelling
    the awaiting coroutine (LMCache's own timeouts) cancels the call on the session's loop.

What it must never do
    Run a Cellar call on the caller's loop, or wait on its own loop from that loop's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import cellar
from cellar.errors import BufferTooSmall, CellarError

T = TypeVar("T")
# A master unreachable at open time is asked again no sooner than this.
RECONNECT_BACKOFF_S = 2.0
# How much longer than the client's own timeout a thread waits for a sync call's answer.
SYNC_GRACE_S = 5.0
# Bound on waiting for the session's loop thread to start and to end.
THREAD_START_TIMEOUT_S = 10.0
THREAD_JOIN_TIMEOUT_S = 10.0
# What a Cellar call may raise that the engine must never see (the SDK maps transport errors to
# CellarError; OSError covers a socket error it did not wrap).
FAILURES = (CellarError, OSError)
# What makes one key of a batch a miss (the others stay readable); anything else (an
# unreachable master, a timeout) ends the whole batch.
KEY_MISSES = (cellar.NotFound, cellar.NotReady, BufferTooSmall, cellar.IntegrityError)


async def read_into(client: cellar.AsyncClient, names: list[str], buffers: Sequence[Any],
                    budget_s: float, *, prefix: bool) -> list[int]:
    """Per key, the size read straight into its buffer or `cellar.MISS`/`cellar.LATE`; with
    `prefix`, the leading run that was read only. An object larger than its buffer is not of
    the reader's format: the SDK refuses the whole batch for it before any transfer, so only
    such a batch is read again key by key, where that object (with `prefix`: the run) ends."""
    try:
        return list(await client.get_many_into(names, buffers, timeout_s=budget_s,
                                               prefix=prefix))
    except BufferTooSmall:
        pass
    sizes: list[int] = []
    for name, buffer in zip(names, buffers, strict=True):
        try:
            sizes.append(await client.get_into(name, buffer))
        except KEY_MISSES:
            if prefix:
                break
            sizes.append(cellar.MISS)
    return sizes


class CellarSession:
    """The AsyncClient of one connector, on the session's own loop thread."""

    def __init__(self, master: str, *, tenant: str, timeout_s: float, transport: str,
                 on_open: Callable[[cellar.AsyncClient], Awaitable[None]]) -> None:
        self.master, self.tenant, self.timeout_s, self.transport = (master, tenant, timeout_s,
                                                                    transport)
        self._on_open = on_open
        self._client: cellar.AsyncClient | None = None
        self._opening: asyncio.Lock | None = None  # made on self.loop, at first use
        self._next_try_s = 0.0
        self._closed = False
        self.in_flight = 0  # calls under way (observability; the outage tests wait on it)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,),
                                        name="cellar-lmcache-loop", daemon=True)
        self._thread.start()
        if not started.wait(THREAD_START_TIMEOUT_S):
            raise cellar.Unavailable("the Cellar connector's loop thread did not start")

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def _open(self) -> cellar.AsyncClient:
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

    async def _call(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]]) -> T:
        self.in_flight += 1
        try:
            return await fn(await self._open())
        finally:
            self.in_flight -= 1

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if threading.current_thread() is self._thread:
            coro.close()
            raise cellar.Unavailable("a Cellar session call from its own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def healthy(self) -> bool:
        """Open, or not waiting out a failed open (what an adapter reports as its health)."""
        return not self._closed and (self._client is not None
                                     or time.monotonic() >= self._next_try_s)

    def submit(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """`fn(client)` on the session's loop, as a future a thread can wait on or attach a
        callback to (the callback runs on the session's loop thread)."""
        return self._submit(self._call(fn))

    async def run(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]]) -> T:
        """`fn(client)` on the session's loop, awaited from the caller's loop without blocking
        it; raises what the SDK raises (the connector maps it)."""
        return await asyncio.wrap_future(self._submit(self._call(fn)))

    def run_sync(self, fn: Callable[[cellar.AsyncClient], Awaitable[T]]) -> T:
        """`fn(client)` on the session's loop, waited for on the calling thread."""
        future = self._submit(self._call(fn))
        try:
            return future.result(self.timeout_s + SYNC_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise cellar.Timeout(f"no answer from the Cellar session within "
                                 f"{self.timeout_s + SYNC_GRACE_S:.0f} s") from None

    async def _aclose(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Close the client and end the loop thread (blocking; idempotent)."""
        if not self._thread.is_alive():
            return
        try:
            self._submit(self._aclose()).result(self.timeout_s + SYNC_GRACE_S)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(THREAD_JOIN_TIMEOUT_S)

    async def aclose(self) -> None:
        """`close` for a coroutine on another loop (LMCache closes connectors on its loop)."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)


__all__ = ["FAILURES", "KEY_MISSES", "RECONNECT_BACKOFF_S", "CellarSession", "read_into"]
