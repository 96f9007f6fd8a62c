"""The asyncio fast line's abandoned calls (client/aio_rpc.py `AsyncFastLine.call`'s `orphan`):
a caller that gives up after its request left still has its reply handed to `orphan` (the
face releases a GetReplicas's pins there), whichever of the two comes first: the reply or the
caller's task seeing its cancellation. No sockets: the pipe's transport is a fake, and the
replies are fed to `data_received` by hand."""

from __future__ import annotations

import asyncio

import pytest

from cellar.client import aio_rpc
from cellar.client.aio_rpc import AsyncFastLine, _Pipe
from cellar.proto import fastline


class _Wire:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def close(self) -> None:
        pass


def _line() -> tuple[AsyncFastLine, _Pipe]:
    line = AsyncFastLine("127.0.0.1", 9)
    pipe = _Pipe()
    pipe.transport = _Wire()  # type: ignore[assignment]
    line._pipes = [pipe]
    return line, pipe


def _reply(body: bytes) -> bytes:
    return fastline.pack_head(len(body), fastline.OK_CODE) + body


@pytest.mark.parametrize("order", ["reply_before_the_task_resumes", "reply_after",
                                   "reply_then_cancel"])
def test_the_reply_of_a_cancelled_call_goes_to_its_orphan(order: str) -> None:
    async def main() -> None:
        line, pipe = _line()
        taken: list[tuple[int, bytes]] = []
        call = asyncio.ensure_future(line.call(7, b"ask", 10.0,
                                               orphan=lambda c, d: taken.append((c, d))))
        await asyncio.sleep(0)  # the request is sent; the call awaits its reply
        assert pipe.transport.sent  # type: ignore[union-attr]
        if order == "reply_then_cancel":  # answered, then cancelled before it resumed
            pipe.data_received(_reply(b"pins"))
            call.cancel()
        else:
            call.cancel()
            if order == "reply_before_the_task_resumes":
                pipe.data_received(_reply(b"pins"))
        with pytest.raises(asyncio.CancelledError):
            await call
        if order == "reply_after":
            pipe.data_received(_reply(b"pins"))
        assert taken == [(fastline.OK_CODE, b"pins")]
        assert not pipe.orphans and not pipe.pending

    asyncio.run(main())


def test_an_answered_call_leaves_no_orphan_behind() -> None:
    async def main() -> None:
        line, pipe = _line()
        taken: list[tuple[int, bytes]] = []
        call = asyncio.ensure_future(line.call(7, b"ask", 10.0,
                                               orphan=lambda c, d: taken.append((c, d))))
        await asyncio.sleep(0)
        pipe.data_received(_reply(b"mine"))
        assert await call == (fastline.OK_CODE, b"mine")
        assert taken == [] and not pipe.orphans

    asyncio.run(main())


def test_a_call_that_times_out_raises_timeout_and_keeps_the_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TimeoutError is an OSError: it once counted as a broken line (_FastLineDown), which
    closed the connection under every other call on it."""
    monkeypatch.setattr(aio_rpc, "FAST_ASYNC_CONNECTIONS", 1)  # both calls on the one pipe
    async def main() -> None:
        line, pipe = _line()
        taken: list[tuple[int, bytes]] = []
        other = asyncio.ensure_future(line.call(7, b"other", 10.0))
        await asyncio.sleep(0)
        with pytest.raises(TimeoutError):
            await line.call(7, b"late", 0.05, orphan=lambda c, d: taken.append((c, d)))
        assert not pipe.down and not other.done()
        pipe.data_received(_reply(b"for other") + _reply(b"for late"))
        assert await other == (fastline.OK_CODE, b"for other")
        assert taken == [(fastline.OK_CODE, b"for late")]

    asyncio.run(main())
