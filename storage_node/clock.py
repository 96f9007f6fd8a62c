"""MasterClock: this node's view of the master's wall clock and epoch.

Grants carry an expiry in master wall-clock milliseconds and the epoch of the master that
signed them. The node learns both from every MountSegment and Heartbeat reply header:
the clock offset is `master_time_ms - local midpoint of the RPC`, and the epoch is the one of
the master the node is mounted on. Between replies the estimate runs on the local clock, so
grant checks keep working while the master is briefly unreachable; `allowed_skew_ms` in the
grant check absorbs the estimate's error.

Invariant: `epoch` is only changed by a successful mount (control loop); data-plane threads
only read it. Reads and writes of two ints are atomic under the GIL, so no lock is needed.
It never talks to the network itself.
"""

from __future__ import annotations

import time


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class MasterClock:
    def __init__(self) -> None:
        self.offset_ms = 0
        self.epoch = 0  # 0 = not mounted yet: only grants of any epoch >= 0, none are issued
        self.synced = False

    def now_ms(self) -> int:
        """Estimated master wall clock."""
        return wall_ms() + self.offset_ms

    def observe(self, master_time_ms: int, sent_local_ms: int, received_local_ms: int) -> None:
        """Learn the offset from one reply; the master read its clock about mid-RPC."""
        if master_time_ms <= 0:
            return
        midpoint = (sent_local_ms + received_local_ms) // 2
        self.offset_ms = master_time_ms - midpoint
        self.synced = True
