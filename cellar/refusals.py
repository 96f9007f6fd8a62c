"""Refusal lines a hostile peer cannot flood: at most one log line per peer per interval.

Every server in Cellar says no to strangers: the master to a bad credential (gRPC, fast line,
HTTP), a storage node to a forged grant or commit, or to a connection that never showed one.
Each refusal is counted in a metric by reason (the caller's counters); this module decides
only what reaches the log. A peer that sends a thousand bad requests a second must cost the
log one line per `interval_s`, not a thousand, and never a traceback.

`RefusalLog.note(peer, reason, detail)` logs the first refusal of a peer at once and then at
most one line per `interval_s` for it; each line says how many refusals it stands for since
the previous line of that peer. Peers are remembered in a bounded table (`max_peers` entries); when it
is full, entries whose interval has passed are dropped, and if none has, refusals of new peers
share one entry named `OTHER_PEERS`, so the table cannot grow and the log cannot be flooded by
changing source address either. The detail is cut to DETAIL_CHARS and quoted (`repr`), so
bytes from the network cannot forge log lines.

`PEER` is the address of the connection being served, set by a server once per connection
task (asyncio servers run each connection in its own task), so code deep in a request (the
master's Authorizer) can name the peer without threading it through every call.

It never raises into a caller and never holds its lock while logging. Thread-safe (the node's
data server calls it from its connection threads).
"""

from __future__ import annotations

import logging
import threading
import time
from contextvars import ContextVar

DEFAULT_INTERVAL_S = 10.0
DEFAULT_MAX_PEERS = 1024
DETAIL_CHARS = 200
OTHER_PEERS = "(other peers)"
PEER: ContextVar[str] = ContextVar("cellar_peer", default="")


class RefusalLog:
    """Rate-limited refusal lines, one table of peers (module docstring)."""

    def __init__(self, logger: logging.Logger, what: str, *,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 max_peers: int = DEFAULT_MAX_PEERS) -> None:
        if interval_s <= 0 or max_peers <= 0:
            raise ValueError("interval_s and max_peers must be positive")
        self._log = logger
        self._what = what  # e.g. "master", "data port": the line's subject
        self.interval_s = interval_s
        self.max_peers = max_peers
        self._lock = threading.Lock()
        # peer -> [refusals not yet reported, monotonic time its next line may be written]
        self._peers: dict[str, list[float]] = {}
        self.lines = 0  # lines written (tests and metrics read it)

    def note(self, peer: str, reason: str, detail: str = "") -> None:
        """One refusal of `peer` for `reason`; logs a line if this peer's interval allows."""
        now = time.monotonic()
        with self._lock:
            key = peer or "unknown"
            entry = self._peers.get(key)
            if entry is None:  # room for max_peers - 1 peers and the shared OTHER_PEERS
                if len(self._peers) >= self.max_peers - 1:
                    self._forget_quiet(now)
                if len(self._peers) >= self.max_peers - 1:
                    key = OTHER_PEERS
                    entry = self._peers.get(key)
                if entry is None:
                    entry = self._peers[key] = [0, 0.0]
            entry[0] += 1
            if now < entry[1]:
                return
            count = int(entry[0])
            entry[0], entry[1] = 0, now + self.interval_s
            self.lines += 1
        self._log.warning("%s refused %s: %s %r (%d refusal%s from it since its last line; "
                          "at most one line per %g s)", self._what, key, reason,
                          detail[:DETAIL_CHARS], count, "" if count == 1 else "s",
                          self.interval_s)

    def _forget_quiet(self, now: float) -> None:
        """Drop peers whose interval has passed (their unreported count is lost: at most one
        interval's worth, already counted in the metrics)."""
        for peer in [p for p, (_, next_at) in self._peers.items() if next_at <= now]:
            del self._peers[peer]
