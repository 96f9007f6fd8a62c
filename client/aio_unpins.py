"""AsyncUnpins: the asyncio face's pin releases that no GetReplicas carried.

A get's pins are released with the client's next GetReplicas (client/session_state.py
`UnpinQueue`). Releases that wait longer than `UNPIN_DELAY_S` (or fill the queue) go on an
Unpin call of their own, sent by a task on the client's loop so no caller waits for them; the
client's close sends what is left (best effort: the master's pin TTL releases the rest). The
sync face does the same from a thread (client/unpin_flusher.py). The call itself is the
face's `call` (its master channel); this module imports no transport.

A GetReplicas given up while its request is with the master (its caller cancelled by
`task.cancel()` or `asyncio.wait_for`, or its own deadline passed) still pins what the master
grants: `lookup` has the pins of its reply, when it comes, queued for release as a get that
read them would (dropped unread, they were held until the master's pin TTL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cellar.client import flows
from cellar.client.checks import UNPIN_DELAY_S, UNPIN_FLUSH_TIMEOUT_S
from cellar.client.flows import Rpc, Session
from cellar.errors import CellarError

__all__ = ["AsyncUnpins"]

T = TypeVar("T")


class AsyncUnpins:
    """The release task of one `AsyncClient` (its loop, its session, its master call)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, s: Session,
                 call: Callable[..., Awaitable[Any]]) -> None:
        self._loop = loop
        self._s = s
        self._call = call
        self.task: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._stopped = False

    def release(self, pin_ids: list[int]) -> None:
        """Queue pins; they ride on the next GetReplicas, or a loop task sends them after
        UNPIN_DELAY_S (at once when the queue is full)."""
        if not pin_ids:
            return
        if self._s.unpins.add(pin_ids):
            self._spawn()
        else:
            self._schedule()

    def lookup(self, request: Any, deadline: float) -> Awaitable[Any]:
        """GetReplicas `request` by `deadline`. Given up after its request left (the caller
        cancelled, the call timed out), its reply still has its pins queued for release when
        it comes (over the fast line; `AsyncMasterChannel.call`'s `orphan`)."""
        return self._call("GetReplicas", request, deadline, orphan=self.release_reply)

    async def lookup_beside(self, request: Any, deadline: float,
                            move: Awaitable[T]) -> tuple[Any, T]:
        """`lookup` and `move` at once (a get's early reads beside its GetReplicas); returns,
        or raises the call's error (else the move's), only once both ended. A reply that no
        caller takes then (cancelled as the move went on, or the move raised) has its pins
        queued for release."""
        call: asyncio.Future[Any] = asyncio.ensure_future(self.lookup(request, deadline))
        reply: Any
        moved: Any
        try:
            reply, moved = await asyncio.gather(call, move, return_exceptions=True)
        except asyncio.CancelledError:
            if call.done() and not call.cancelled() and call.exception() is None:
                self.release_reply(call.result())
            raise
        for outcome in (reply, moved):
            if isinstance(outcome, BaseException):
                if not isinstance(reply, BaseException):
                    self.release_reply(reply)
                raise outcome
        return reply, moved

    def release_reply(self, reply: Any) -> None:
        """Queue the pins of a GetReplicas reply that no caller takes."""
        self.release([int(r.pin_id) for r in reply.results if r.pin_id])

    def stop(self) -> None:
        """No new task from now on (the client is closing; it cancels `task` itself)."""
        self._stopped = True
        if self._handle is not None:
            self._handle.cancel()

    def _schedule(self) -> None:
        if self._handle is None and self.task is None and not self._stopped:
            self._handle = self._loop.call_later(UNPIN_DELAY_S, self._spawn)

    def _spawn(self) -> None:
        self._handle = None
        if self.task is None and not self._stopped:
            self.task = self._loop.create_task(self.flush(1, UNPIN_FLUSH_TIMEOUT_S))

    async def flush(self, max_calls: int, timeout_s: float) -> None:
        """Send up to `max_calls` Unpin calls of what is queued; never raises a master error
        (the master's pin TTL releases what could not be sent)."""
        s = self._s
        try:
            for _ in range(max_calls):
                ids = s.unpins.drain(s.unpin_batch())
                if not ids:
                    return
                effect = next(flows.unpin(s, ids, timeout_s))
                assert isinstance(effect, Rpc)
                try:
                    await self._call(effect.method, effect.request, effect.deadline)
                except (CellarError, ValueError, RuntimeError):
                    return  # the master's pin TTL releases them; never fail a caller for this
        finally:
            if asyncio.current_task() is self.task:
                self.task = None
                if len(s.unpins):
                    self._schedule()  # more arrived meanwhile: the next round
