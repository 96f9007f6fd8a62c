"""Membership: which storage nodes and segments exist, whether they are alive, what they must drop.

Owns the node table (`Node` and `Segment` records, records.py: node id, incarnation, state, last
heartbeat), the segment table (one `SegmentAllocator` per mounted segment), the placement
candidate lists (segments of ACTIVE nodes, by host) and each node's freed-range outbox (ranges
the master no longer assigns, which the node drops from its own index once it acknowledges them
in a heartbeat).

Liveness is measured on the monotonic clock: a node silent for `node_suspect_after_s` is
SUSPECT (its replicas are still served, it gets no new placements), after `node_expire_after_s`
it is EXPIRED: `tick` hands it back to the service, which drops its replicas, and `forget`
removes it so that a later mount starts clean. Stall guard: the ticker measures its own loop
lag and `credit_lag` adds that time to every node's last heartbeat, so a master that was
stopped or stalled never expires nodes for a period it was not listening.

Rebuilding segments: a node that mounts with `report_follows` (it holds objects from before:
a restarted node, or any node after a master restart) gets its segments marked `rebuilding`
until its ReportObjects says `last` for each (`finish_rebuild`). A rebuilding segment is not a
placement candidate: its allocator does not know yet which ranges the reported objects hold.

Draining nodes (`drain`, an admin's `cellar node drain`): a draining node stays mounted and
serves its replicas, but none of its segments is a placement candidate; the repair queue
(state/repair.py) copies its objects elsewhere. A new incarnation of the node is a new `Node`,
not draining.

Invariant: a segment id belongs to at most one node; a forgotten segment is marked `gone` and
its allocator is never touched again. This module never decides which objects exist: dropping
replicas is the service's job.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from cellar.errors import Status
from cellar.master.state.records import (
    ACTIVE,
    EXPIRED,
    SUSPECT,
    TIER_DISK,
    TIER_DRAM,
    Node,
    Segment,
)

STATE_NAMES = {ACTIVE: "ACTIVE", SUSPECT: "SUSPECT", EXPIRED: "EXPIRED"}

MAX_SEGMENT_BYTES = 1 << 48  # the largest segment a node may mount (256 TiB)
MAX_NODE_ID_CHARS = 256
MAX_HOST_ID_CHARS = 256
MAX_ENDPOINTS = 16
MAX_ENDPOINT_CHARS = 4096



# Engine hash notes waiting for one node's heartbeat reply (each ~60 bytes): a node that
# does not heartbeat for a while holds at most this many; the rest are dropped (best effort).
# Soft pin notes (each ~50 bytes) have a bound of their own of the same size.
MAX_HASH_NOTES_PER_NODE = 65_536


class Membership:
    """Nodes, segments, liveness and freed-range outboxes."""

    def __init__(
        self,
        *,
        suspect_after_s: float,
        expire_after_s: float,
        max_segments_per_node: int,
        max_freed_backlog: int,
        seq_base: int,
    ) -> None:
        self.suspect_after_s = suspect_after_s
        self.expire_after_s = expire_after_s
        self.max_segments_per_node = max_segments_per_node
        self.max_freed_backlog = max_freed_backlog
        self.hash_notes_dropped = 0  # engine hash notes past MAX_HASH_NOTES_PER_NODE
        self.pin_notes_dropped = 0  # soft pin notes past the same bound
        self.nodes: dict[str, Node] = {}
        self.segments: dict[int, Segment] = {}
        # Placement candidates, rebuilt whenever a node changes state (rare).
        self.active_segments: list[Segment] = []
        self.active_node_ids: frozenset[str] = frozenset()
        self.by_host: dict[str, list[Segment]] = {}
        self.disk_of: dict[str, Segment] = {}  # an ACTIVE node's disk-tier segment, by node id
        self.tiered: frozenset[str] = frozenset()  # nodes with a disk tier (any state)
        # disk-tier segments still reporting their objects to a new master: not placeable yet
        self.disks_rebuilding = 0
        self.max_segment_bytes = 0  # largest mounted segment (ACTIVE or SUSPECT)
        self.rebuilding_count = 0   # mounted segments whose node's report has not ended
        self.lag_credited_s = 0.0
        # Freed-range sequence numbers start above anything an earlier master handed out.
        self._freed_seq = seq_base

    # ---------------------------------------------------------------- mounting

    def mount(
        self, node_id: str, incarnation: int, infos: list[Any], now: float, *, rebuilding: bool = False
    ) -> list[tuple[int, str]]:
        """Mount segments for a node already cleared of any older incarnation (see service).

        With `rebuilding`, newly mounted segments take no placements until `finish_rebuild`.
        """
        node = self.nodes.get(node_id)
        if node is None:
            node = Node(node_id, incarnation, now)
            # The new-node ramp (placement.py) is for an empty newcomer among nodes that hold
            # data; nodes that mount together at a cluster's start, or a node bringing its own
            # objects back (a report follows), share writes by free space at once.
            node.ramps = not rebuilding and any(s.allocator.used_bytes for s in self.segments.values())
            self.nodes[node_id] = node
        node.last_seen = now
        node.state = ACTIVE
        results: list[tuple[int, str]] = []
        for info in infos:
            results.append(self._mount_one(node, info, rebuilding))
        if not node.segments:
            del self.nodes[node_id]  # nothing mounted: do not keep an empty node around
        self._refresh()
        return results

    def _mount_one(self, node: Node, info: Any, rebuilding: bool) -> tuple[int, str]:
        segment_id = int(info.segment_id)
        size = int(info.size_bytes)
        host_id = str(info.host_id)
        if segment_id == 0:
            return Status.INVALID, "segment_id must be non-zero"
        if size < 4096 or size > MAX_SEGMENT_BYTES:
            return Status.INVALID, f"size_bytes must be in [4096, {MAX_SEGMENT_BYTES}]"
        if len(host_id) > MAX_HOST_ID_CHARS:
            return Status.INVALID, f"host_id longer than {MAX_HOST_ID_CHARS} characters"
        if info.node_id and info.node_id != node.node_id:
            return Status.INVALID, "segment node_id differs from the request's node_id"
        tier = int(info.tier)
        if tier not in (TIER_DRAM, TIER_DISK):
            return Status.INVALID, f"tier must be {TIER_DRAM} (DRAM) or {TIER_DISK} (disk)"
        if tier == TIER_DISK and any(s.tier == TIER_DISK for s in node.segments.values()
                                     if s.segment_id != segment_id):
            return Status.INVALID, "a node has at most one disk-tier segment"
        if len(info.endpoints) > MAX_ENDPOINTS:
            return Status.INVALID, f"more than {MAX_ENDPOINTS} endpoints"
        for endpoint in info.endpoints:
            if len(endpoint.address) + len(endpoint.extra) + len(endpoint.transport) > MAX_ENDPOINT_CHARS:
                return Status.INVALID, "endpoint too long"
        existing = self.segments.get(segment_id)
        if existing is not None:
            if existing.node is not node:
                return Status.INVALID, f"segment {segment_id} is mounted by node {existing.node.node_id!r}"
            if existing.size_bytes != size:
                return Status.INVALID, f"segment {segment_id} is already mounted with another size"
            return Status.OK, ""  # idempotent re-mount of the same segment
        if len(node.segments) >= self.max_segments_per_node:
            return Status.INVALID, f"node has max_segments_per_node ({self.max_segments_per_node}) segments"
        stored = type(info)()
        stored.CopyFrom(info)
        stored.node_id = node.node_id
        segment = Segment(segment_id, node, size, host_id, stored)
        segment.rebuilding = rebuilding
        segment.tier = tier
        self.segments[segment_id] = segment
        node.segments[segment_id] = segment
        return Status.OK, ""

    def finish_rebuild(self, segment: Segment) -> None:
        """The segment's report is complete: it becomes a placement candidate."""
        if segment.rebuilding:
            segment.rebuilding = False
            self._refresh()

    def drain(self, node: Node) -> None:
        """No new placements on `node` from now on (its replicas stay readable)."""
        if not node.draining:
            node.draining = True
            self._refresh()

    def detach_segment(self, segment: Segment) -> None:
        """Forget one segment (its replicas were already dropped by the service)."""
        segment.gone = True
        self.segments.pop(segment.segment_id, None)
        node = segment.node
        node.segments.pop(segment.segment_id, None)
        if not node.segments:
            self.nodes.pop(node.node_id, None)
        self._refresh()

    def forget(self, node: Node) -> None:
        """Forget a node and its segments (its replicas were already dropped by the service)."""
        node.state = EXPIRED
        for segment in node.segments.values():
            segment.gone = True
            self.segments.pop(segment.segment_id, None)
        node.segments.clear()
        node.outbox.clear()
        node_id = node.node_id
        if self.nodes.get(node_id) is node:
            del self.nodes[node_id]
        self._refresh()

    def _refresh(self) -> None:
        active: list[Segment] = []
        by_host: dict[str, list[Segment]] = {}
        largest = 0
        placeable_nodes: set[str] = set()
        rebuilding = disks_rebuilding = 0
        disk_of: dict[str, Segment] = {}
        for node in self.nodes.values():
            for segment in node.segments.values():
                rebuilding += segment.rebuilding
                if segment.tier == TIER_DISK:  # placed by state/tiers.py, never directly
                    disks_rebuilding += segment.rebuilding
                    if node.state == ACTIVE and not segment.rebuilding and not node.draining:
                        disk_of[node.node_id] = segment
                    continue
                largest = max(largest, segment.size_bytes)
                if node.state == ACTIVE and not segment.rebuilding and not node.draining:
                    active.append(segment)
                    by_host.setdefault(segment.host_id, []).append(segment)
                    placeable_nodes.add(node.node_id)
        self.active_segments = active
        self.disk_of = disk_of
        self.tiered = frozenset(node.node_id for node in self.nodes.values()
                                if any(s.tier == TIER_DISK for s in node.segments.values()))
        self.by_host = by_host
        self.active_node_ids = frozenset(placeable_nodes)
        self.rebuilding_count = rebuilding
        self.disks_rebuilding = disks_rebuilding
        self.max_segment_bytes = largest

    # ---------------------------------------------------------------- space

    def usage(self) -> tuple[int, int]:
        """(capacity, used) bytes over mounted segments; used includes quarantined ranges."""
        return self._usage(frozenset())

    def evicting_usage(self) -> tuple[int, int]:
        """`usage` without the nodes that have a disk tier: state/tiers.py keeps their
        watermarks (demotion, disk eviction), watermark eviction the others'."""
        return self._usage(self.tiered)

    def _usage(self, skip: frozenset[str]) -> tuple[int, int]:
        capacity = used = 0
        for segment in self.segments.values():
            if skip and segment.node.node_id in skip:
                continue
            capacity += segment.allocator.capacity_bytes
            used += segment.allocator.used_bytes
        return capacity, used

    def placeable_nodes(self, avoid: Collection[str] = ()) -> int:
        """How many nodes outside `avoid` take placements now: the most replicas a put may have
        (PutStart answers UNAVAILABLE beyond it, and no eviction can add a node)."""
        live = self.active_node_ids
        return len(live.difference(avoid)) if avoid else len(live)

    def placeable_segments(self, avoid: Collection[str] = ()) -> list[Segment]:
        """The segments a put avoiding `avoid` may be placed on."""
        if not avoid:
            return self.active_segments
        return [s for s in self.active_segments if s.node.node_id not in avoid]

    def largest_placeable_bytes(self) -> int:
        """The largest object a put could place now (the largest placeable segment)."""
        return max((s.size_bytes for s in self.active_segments), default=0)

    # ---------------------------------------------------------------- liveness

    def heartbeat(self, node_id: str, incarnation: int, now: float) -> Node | None:
        """Record a heartbeat; None means the master does not know this node (it must remount)."""
        node = self.nodes.get(node_id)
        if node is None or node.incarnation != incarnation:
            return None
        node.last_seen = now
        if node.state != ACTIVE:
            node.state = ACTIVE
            self._refresh()
        return node

    def credit_lag(self, lag_s: float) -> None:
        """The master's loop did not run for `lag_s`: that silence is not the nodes' fault."""
        if lag_s <= 0:
            return
        self.lag_credited_s += lag_s
        for node in self.nodes.values():
            node.last_seen += lag_s

    def tick(self, now: float) -> list[Node]:
        """Move silent nodes to SUSPECT; return the nodes that must now be expired."""
        expired: list[Node] = []
        changed = False
        for node in self.nodes.values():
            silent = now - node.last_seen
            if silent >= self.expire_after_s:
                expired.append(node)
            elif silent >= self.suspect_after_s and node.state == ACTIVE:
                node.state = SUSPECT
                changed = True
        if changed:
            self._refresh()
        return expired

    # ---------------------------------------------------------------- freed ranges

    def notify_freed(self, segment: Segment, alloc_id: int, offset: int, length: int) -> int:
        """Queue the freed-range notice for the segment's node; its seq (the node acknowledges
        notices by seq in its heartbeats)."""
        node = segment.node
        self._freed_seq += 1
        outbox = node.outbox
        outbox.append((self._freed_seq, segment.segment_id, alloc_id, offset, length))
        if len(outbox) > self.max_freed_backlog:
            node.outbox_dropped_seq = outbox.popleft()[0]
            node.outbox_dropped += 1
        return self._freed_seq

    def note_engine_hash(self, segment: Segment, alloc_id: int, engine_hash: bytes) -> None:
        """Tell the segment's node, with a heartbeat reply, the engine hash of its sealed
        replica `alloc_id`: it keeps it in its index and report, so a rebuilt master knows it
        (a note that cannot be queued, past MAX_HASH_NOTES_PER_NODE, is dropped: the object
        then comes back from a rebuild told by its key hash, as before notes existed)."""
        if not _queue_note(segment.node.hash_notes, (segment.segment_id, alloc_id, engine_hash)):
            self.hash_notes_dropped += 1

    def note_soft_pin(self, segment: Segment, alloc_id: int, until_ms: int) -> None:
        """The same for a soft pin of its sealed replica `alloc_id` lapsing at `until_ms`
        (wall clock; SOFT_PIN_NO_LAPSE_MS: never), so a rebuilt master pins it again (a note
        dropped past the bound: the object comes back plain, as before notes existed)."""
        if not _queue_note(segment.node.pin_notes, (segment.segment_id, alloc_id, until_ms)):
            self.pin_notes_dropped += 1

    @staticmethod
    def take_engine_hashes(node: Node, limit: int) -> list[tuple[int, int, bytes]]:
        """Up to `limit` of the node's engine hash notes, oldest first (sent once)."""
        taken, node.hash_notes = node.hash_notes[:limit], node.hash_notes[limit:]
        return taken

    @staticmethod
    def take_soft_pins(node: Node, limit: int) -> list[tuple[int, int, int]]:
        """Up to `limit` of the node's soft pin notes, oldest first (sent once)."""
        taken, node.pin_notes = node.pin_notes[:limit], node.pin_notes[limit:]
        return taken

    @staticmethod
    def take_freed(node: Node, ack_seq: int, limit: int) -> list[tuple[int, int, int, int, int]]:
        """Drop entries the node acknowledged; return up to `limit` of the rest, oldest first."""
        outbox = node.outbox
        while outbox and outbox[0][0] <= ack_seq:
            outbox.popleft()
        if len(outbox) <= limit:
            return list(outbox)
        return [outbox[i] for i in range(limit)]


def _queue_note(notes: list[Any], note: Any) -> bool:
    """Append `note` to a node's bounded note list; False (not queued) when it is full."""
    if len(notes) >= MAX_HASH_NOTES_PER_NODE:
        return False
    notes.append(note)
    return True
