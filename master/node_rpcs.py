"""Node RPCs and the tick: what storage nodes ask of the master, and the background work.

`NodeRpcs` is the part of `MasterService` that nodes drive: MountSegment, ReportObjects
(adoption itself is master/rebuild.py), UnmountSegment, Heartbeat (with corrupt ranges a node
lost), node expiry, and `tick`, the background round the server's ticker calls every
`tick_interval_s` (membership liveness, pin TTLs, writer timeouts, quarantine release,
watermark eviction). Every id and count a node sends is range-checked (master/requests.py)
before it reaches a table.

It is a mixin over the state MasterService builds (declared below for the type checker), so
`service.heartbeat(...)` stays one plain call; it never answers client RPCs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from cellar.errors import Status
from cellar.master.membership import MAX_NODE_ID_CHARS, Node
from cellar.master.rebuild import MAX_REPORT_ENTRIES, adopt, drop_lost
from cellar.master.replies import HeartbeatOutcome, KeyResults, MountOutcome, ReportOutcome
from cellar.master.requests import RequestRejected, check_batch, valid_id

if TYPE_CHECKING:
    from cellar.master.config import MasterConfig
    from cellar.master.eviction import Evictor
    from cellar.master.grace import RebuildGrace
    from cellar.master.membership import Membership
    from cellar.master.objects import ObjectTable
    from cellar.master.pins import PinTable
    from cellar.master.quarantine import Quarantine
    from cellar.master.requests import Clock
    from cellar.master.service import MasterService
    from cellar.master.tombstones import Tombstones


class NodeRpcs:
    config: MasterConfig
    clock: Clock
    epoch: int
    membership: Membership
    objects: ObjectTable
    evictor: Evictor
    pins: PinTable
    quarantine: Quarantine
    grace: RebuildGrace
    tombstones: Tombstones
    nodes_expired: int
    puts_timed_out: int
    objects_adopted: int
    objects_refused: int
    replicas_lost: int
    _watermark_evicting: bool

    def mount_segment(
        self, node_id: str, incarnation: int, segments: Sequence[Any], *,
        report_follows: bool = False, previous_epoch: int = 0,
    ) -> MountOutcome:
        if not node_id or len(node_id) > MAX_NODE_ID_CHARS:
            raise RequestRejected(f"node_id must be 1..{MAX_NODE_ID_CHARS} characters")
        if not segments:
            raise RequestRejected("no segments to mount")
        if len(segments) > self.config.max_segments_per_node:
            raise RequestRejected(f"more than max_segments_per_node ({self.config.max_segments_per_node}) segments")
        now = self.clock.monotonic()
        known = self.membership.nodes.get(node_id)
        if known is not None and known.incarnation != incarnation:
            # The old process is gone. Its memory may not be (a restart re-attaches it), but
            # what the old incarnation was told to free must stay freed: remember it.
            self.tombstones.freed_while_down(node_id, {entry[2] for entry in known.outbox})
            self.expire_node(known)
        self.grace.on_mount(report_follows, previous_epoch, self.epoch)
        results = self.membership.mount(node_id, incarnation, list(segments), now,
                                        rebuilding=report_follows)
        return MountOutcome(results, int(self.config.heartbeat_interval_s * 1000),
                            int(self.config.write_grant_ttl_s * 1000),
                            int(self.config.pin_ttl_s * 1000))  # read grants live as long as pins

    def report_objects(
        self, node_id: str, incarnation: int, segment_id: int, entries: Sequence[Any], last: bool
    ) -> ReportOutcome:
        """Adopt one batch of a node's index for one segment (master/rebuild.py)."""
        if len(entries) > MAX_REPORT_ENTRIES:
            raise RequestRejected(f"more than {MAX_REPORT_ENTRIES} entries in one report")
        node = self.membership.nodes.get(node_id)
        if node is None or node.incarnation != incarnation:
            return ReportOutcome(Status.NOT_FOUND, f"node {node_id!r} is not mounted: mount again")
        segment = node.segments.get(segment_id)
        if segment is None:
            return ReportOutcome(Status.NOT_FOUND, f"segment {segment_id} is not mounted by {node_id!r}")
        now = self.clock.monotonic()
        node.last_seen = now
        result = adopt(cast("MasterService", self), segment, entries, now,
                       self.tombstones.refused_for(node_id))
        self.objects_adopted += result.accepted
        self.objects_refused += len(result.refused)
        if last:
            self.membership.finish_rebuild(segment)
            if not any(s.rebuilding for s in node.segments.values()):
                self.tombstones.node_reported(node_id)
        return ReportOutcome(Status.OK, "", result.refused, result.accepted)

    def unmount_segment(self, node_id: str, segment_ids: Sequence[int]) -> KeyResults:
        check_batch(len(segment_ids), self.config.max_batch_keys, "segment ids")
        now = self.clock.monotonic()
        results: KeyResults = []
        for segment_id in segment_ids:
            segment = self.membership.segments.get(segment_id)
            if segment is None or segment.node.node_id != node_id:
                results.append((Status.NOT_FOUND, f"segment {segment_id} is not mounted by {node_id!r}"))
                continue
            self.objects.lose_segment(segment, now)
            self.quarantine.forget_segment(segment)
            self.membership.detach_segment(segment)
            results.append((Status.OK, ""))
        return results

    def heartbeat(
        self, node_id: str, incarnation: int, freed_ack_seq: int, lost: Sequence[Any] = ()
    ) -> HeartbeatOutcome:
        now = self.clock.monotonic()
        node = self.membership.heartbeat(node_id, incarnation, now)
        if node is None:
            return HeartbeatOutcome(True, [], freed_ack_seq)
        if lost:
            check_batch(len(lost), self.config.max_batch_keys, "lost ranges")
            by_segment: dict[int, set[int]] = {}
            for item in lost:
                alloc_id = int(item.alloc_id)
                if valid_id(alloc_id):  # an id never issued matches no replica anyway
                    by_segment.setdefault(int(item.segment_id), set()).add(alloc_id)
            for segment_id, alloc_ids in by_segment.items():
                segment = node.segments.get(segment_id)
                if segment is not None:
                    self.replicas_lost += drop_lost(cast("MasterService", self), segment, alloc_ids, now)
        freed = self.membership.take_freed(node, freed_ack_seq, self.config.max_freed_per_heartbeat)
        return HeartbeatOutcome(False, freed, freed[-1][0] if freed else freed_ack_seq)

    def expire_node(self, node: Node) -> None:
        now = self.clock.monotonic()
        for segment in list(node.segments.values()):
            self.objects.lose_segment(segment, now)
            self.quarantine.forget_segment(segment)
        self.membership.forget(node)
        self.nodes_expired += 1

    # ---------------------------------------------------------------- background

    def tick(self, lag_s: float = 0.0) -> None:
        """One round of background work; `lag_s` is how late the ticker woke (stall guard)."""
        membership = self.membership
        membership.credit_lag(lag_s)
        now = self.clock.monotonic()
        for node in membership.tick(now):
            self.expire_node(node)
        self.pins.sweep(now)
        self.puts_timed_out += self.objects.sweep_writers(now)
        self.objects.sweep_soft_pins(now)
        self.quarantine.release_due(now)
        self.evict_to_watermark()

    def capacity(self) -> tuple[int, int]:
        """(capacity, used) bytes over mounted segments; used includes quarantined ranges."""
        capacity = used = 0
        for segment in self.membership.segments.values():
            capacity += segment.allocator.capacity_bytes
            used += segment.allocator.used_bytes
        return capacity, used

    def evict_to_watermark(self) -> int:
        capacity, used = self.capacity()
        if not capacity:
            return 0
        config = self.config
        if not self._watermark_evicting and used <= capacity * config.eviction_high_watermark:
            return 0
        low = int(capacity * config.eviction_low_watermark)
        evicted, done = self.evictor.evict_to_watermark(used, low, config.max_evictions_per_tick)
        self._watermark_evicting = not done
        return evicted

    def largest_placeable_bytes(self) -> int:
        return max((s.size_bytes for s in self.membership.active_segments), default=0)
