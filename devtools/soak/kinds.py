"""Which kind of client a soak worker is: the SDK face it drives and the transport it moves bytes on.

Why
    The two faces share the sans-I/O core but not their I/O: the asyncio face has its own
    master channel, transports, pin releases and lone-call paths (client/aio.py, aio_gets.py:
    a loop turn's lone get made in one step). And on one host `transport="auto"` moves every
    byte over shared memory, so a soak of auto clients never put the tcp data path (the one
    between hosts) under its faults. By default (`--faces both --transports both`) worker i
    drives the asyncio face when i is odd and tcp when i // 2 is odd: four clients are the
    four kinds.

What it owns
    `face_of`, `transport_of`: a worker's kind under the run's choices; `open_client`: a
    connected client of that kind with the plain face's method names; `BlockingAsync`: an
    `AsyncClient` on this worker's own event loop, each call run to its end before the next
    (so each is a lone call: the one-step paths the asyncio face has for them).

What it must never do
    Hide an exception or change a result: a call's outcome is the face's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

FACES = ("sync", "async")
TRANSPORTS = ("auto", "tcp")  # auto: shared memory on the same host, as an engine beside a node
BOTH = "both"


def _of(choice: str, kinds: tuple[str, str], index: int, flag: str) -> str:
    if choice == BOTH:
        return kinds[index % 2]
    if choice not in kinds:
        raise ValueError(f"{flag} must be one of {BOTH}, {', '.join(kinds)}; got {choice!r}")
    return choice


def face_of(choice: str, worker_id: int) -> str:
    """The face worker `worker_id` drives under `--faces choice` (both: odd ids asyncio)."""
    return _of(choice, FACES, worker_id, "--faces")


def transport_of(choice: str, worker_id: int) -> str:
    """The transport worker `worker_id` uses under `--transports choice` (both: tcp when
    worker_id // 2 is odd, so the first four workers are the four kinds)."""
    return _of(choice, TRANSPORTS, worker_id // 2, "--transports")


class BlockingAsync:
    """An `AsyncClient` driven from a plain thread, one call at a time, on a loop of its own."""

    def __init__(self, cellar: Any, master: str, timeout_s: float, transport: str) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._client = self._run(cellar.connect_async(master, timeout_s=timeout_s,
                                                          transport=transport))
        except BaseException:
            self._loop.close()
            raise

    def _run(self, call: Coroutine[Any, Any, Any]) -> Any:
        return self._loop.run_until_complete(call)

    @property
    def _s(self) -> Any:  # the session the worker's counters read (worker.py `_counted`)
        return self._client._s  # noqa: SLF001 - the soak reads the SDK's own counters

    def put(self, key: str, value: bytes, **kwargs: Any) -> Any:
        return self._run(self._client.put(key, value, **kwargs))

    def upsert(self, key: str, value: bytes, **kwargs: Any) -> Any:
        return self._run(self._client.upsert(key, value, **kwargs))

    def get(self, key: str) -> bytes:
        return self._run(self._client.get(key))  # type: ignore[no-any-return]

    def remove(self, key: str) -> bool:
        return bool(self._run(self._client.remove(key)))

    def put_many(self, items: list[tuple[str, bytes]], **kwargs: Any) -> Any:
        return self._run(self._client.put_many(items, **kwargs))

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return self._run(self._client.get_many(keys))  # type: ignore[no-any-return]

    def get_many_into(self, keys: list[str], buffers: list[bytearray], **kwargs: Any) -> list[int]:
        return self._run(self._client.get_many_into(keys, buffers, **kwargs))  # type: ignore[no-any-return]

    def remove_many(self, keys: list[str]) -> list[bool]:
        return self._run(self._client.remove_many(keys))  # type: ignore[no-any-return]

    def close(self) -> None:
        try:
            self._run(self._client.aclose())
        finally:
            self._loop.close()


def open_client(cellar: Any, face: str, transport: str, master: str, timeout_s: float) -> Any:
    """A connected client of `face` ("sync" or "async") on `transport` ("auto" or "tcp"), with
    the plain face's method names."""
    if face == "async":
        return BlockingAsync(cellar, master, timeout_s, transport)
    return cellar.connect(master, timeout_s=timeout_s, transport=transport)
