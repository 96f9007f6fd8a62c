"""Coalesced gets: the `get` calls of one loop turn travel as one batch (the asyncio face's).

Why
    The `get` calls made in one turn of the loop (say `asyncio.gather` of 64 of them) are sent
    as one batch: one GetReplicas and one transfer round instead of 64 of each, which is what
    lets 64 concurrent gets reach the sync face's batched rate. Each caller still gets its own
    bytes or its own exception, and a caller cancelled meanwhile just drops its result. Only
    `get` coalesces: the `_into` forms keep their per-call semantics (a too-small buffer fails
    only its own call). A batch holds at most PIPELINED_GETS keys, so that callers looping on
    their gets keep two batches going: one's GetReplicas beside the other's transfer. A turn
    with one get is that get made in one step when it can be (client/one_read.py: a trusted
    read, or one lookup and one read), as the sync face's `get`; the flow answers it otherwise.

What it owns
    `CoalescedGets`: this turn's queue of (key, the caller's future) and the batch tasks in
    flight; `close` fails what is queued with ClientClosed and hands back the tasks to cancel.
    Loop-bound, like the client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cellar.client import metrics, operations
from cellar.client.flows import Session
from cellar.client.statuses import ClientClosed
from cellar.errors import CellarError, Status

# A lone get in one step (the face's): its value, or None and the deadline the flow then keeps
OneGet = Callable[[str], Awaitable[tuple[bytes | None, float | None]]]

# Keys of one coalesced get batch: 64 looping callers then run as two batches, one's
# GetReplicas round trip (the master's CPU, not this loop's) beside the other's socket reads
# or shm copies. Whole batches of 64 left the loop idle through every round trip (measured in
# bench/sdk.py: see docs/sdk.md "Figures").
PIPELINED_GETS = 32


class CoalescedGets:
    """The coalesced `get` batches of one client (`run`: the face's flow runner)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, s: Session,
                 run: Callable[[Any], Awaitable[Any]], one: OneGet | None = None) -> None:
        self._loop = loop
        self._s = s
        self._run = run
        self._one = one
        self._closed = False
        self.queue: list[tuple[str, asyncio.Future[bytes]]] = []  # this loop turn's gets
        self.tasks: set[asyncio.Task[None]] = set()  # batches in flight

    def add(self, key: str) -> asyncio.Future[bytes]:
        """The future of a get of checked `key`, sent with the turn's others."""
        waiter: asyncio.Future[bytes] = self._loop.create_future()
        queue = self.queue
        queue.append((key, waiter))
        if len(queue) == 1:
            self._spawn_batch()
        return waiter

    def _spawn_batch(self) -> None:
        """The batch task is made at the turn's first get and takes the queue on its first
        step: every get of the turn is in it by then, and its GetReplicas leaves in that same
        step. (A flush callback that made the task would cost one more turn, in which the batch
        in flight could run its transfer first: the next batch's metadata round trip would
        then not overlap it.)"""
        task = self._loop.create_task(self._coalesced())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _coalesced(self) -> None:
        queued = self.queue[:PIPELINED_GETS]
        del self.queue[:PIPELINED_GETS]
        if self.queue:  # more than one batch's worth: the rest is the next task's
            self._spawn_batch()
        waiting = [(k, w) for k, w in queued if not w.done()]  # callers cancelled meanwhile
        if not waiting:
            return
        try:
            if self._closed:
                raise ClientClosed("this cellar.AsyncClient is closed")
            deadline = None
            if len(waiting) == 1 and self._one is not None:
                value, deadline = await self._one(waiting[0][0])
                if value is not None:  # counted as a get by the one step
                    if not waiting[0][1].done():
                        waiting[0][1].set_result(value)
                    return
            started = time.perf_counter()
            entries = await self._run(operations.get_each(self._s, [k for k, _ in waiting],
                                                          deadline))
            wait_s = time.perf_counter() - started
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets it
            if isinstance(exc, asyncio.CancelledError) and self._closed:
                exc = ClientClosed("this cellar.AsyncClient was closed during the call")
            for _, waiter in waiting:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        # each caller is a request of its own; one recorder call counts them all
        metrics.record_requests("get", [e.size if e.status == Status.OK else None
                                        for e in entries], wait_s=wait_s,
                                tokens_per_key=self._s.tokens_per_key)
        for (_, waiter), entry in zip(waiting, entries, strict=True):
            try:
                value = operations.value_or_raise(entry)
            except CellarError as exc:
                if not waiter.done():
                    waiter.set_exception(exc)
                continue
            if not waiter.done():
                waiter.set_result(value)

    def close(self) -> list[asyncio.Task[None]]:
        """Fail the queued gets with ClientClosed; the batches in flight, for the client to
        cancel (their callers then get ClientClosed too)."""
        self._closed = True
        queued, self.queue = self.queue, []
        for _, waiter in queued:
            if not waiter.done():
                waiter.set_exception(ClientClosed("this cellar.AsyncClient was closed"))
        return [t for t in self.tasks if not t.done()]


__all__ = ["PIPELINED_GETS", "CoalescedGets", "OneGet"]
