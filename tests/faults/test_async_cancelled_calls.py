"""The asyncio face's calls cancelled mid-way against a real cluster: nothing they took is lost.

A cancelled call's GetReplicas may already be with the master (the master is stopped with
SIGSTOP here, so the request is surely sent and not yet answered when the caller is
cancelled by `task.cancel()` or `asyncio.wait_for`, or when the call's own `timeout_s`
passes). The master then pins the keys and answers; the caller is gone, but the pins it was
granted must still be released by the client (an Unpin), not left to the pin TTL (120 s
here, so a pin count of 0 proves the release). And the client stays usable, and a call that
times out leaves the other calls on the same fast-line connection alone.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from tests.support.pins import master_pin_count

KEYS = [f"cancel/{i}" for i in range(4)]


def value(i: int) -> bytes:
    return bytes([i + 1]) * (3000 + 100 * i)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(1, "64MiB", master_flags={"pin_ttl_s": 120})
    try:
        c.start()
        yield c
    finally:
        if c.master is not None and c.master.alive():
            c.signal_master(signal.SIGCONT)
        c.stop()


async def _pins_released(cluster: LocalCluster, wait_s: float = 20.0) -> float:
    """The master's pin count once it is 0, or after `wait_s` (far below the 120 s TTL); the
    loop keeps running meanwhile, so the client's release task can send its Unpin."""
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    while (pins := await asyncio.to_thread(master_pin_count, cluster)) and loop.time() < end:
        await asyncio.sleep(0.05)
    return pins


def _get_into(c: cellar.AsyncClient) -> Awaitable[Any]:
    return c.get_into(KEYS[0], bytearray(64 << 10))


def _get_many_into(c: cellar.AsyncClient) -> Awaitable[Any]:
    return c.get_many_into(KEYS, [bytearray(64 << 10) for _ in KEYS])


def _get(c: cellar.AsyncClient) -> Awaitable[Any]:
    return c.get(KEYS[1])


def _get_many(c: cellar.AsyncClient) -> Awaitable[Any]:
    return c.get_many(KEYS)


CALLS = [_get_into, _get_many_into, _get, _get_many]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call", CALLS, ids=[c.__name__.lstrip("_") for c in CALLS])
@pytest.mark.parametrize("how", ["cancel", "wait_for", "timeout_s"])
def test_a_get_cancelled_while_its_lookup_is_with_the_master_releases_its_pins(
        cluster: LocalCluster, call: Callable[[cellar.AsyncClient], Awaitable[Any]],
        how: str) -> None:
    async def body() -> None:
        async with cellar.AsyncClient(cluster.address, transport="tcp") as writer:
            await writer.put_many([(k, value(i)) for i, k in enumerate(KEYS)], upsert=True)
        # a fresh reader knows no key's place: its get asks the master first
        timeout_s = 1.0 if how == "timeout_s" else 30.0
        async with cellar.AsyncClient(cluster.address, transport="tcp",
                                      timeout_s=timeout_s) as reader:
            assert not await reader.exists("cancel/absent")  # the fast line is open
            assert await _pins_released(cluster) == 0
            cluster.signal_master(signal.SIGSTOP)
            try:
                if how == "cancel":
                    task = asyncio.ensure_future(call(reader))
                    await asyncio.sleep(0.5)  # its GetReplicas is sent, unanswered
                    assert not task.done()
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                elif how == "wait_for":
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(call(reader), 0.5)
                else:  # the call's own deadline passes while the master holds its request
                    with pytest.raises((cellar.Timeout, cellar.Unavailable)):
                        await call(reader)
            finally:
                cluster.signal_master(signal.SIGCONT)
            assert await _pins_released(cluster) == 0
            # and the client still answers right
            buf = bytearray(64 << 10)
            assert await reader.get_into(KEYS[2], buf) == len(value(2))
            assert bytes(buf[:len(value(2))]) == value(2)
            assert await reader.get_many(KEYS) == [value(i) for i in range(len(KEYS))]
        assert await _pins_released(cluster) == 0

    asyncio.run(body())


@pytest.mark.timeout(120)
def test_a_call_that_times_out_on_the_fast_line_leaves_the_others_on_it_alone(
        cluster: LocalCluster) -> None:
    """A deadline get whose GetReplicas outlives its budget (LATE) while another get waits on
    the same fast-line connection: the late one's reply is dropped when it comes (its pins
    released), and the other get is answered on the line it asked on. (A timeout on the fast
    line once counted as a broken line: the line was closed under the other call, whose
    request the master had already acted on, so its pins were never released, and it was sent
    again over gRPC.)"""
    async def body() -> None:
        async with cellar.AsyncClient(cluster.address, transport="tcp") as writer:
            await writer.put_many([(k, value(i)) for i, k in enumerate(KEYS)], upsert=True)
        async with cellar.AsyncClient(cluster.address, transport="tcp") as reader:
            assert not await reader.exists("cancel/absent")  # the fast line is open
            assert await _pins_released(cluster) == 0
            buf = bytearray(64 << 10)
            late_bufs = [bytearray(64 << 10) for _ in KEYS[1:]]
            cluster.signal_master(signal.SIGSTOP)
            try:
                plain = asyncio.ensure_future(reader.get_into(KEYS[0], buf))
                await asyncio.sleep(0.2)  # its GetReplicas is sent, unanswered
                got = await reader.get_many_into(KEYS[1:], late_bufs, timeout_s=0.3)
                assert got == [cellar.LATE] * len(late_bufs)
                assert not plain.done()
            finally:
                cluster.signal_master(signal.SIGCONT)
            assert await plain == len(value(0))
            assert bytes(buf[:len(value(0))]) == value(0)
            assert await _pins_released(cluster) == 0
        assert await _pins_released(cluster) == 0

    asyncio.run(body())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("call", [_get_into, _get_many_into], ids=["get_into", "get_many_into"])
def test_a_get_reading_early_cancelled_while_its_lookup_is_with_the_master_releases_its_pins(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
        call: Callable[[cellar.AsyncClient], Awaitable[Any]]) -> None:
    """A reader that knows where the keys are but does not trust it reads them early, beside
    its GetReplicas (client/early_reads.py); cancelled while that GetReplicas is with the
    master, its reply's pins are released too."""
    monkeypatch.setenv("CELLAR_TRUSTED_READS", "0")  # known places are read early, never trusted

    async def body() -> None:
        async with cellar.AsyncClient(cluster.address, transport="tcp") as writer:
            await writer.put_many([(k, value(i)) for i, k in enumerate(KEYS)], upsert=True)
        async with cellar.AsyncClient(cluster.address, transport="tcp") as reader:
            assert await reader.get_many(KEYS) == [value(i) for i in range(len(KEYS))]
            assert await _pins_released(cluster) == 0
            cluster.signal_master(signal.SIGSTOP)
            try:
                task = asyncio.ensure_future(call(reader))
                await asyncio.sleep(0.5)  # its early reads are done, its GetReplicas unanswered
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                cluster.signal_master(signal.SIGCONT)
            assert await _pins_released(cluster) == 0
            assert await reader.get_many(KEYS) == [value(i) for i in range(len(KEYS))]
        assert await _pins_released(cluster) == 0

    asyncio.run(body())
