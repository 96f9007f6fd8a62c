"""The freed-range notices a node's heartbeats bring, and their acknowledgement.

A heartbeat reply carries the ranges the master freed on this node (`freed`, up to
`freed_seq`): they are applied to the index first (storage_node/index.py `apply_freed`,
idempotent) and acknowledged (`freed_ack_seq`) in the next heartbeat, so the master never
forgets a notice the node has not applied. That next heartbeat comes ACK_SOON_S after one
that brought notices, at most once per interval: until the master hears the acknowledgement,
a shm/rdma write over such a range must claim it first (master/state/read_frees.py), one
more round trip to this node per put batch. A mount starts the count again (`reset`).
While a range the notices dropped is still draining (a READ reply of the freed object not yet
with the kernel, storage_node/inflight.py), nothing is acknowledged: a shm/rdma writer that did
not claim would copy into that range without asking this node. The master sends the notices
again meanwhile (applied idempotently); the drain ends by the read grant's expiry at the latest.

It never talks to the master: the master link (master_link.py) sends and receives.
"""

from __future__ import annotations

from typing import Any

from cellar.storage_node.index import ObjectIndex

ACK_SOON_S = 0.05


class FreedAcks:
    def __init__(self) -> None:
        self.ack_seq = 0   # the newest notice applied: what the next heartbeat acknowledges
        self.seen_seq = 0  # the newest notice applied, acknowledged once nothing drains
        self.applied = 0   # index entries dropped by notices, ever
        self._ack_soon = False  # the last heartbeat brought notices: acknowledge soon
        self._acking = False    # the heartbeat in flight is such an acknowledgement

    def reset(self) -> None:
        """A new mount: the master counts notices for this incarnation afresh."""
        self.ack_seq = 0
        self.seen_seq = 0

    def take(self, reply: Any, index: ObjectIndex, now_ms: int) -> None:
        """Apply a heartbeat reply's notices to `index` and note their seq to acknowledge."""
        if reply.freed:
            self.applied += index.apply_freed(reply.freed, now_ms)
        self.seen_seq = max(self.seen_seq, reply.freed_seq)
        if self.seen_seq > self.ack_seq and not index.draining():
            self.ack_seq = self.seen_seq
            # an acknowledgement soon, unless this heartbeat was one (at most one per interval)
            self._ack_soon = not self._acking
        self._acking = self._ack_soon

    def next_interval_s(self, interval_s: float) -> float:
        """How long until the next heartbeat: ACK_SOON_S once after notices, else `interval_s`."""
        if self._ack_soon:
            self._ack_soon = False
            return min(interval_s, ACK_SOON_S)
        return interval_s
