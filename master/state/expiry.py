"""Expiry queues: which pins or puts ran out of time, oldest first, at a few bytes per batch.

Owns `ExpiryRuns`, the FIFO behind the pin TTL sweep (cellar.master.state.pins) and the writer
timeout sweep (cellar.master.state.objects). Both hand out ids from a counter and give every id the
same TTL from one clock reading per request, so creation order is expiry order and a batched
request's ids are consecutive with one expiry time. The queue keeps runs [expires_at, first
id, last id] instead of one (expires_at, id) tuple per id: at 50k keys/s a 30 s write TTL held
1.5M tuples (~100 MiB) in the per-id form; runs hold one small list per request.

Invariant: runs are in non-decreasing expiry order, each run's ids are consecutive and every id
added and not yet popped is in exactly one run. It only tracks ids: whether an id is still live
(unpinned, completed) is the caller's business when it pops.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator


class ExpiryRuns:
    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: deque[list[float | int]] = deque()

    def __len__(self) -> int:
        """Runs queued (not ids)."""
        return len(self._runs)

    def add(self, expires_at: float, id_: int) -> None:
        """Queue `id_`; calls come in non-decreasing `expires_at` order (one TTL, one clock)."""
        runs = self._runs
        if runs:
            tail = runs[-1]
            if tail[2] == id_ - 1 and tail[0] == expires_at:
                tail[2] = id_
                return
        runs.append([expires_at, id_, id_])

    def pop_due(self, now: float) -> Iterator[int]:
        """Ids whose expiry is at or before `now`, oldest first, each popped once. Consume it
        to the end: a run leaves the queue as a whole before its ids are yielded."""
        runs = self._runs
        while runs and runs[0][0] <= now:
            _, first, last = runs.popleft()
            yield from range(int(first), int(last) + 1)
