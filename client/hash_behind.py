"""Hashing put values on helper threads while PutStart is in flight (the sync face's).

Why
    The master needs only a put's sizes at PutStart; the values' checksums are needed only
    once the writes go out. xxh3 releases the GIL on long inputs, so a helper thread hashes a
    batch's values while the caller waits for PutStart's reply (the asyncio face overlaps the
    same way on its own loop). Below HASH_BEHIND_MIN_BYTES to hash, the thread hop costs more
    than the overlap saves, and the values are hashed inline (`PutBatch.on_start_reply`).

What it owns
    `HashBehind`: at most HASH_THREADS threads shared by every call of one client, started at
    the first batch that needs them, stopped by `close`. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from cellar.client.puts import PutEntry, hash_values, unhashed_bytes

T = TypeVar("T")

HASH_BEHIND_MIN_BYTES = 1 << 20
HASH_THREADS = 2                  # shared by every call of one client


class HashBehind:
    """The helper threads that hash put values behind a call."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def around(self, entries: Sequence[PutEntry], call: Callable[[], T]) -> T:
        """`call()`, with `entries` hashed on a helper thread meanwhile when there is enough
        to hash; returns once both ended (else the copy hashes them inline)."""
        hashing = None
        if unhashed_bytes(entries) >= HASH_BEHIND_MIN_BYTES:
            with self._lock:
                if not self._closed:  # a put racing close(): no new thread
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(HASH_THREADS,
                                                        thread_name_prefix="cellar-hash")
                    hashing = self._pool.submit(hash_values, entries)
        try:
            return call()
        finally:
            if hashing is not None:
                futures.wait([hashing])

    def close(self) -> None:
        """Stop the threads once their work ended; later calls hash inline."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["HASH_BEHIND_MIN_BYTES", "HASH_THREADS", "HashBehind"]
