"""Which face of the SDK a soak worker drives: the plain `cellar.Client` or `cellar.AsyncClient`.

Why
    The two faces share the sans-I/O core but not their I/O: the asyncio face has its own
    master channel, transports, pin releases and lone-call paths (client/aio.py, aio_gets.py:
    a loop turn's lone get made in one step). A soak that drove only the plain face put none
    of that under its faults. Workers of odd id drive the asyncio face by default
    (`cellar soak --faces both`), so every soak checks both against the same model.

What it owns
    `open_client`: a connected client of the face asked for, with the plain face's method names;
    `BlockingAsync`: an `AsyncClient` on this worker's own event loop, each call run to its end
    before the next (so each is a lone call: the one-step paths the asyncio face has for them).

What it must never do
    Hide an exception or change a result: a call's outcome is the face's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

FACES = ("sync", "async")
FACE_CHOICES = ("both", *FACES)


def face_of(choice: str, worker_id: int) -> str:
    """The face worker `worker_id` drives under `--faces choice` (both: odd ids asyncio)."""
    if choice == "both":
        return FACES[worker_id % 2]
    if choice not in FACES:
        raise ValueError(f"--faces must be one of {', '.join(FACE_CHOICES)}, got {choice!r}")
    return choice


class BlockingAsync:
    """An `AsyncClient` driven from a plain thread, one call at a time, on a loop of its own."""

    def __init__(self, cellar: Any, master: str, timeout_s: float) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._client = self._run(cellar.connect_async(master, timeout_s=timeout_s))
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

    def close(self) -> None:
        try:
            self._run(self._client.aclose())
        finally:
            self._loop.close()


def open_client(cellar: Any, face: str, master: str, timeout_s: float) -> Any:
    """A connected client of `face` ("sync" or "async") with the plain face's method names."""
    if face == "async":
        return BlockingAsync(cellar, master, timeout_s)
    return cellar.connect(master, timeout_s=timeout_s)
