"""A small bounded log of what an operator wants to see happen: failovers, rebuilds, expiries.

The status page (`cellar.master.serving.status_page`), `/api/v1/events` and `cellar top` show it.
It holds at most `MAX_EVENTS` entries (oldest dropped), so a flapping node cannot grow the
master's memory; each entry is a wall-clock time, a kind and one line of text. The log lives
in `Leadership`, not in a `MasterService`, so it survives a takeover that replaces the service.
It records; it never decides anything.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

MAX_EVENTS = 200
MAX_MESSAGE_CHARS = 300

# kinds the master records (the page colours them; anything else is shown plainly)
NODE_EXPIRED = "node_expired"
ELECTED = "elected"
DEPOSED = "deposed"
NEW_LEADER = "new_leader"
REBUILD_DONE = "rebuild_done"


@dataclass(frozen=True)
class Event:
    time_s: float  # Unix time
    kind: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"time": round(self.time_s, 3), "kind": self.kind, "message": self.message}


class EventLog:
    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        assert max_events >= 1
        self._events: deque[Event] = deque(maxlen=max_events)
        self.recorded_total = 0

    def record(self, kind: str, message: str) -> None:
        self._events.append(Event(time.time(), kind, message[:MAX_MESSAGE_CHARS]))
        self.recorded_total += 1

    def recent(self, limit: int = MAX_EVENTS) -> list[Event]:
        """Newest first, at most `limit`."""
        out = list(self._events)[-limit:] if limit > 0 else []
        out.reverse()
        return out
