"""Hashing put values on helper threads while PutStart is in flight (the sync face's).

Why
    The master needs only a put's sizes at PutStart; the values' checksums are needed only
    once the writes go out. xxh3 releases the GIL on long inputs, so a helper thread hashes a
    batch's values while the caller waits for PutStart's reply. (The asyncio face does not: it
    ignores `Rpc.hash_behind` and hashes when it plans the writes, `PutBatch.on_start_reply`,
    on its event loop.) Below HASH_BEHIND_MIN_BYTES to hash, the thread hop costs more than the
    overlap saves, and the values are hashed inline (`PutBatch.on_start_reply`).

    A batch with at least SPLIT_MIN_BYTES to hash is split in two halves of about the same
    bytes, one per thread: there the hashing, not PutStart, is what the writes wait for (16 x
    4 MiB took 4.6 ms to hash on one thread, PutStart's reply 0.5-1.2 ms), and the other core
    has little else to do meanwhile. Measured over tcp, 10 alternated blocks each way a run:
    16 x 4 MiB puts 1.03-1.07x in four runs, 16 x 2 MiB 1.08x; split too, 16 x 1 MiB ran
    0.99-1.01x in two runs and 16 x 256 KiB 0.96x (their hashing ends near PutStart's reply
    anyway), hence the floor (docs/benchmarks.md, session 37).

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
SPLIT_MIN_BYTES = 32 << 20        # a batch with this much to hash is hashed on two threads
HASH_THREADS = 2                  # shared by every call of one client


class HashBehind:
    """The helper threads that hash put values behind a call."""

    def __init__(self) -> None:
        self._pool = LazyPool(HASH_THREADS, "cellar-hash")

    def around(self, entries: Sequence[PutEntry], call: Callable[[], T]) -> T:
        """`call()`, with `entries` hashed on helper threads meanwhile when there is enough
        to hash; returns once both ended (else the copy hashes them inline)."""
        hashing: list[futures.Future[None]] = []
        to_hash = unhashed_bytes(entries)
        if to_hash >= HASH_BEHIND_MIN_BYTES:
            pool = self._pool.get()  # None: a put racing close() hashes inline
            if pool is not None:
                halves = split_by_bytes(entries, to_hash) if to_hash >= SPLIT_MIN_BYTES \
                    else (entries,)
                for half in (h for h in halves if h):
                    try:
                        hashing.append(pool.submit(hash_values, half))
                    except RuntimeError:  # closed meanwhile: the rest is hashed inline
                        break
        try:
            return call()
        finally:
            if hashing:
                futures.wait(hashing)

    def close(self) -> None:
        """Stop the threads once their work ended; later calls hash inline."""
        self._pool.close()


def split_by_bytes(entries: Sequence[PutEntry],
                   to_hash: int) -> tuple[Sequence[PutEntry], Sequence[PutEntry]]:
    """`entries` cut in two, in order, where the first part's unhashed bytes reach half of
    `to_hash` (theirs in all)."""
    done = 0
    for i, e in enumerate(entries):
        if done * 2 >= to_hash:
            return entries[:i], entries[i:]
        if e.checksum is None:
            done += e.nbytes
    return entries, ()


__all__ = ["HASH_BEHIND_MIN_BYTES", "HASH_THREADS", "SPLIT_MIN_BYTES", "HashBehind",
           "split_by_bytes"]
