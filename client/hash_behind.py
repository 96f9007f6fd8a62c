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

from collections.abc import Callable, Sequence
from concurrent import futures
from typing import TypeVar

from cellar.client.puts import PutEntry, hash_values, unhashed_bytes
from cellar.transfer.lazy_pool import LazyPool

T = TypeVar("T")

HASH_BEHIND_MIN_BYTES = 1 << 20
HASH_THREADS = 2                  # shared by every call of one client


class HashBehind:
    """The helper threads that hash put values behind a call."""

    def __init__(self) -> None:
        self._pool = LazyPool(HASH_THREADS, "cellar-hash")

    def around(self, entries: Sequence[PutEntry], call: Callable[[], T]) -> T:
        """`call()`, with `entries` hashed on a helper thread meanwhile when there is enough
        to hash; returns once both ended (else the copy hashes them inline)."""
        hashing = None
        if unhashed_bytes(entries) >= HASH_BEHIND_MIN_BYTES:
            pool = self._pool.get()  # None: a put racing close() hashes inline
            if pool is not None:
                hashing = pool.submit(hash_values, entries)
        try:
            return call()
        finally:
            if hashing is not None:
                futures.wait([hashing])

    def close(self) -> None:
        """Stop the threads once their work ended; later calls hash inline."""
        self._pool.close()


__all__ = ["HASH_BEHIND_MIN_BYTES", "HASH_THREADS", "HashBehind"]
