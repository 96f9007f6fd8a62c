"""What the asyncio TCP transport (`tcp_async`) keeps per frame in flight and per batch.

A `Frame` is one chunk sent on a channel: its request id, where its reply goes, whether its
batch gave up on it (`cancelled`: the reader never touches its views again) and whether it is
finished. A `Wait` counts one batch's outstanding frames and wakes the batch when the last one
finishes. No I/O here: the channel's writer and reader tasks drive them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cellar.transfer.base import TransferResult
from cellar.transfer.frame import ST_OK
from cellar.transfer.tcp_plan import Chunk, Desync, Plan

__all__ = ["Desync", "Frame", "Wait", "wake"]  # Desync lives with the reply check (tcp_plan)

class Wait:
    """One batch's outstanding frames: a count and the future its caller awaits."""

    __slots__ = ("left", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop, left: int) -> None:
        self.left = left
        self.future: asyncio.Future[None] = loop.create_future()

    def one_done(self) -> None:
        self.left -= 1
        if self.left == 0 and not self.future.done():  # done: expired, or its caller cancelled
            self.future.set_result(None)


class Frame:
    """One chunk in flight: its request and where its reply goes."""

    __slots__ = ("chunk", "op_code", "plan", "wait", "rid", "cancelled", "done", "channel")

    def __init__(self, chunk: Chunk, op_code: int, plan: Plan, wait: Wait,
                 channel: Any) -> None:  # channel: the tcp_async._Channel it rides on
        self.chunk = chunk
        self.channel = channel
        self.op_code = op_code
        self.plan = plan
        self.wait = wait
        self.rid = 0
        self.cancelled = False  # its batch returned: never touch its views again
        self.done = False

    def finish(self, status: int = ST_OK, message: str = "") -> None:
        if self.done:
            return
        self.done = True
        fail = self.plan.fail
        op_i = self.chunk[0]
        if status != ST_OK and fail[op_i] is None:
            fail[op_i] = TransferResult(status, message)
        self.wait.one_done()


def wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
