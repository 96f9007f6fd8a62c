"""A thread pool started at its first use and closed for good: helper threads a transfer or a
client face may never need (the shm copier's second thread, the sync face's put hashers).

What it owns
    `LazyPool`: `get()` the pool, starting it the first time (None once closed: the caller
    does the work itself); `close()` stops it after the work it holds. Thread-safe.

What it must never do
    Start a thread after `close`, or at construction.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["LazyPool"]


class LazyPool:
    """`threads` helper threads named `name`-N, started by the first `get`."""

    def __init__(self, threads: int, name: str) -> None:
        self._threads = threads
        self._name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def get(self) -> ThreadPoolExecutor | None:
        """The pool, started if it was not; None once closed (a call racing `close`)."""
        with self._lock:
            if self._closed:
                return None
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads,
                                                    thread_name_prefix=self._name)
            return self._executor

    def close(self) -> None:
        """Stop the threads once their work ended; later `get`s answer None."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
