"""Repairer: re-replication and node drain, the behaviour over the repair queue.

What it owns: when the queue (master/state/repair.py) runs (every tick, never while the
master's table is still being rebuilt from the nodes' reports: an object then looks short only
because its other node has not reported yet), the copy orders a target node receives in its
heartbeat reply, with the grants signed there (`CopyOrder`: a read grant on the source
replica, a write grant on the new range, both under this master's epoch and expiring after
`write_grant_ttl_s`), the check of the node's reports (`CopyDone`, in its next heartbeat), and
the drain an admin asks for (`drain`, `drain_status`).

The copy itself is the nodes' business (storage_node/copier.py): the target reads the source
over the data plane with the read grant, into its own range, checks the xxh3 against the
object's checksum, seals it, and reports (alloc id, segment, offset, length, checksum) with
the write receipt its seal signed (proto/receipt.py), as any writer's PutEnd must. The master
takes the report only if the receipt is valid for exactly the allocation it granted and every
field matches it (state/repair.py): a report of a copy that was not sealed counts as failed.

Drain: the node takes no new placements (state/membership.py), its replicas stop counting
towards their objects' counts, so each of its objects is copied elsewhere (oldest watched
first, at the same paced rate); the drain is done when no object on it is short elsewhere.
The node keeps serving its replicas meanwhile; stopping it then loses nothing.

Limits: at most `max_batch_keys` reports per heartbeat are looked at (the rest are ignored and
their copies expire), at most `repair_copies_per_heartbeat` orders go out per reply. It never
touches payload bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.receipts import ReceiptChecker
from cellar.master.replies import GrantedReplica, GrantIssuer
from cellar.master.requests import Clock, check_batch, valid_id
from cellar.master.state.membership import Membership
from cellar.master.state.records import Replica, Segment
from cellar.master.state.repair import CopyTask, RepairQueue
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE


@dataclass
class CopyOrder:
    """One copy as a target node receives it (the servicer turns it into a proto CopyTask)."""

    tenant: str
    key: str
    length: int
    checksum: int
    source: GrantedReplica
    source_segment: Segment
    target: GrantedReplica
    value_alloc_id: int  # the value's version (records.Obj.version), which the copy keeps


@dataclass
class DrainStatus:
    node_id: str
    draining: bool
    remaining_objects: int
    remaining_bytes: int

    @property
    def done(self) -> bool:
        return self.draining and self.remaining_objects == 0

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "draining": self.draining, "done": self.done,
                "remaining_objects": self.remaining_objects,
                "remaining_bytes": self.remaining_bytes}


class DrainRefused(Exception):
    """The node cannot be drained (unknown); the message says why."""


class Repairer:
    def __init__(self, config: MasterConfig, clock: Clock, grants: GrantIssuer,
                 membership: Membership, queue: RepairQueue, recovering: Any,
                 receipts: ReceiptChecker) -> None:
        self.config = config
        self.receipts = receipts
        self.clock = clock
        self.grants = grants
        self.membership = membership
        self.queue = queue
        self._recovering = recovering  # () -> bool: the table may still miss reported objects
        self.reports_refused = 0

    def tick(self) -> None:
        if self._recovering():
            return
        now = self.clock.monotonic()
        self.queue.expire(now)
        self.queue.plan(now)

    # ---------------------------------------------------------------- the target node

    def on_heartbeat(self, node_id: str, incarnation: int, copied: Sequence[Any]) -> list[CopyOrder]:
        """Take a mounted node's copy reports, then give it its next copy orders."""
        node = self.membership.nodes.get(node_id)
        if node is None or node.incarnation != incarnation:
            return []
        now = self.clock.monotonic()
        if copied:
            check_batch(len(copied), self.config.max_batch_keys, "copy reports")
            for done in copied:
                alloc_id = int(done.alloc_id)
                if not valid_id(alloc_id):
                    self.reports_refused += 1
                    continue
                ok = int(done.status) == Status.OK and self.receipts.proves(
                    bytes(done.receipt), alloc_id, int(done.segment_id), int(done.offset),
                    int(done.length), int(done.checksum))
                if not self.queue.finish(node, alloc_id, int(done.segment_id), int(done.offset),
                                         int(done.length), int(done.checksum), ok, now):
                    self.reports_refused += int(done.status) == Status.OK
        tasks = self.queue.take_for(node, now, self.config.repair_copies_per_heartbeat)
        return [self._order(task) for task in tasks]

    def _order(self, task: CopyTask) -> CopyOrder:
        obj = task.obj
        expiry_ms = self.clock.wall_ms() + int(self.config.write_grant_ttl_s * 1000)
        segments: dict[int, Segment] = {}
        source = self.grants.one(obj, task.source, GRANT_OP_READ, expiry_ms, segments)
        target = self.grants.one(obj, Replica(task.target, task.offset, task.alloc_id),
                                 GRANT_OP_WRITE, expiry_ms, segments)
        return CopyOrder(obj.tenant.name, obj.key, obj.size, obj.checksum, source,
                         task.source.segment, target, obj.version)

    # ---------------------------------------------------------------- drain

    def drain(self, node_id: str) -> DrainStatus:
        """Start draining `node_id` (idempotent) and say how far it is."""
        node = self.membership.nodes.get(node_id)
        if node is None:
            raise DrainRefused(f"node {node_id!r} is not mounted")
        self.membership.drain(node)
        return self.drain_status(node_id)

    def drain_status(self, node_id: str) -> DrainStatus:
        node = self.membership.nodes.get(node_id)
        if node is None:
            raise DrainRefused(f"node {node_id!r} is not mounted")
        if not node.draining:
            return DrainStatus(node_id, False, 0, 0)
        remaining, nbytes = self.queue.drain_remaining(node)
        return DrainStatus(node_id, True, remaining, nbytes)
