"""UnpinFlusher: the sync face's thread that sends pin releases no GetReplicas carried.

A get's pins are released with the client's next GetReplicas (client/session_state.py
`UnpinQueue`); releases that wait longer than `UNPIN_DELAY_S` go on their own Unpin call,
sent from this thread so no caller waits for them. (The asyncio face schedules the same on its
event loop.) Imports no transport; the call itself is the face's `send`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cellar.client.session_state import UnpinQueue
from cellar.errors import CellarError
from cellar.transfer.spin_wait import never_spin_in_this_thread

__all__ = ["UnpinFlusher"]


class UnpinFlusher:
    """Sends queued pin releases that no GetReplicas carried within `UNPIN_DELAY_S`."""

    def __init__(self, queue: UnpinQueue, send: Callable[[list[int]], None],
                 max_ids: Callable[[], int]) -> None:
        self._queue = queue
        self._send = send
        self._max_ids = max_ids  # the master's batch limit applies to pin ids too
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cellar-unpin", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        never_spin_in_this_thread()  # nobody waits on these calls: block, leave the CPU
        while self._queue.wait_due():
            self.flush()

    def flush(self, max_calls: int = 1) -> None:
        for _ in range(max_calls):
            ids = self._queue.drain(self._max_ids())
            if not ids:
                return
            try:
                self._send(ids)
            except (CellarError, ValueError):  # ValueError: channel closed under us
                return  # the master's pin TTL releases them; never fail a caller for this

    def stop(self, join_timeout_s: float = 0.0) -> None:
        self._queue.close()
        thread = self._thread
        if thread is not None and join_timeout_s > 0 and thread is not threading.current_thread():
            thread.join(join_timeout_s)
