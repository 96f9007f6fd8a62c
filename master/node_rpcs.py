"""NodeRpcs: what storage nodes ask of the master, the rebuild from their reports, and the tick.

What it owns: the node-facing RPCs (MountSegment, ReportObjects, UnmountSegment, Heartbeat with
the corrupt ranges a node lost), node expiry, and `tick`, the background round the server's
ticker calls every `tick_interval_s` (membership liveness, pin TTLs, writer timeouts,
quarantine release, watermark eviction); and the counters of what it did (`nodes_expired`,
`puts_timed_out`, `objects_adopted`, `objects_refused`, `replicas_lost`). Every id and count a
node sends is range-checked (master/requests.py) before it reaches a table.

Rebuild (ReportObjects). A master that starts (or a node that restarts) does not know what the
node's memory holds. The node knows: its index lists every SEALED allocation (tenant, key,
alloc id, offset, length, checksum, epoch). It mounts with `report_follows` and sends them,
segment by segment, in batches; each reported entry becomes master state:
- the range is `reserve`d in the segment's allocator; a range that is not free (overlaps a
  range placed since, or another reported entry) refuses the entry;
- (tenant, key) unknown: a COMPLETE object is created with that one replica, charged to the
  tenant (quota is not enforced on adoption: the bytes exist; eviction brings a tenant back
  under its quota), evictable like any object, unless the removal log holds a hard pin record
  of the key at or below its version (state/tombstones.py): then it is hard-pinned again;
  or, when its node was told the object's soft pin (heartbeat notes, journaled like engine
  hashes) and it has not lapsed, soft-pinned again until its lapse (best effort: a pin whose
  note did not reach the node before the master died comes back plain);
- (tenant, key) known with the same size and checksum: the entry becomes one more replica of
  it (replicas of one object live on different nodes; a second one on the same node is
  refused, the very same replica reported twice is accepted again). While the master's own
  start may still be missing reports (its rebuild grace) each such replica raises the count
  the object is kept at (`Obj.wanted`); after it the count is fixed, and a returning node's
  extra copy is surplus that the repair queue drops (master/repair.py);
- (tenant, key) known with another value: the newest version wins. A version is the alloc id
  of the put that wrote the value: an entry's own alloc id, or for a copy (a tier move, a
  repair copy, whose range got a newer id than the value it holds) the value id its node
  reports (`value_alloc_id`, kept in the node's journal). Alloc ids are (epoch << 22) +
  counter, so that order is (master epoch, issue order) of the puts. A losing existing
  version is dropped the usual way (its nodes hear of it through the freed-range outbox); a
  losing reported entry is refused. And a version this master acknowledged to its writer's
  PutEnd retry (master/put_ends.py) is never replaced by a later report;
- alloc ids the master freed while the reporting node was down (the outbox of its previous
  incarnation) and keys removed after the node wrote them (tombstones) are refused, so a
  remove is not undone by the node's restart; so are the alloc ids of writes dropped before
  they completed (dead writes, state/tombstones.py), so a put that was refused or revoked is
  not adopted in place of the acknowledged value because its allocation is newer.
Refused entries go back to the node, which drops them from its index. The alloc id counter is
moved above every adopted id so a new allocation never reuses one. Until the segment's last
batch the segment is `rebuilding`: no placements (state/membership.py).

Its interface to the state is narrow and explicit: the tables it is given at construction, and
only through their own methods (`ObjectTable.adopt`, `add_replica`, `lose_replicas`,
`lose_segment`, `drop`; `AllocIds.ensure_above`); it never writes another object's counters.
Invariant: an adopted replica's range is allocated in exactly its segment's allocator, and its
object is charged to its tenant exactly once per replica (ObjectTable does the charging).
It never answers client RPCs and never touches payload bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.grace import RebuildGrace
from cellar.master.replies import HeartbeatOutcome, KeyResults, MountOutcome, ReportOutcome
from cellar.master.requests import (
    MAX_SOFT_PIN_TTL_MS,
    Clock,
    RequestRejected,
    check_batch,
    key_error,
    range_error,
    valid_id,
)
from cellar.master.state.allocator import SegmentAllocator
from cellar.master.state.ids import AllocIds, epoch_base
from cellar.master.state.membership import MAX_NODE_ID_CHARS, Membership
from cellar.master.state.objects import ObjectTable
from cellar.master.state.pins import PinTable
from cellar.master.state.quarantine import Quarantine
from cellar.master.state.records import (
    HARD_PIN,
    NO_PIN,
    SOFT_PIN,
    SOFT_PIN_NO_LAPSE_MS,
    Node,
    Obj,
    Replica,
    Segment,
)
from cellar.master.state.tenants import Tenants
from cellar.master.state.tiers import Tiers
from cellar.master.state.tombstones import Tombstones
from cellar.proto import engine_hash
from cellar.proto.grant import key_tag

MAX_REPORT_ENTRIES = 16384  # per ReportObjects call (the node sends 2000)
# An adopted object's age per alloc id between its version and this master's first id: keeps
# the put order (1 M allocations of one epoch span 1 ms) and puts earlier epochs far behind.
ADOPTED_AGE_S_PER_ID = 1e-9


class ReportedLike(Protocol):
    tenant: str
    key: str
    alloc_id: int
    offset: int
    length: int
    checksum: int
    epoch: int
    value_alloc_id: int      # a copy's value: the put's alloc id (0: alloc_id itself)
    soft_pin_until_ms: int   # the soft pin the node was told (0: none)


@dataclass
class AdoptResult:
    accepted: int = 0
    refused: list[int] = field(default_factory=list)
    replaced: int = 0  # existing versions dropped for a newer reported one


class NodeRpcs:
    """The node-facing behaviour over the tables it is given (see the module docstring)."""

    def __init__(
        self, config: MasterConfig, clock: Clock, epoch: int, *, tenants: Tenants,
        membership: Membership, objects: ObjectTable, pins: PinTable, quarantine: Quarantine,
        tombstones: Tombstones, grace: RebuildGrace, alloc_ids: AllocIds,
        next_put_id: Callable[[], int], tiers: Tiers | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.epoch = epoch
        self._ids_base = epoch_base(epoch)  # every id this master numbers is above it
        self.tenants = tenants
        self.membership = membership
        self.objects = objects
        self.evictor = objects.evictor
        self.pins = pins
        self.quarantine = quarantine
        self.tombstones = tombstones
        self.grace = grace
        self.alloc_ids = alloc_ids
        self._next_put_id = next_put_id
        self.tiers = tiers  # the disk tier's moves (state/tiers.py); None in bare tests
        self._watermark_evicting = False
        self.on_tick: Callable[[], None] | None = None  # the repair round (master/repair.py)
        self.nodes_expired = 0
        self.puts_timed_out = 0
        self.objects_adopted = 0
        self.objects_refused = 0
        self.replicas_lost = 0

    # ---------------------------------------------------------------- node RPCs

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
        node = self.membership.nodes.get(node_id)
        if previous_epoch and node is not None:
            # This process mounted before (on us or an earlier master): a transfer it admitted
            # then may still be moving bytes, until its grant expires, in a range we now treat
            # as free. A tcp write's first frame finds it there (the node answers ST_BUSY); a
            # shm or rdma writer copies on its own, so it claims first until those grants
            # have expired (docs/security.md, "Transfers in flight").
            cfg = self.config
            node.claim_until = now + max(cfg.write_grant_ttl_s, cfg.pin_ttl_s) + cfg.grant_skew_s
        return MountOutcome(results, int(self.config.heartbeat_interval_s * 1000),
                            int(self.config.write_grant_ttl_s * 1000),
                            int(self.config.pin_ttl_s * 1000))  # read grants live as long as pins

    def report_objects(
        self, node_id: str, incarnation: int, segment_id: int, entries: Sequence[Any], last: bool
    ) -> ReportOutcome:
        """Adopt one batch of a node's index for one segment (the module docstring)."""
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
        result = self.adopt(segment, entries, now, self.tombstones.refused_for(node_id))
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
            if self.tiers is not None:
                self.tiers.forget_segment(segment, now)
            self.objects.lose_segment(segment, now)
            self.quarantine.forget_segment(segment)
            self.membership.detach_segment(segment)
            results.append((Status.OK, ""))
        return results

    def heartbeat(
        self, node_id: str, incarnation: int, freed_ack_seq: int, lost: Sequence[Any] = (),
        moved: Sequence[Any] = (),
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
                    self.replicas_lost += self.objects.lose_replicas(segment, alloc_ids, now)
        freed = self.membership.take_freed(node, freed_ack_seq, self.config.max_freed_per_heartbeat)
        if node.claim_until and now >= node.claim_until:
            node.claim_until = 0.0  # the grants of its earlier mount have expired
        if freed_ack_seq > node.freed_acked:
            # the node applied every notice up to its ack (storage_node/freed_acks.py): the
            # ranges it freed need no claim before a shm/rdma write any more
            node.freed_acked = freed_ack_seq
        for segment in node.segments.values():
            if segment.read_frees is not None:
                segment.read_frees.prune(node.freed_acked, now, node.outbox_dropped_seq)
                if not segment.read_frees:
                    segment.read_frees = None
        moves: list[Any] = []
        if self.tiers is not None:
            check_batch(len(moved), self.config.max_batch_keys, "moved ranges")
            self.tiers.moved(node_id, moved, now)
            moves = self.tiers.moves_for(node_id)
        limit = self.config.max_freed_per_heartbeat
        return HeartbeatOutcome(False, freed, freed[-1][0] if freed else freed_ack_seq, moves,
                                self.membership.take_engine_hashes(node, limit),
                                self.membership.take_soft_pins(node, limit))

    def expire_node(self, node: Node) -> None:
        now = self.clock.monotonic()
        for segment in list(node.segments.values()):
            if self.tiers is not None:
                self.tiers.forget_segment(segment, now)
            self.objects.lose_segment(segment, now)
            self.quarantine.forget_segment(segment)
        self.membership.forget(node)
        self.nodes_expired += 1

    # ---------------------------------------------------------------- rebuild

    def adopt(
        self, segment: Segment, entries: Sequence[ReportedLike], now: float,
        refuse_ids: set[int] | frozenset[int] = frozenset(),
    ) -> AdoptResult:
        """Adopt reported entries of one segment (see the module docstring)."""
        out = AdoptResult()
        highest = 0
        for e in entries:
            alloc_id = int(e.alloc_id)
            if self._adopt_one(segment, e, alloc_id, now, refuse_ids, out):
                out.accepted += 1
                highest = max(highest, alloc_id)
            else:
                out.refused.append(alloc_id)
        if highest:
            self.alloc_ids.ensure_above(highest)
        return out

    def _adopt_one(
        self, segment: Segment, e: ReportedLike, alloc_id: int, now: float,
        refuse_ids: set[int] | frozenset[int], out: AdoptResult,
    ) -> bool:
        length = int(e.length)
        offset = int(e.offset)
        # Every value is off the wire: an alloc id outside 1..MAX_ID would push the id counter
        # past 64 bits (every later grant fails to pack), a range outside the segment corrupts
        # the allocator. Checked before anything is looked up or reserved.
        if not valid_id(alloc_id) or alloc_id in refuse_ids:
            return False
        version = int(e.value_alloc_id) or alloc_id
        if version > alloc_id:  # a copy's range is always newer than its value: not our entry
            return False
        if range_error(offset, length, segment.size_bytes):
            return False
        tenant = self.tenants.resolve(e.tenant)
        if tenant is None or key_error(e.key, self.config.max_key_bytes):
            return False
        key = e.key
        if version <= self.tombstones.removed_alloc_id(tenant.name, key):
            return False  # a value a client removed or replaced since it was put
        if self.tombstones.dead_write(alloc_id):
            return False  # a put revoked or refused before it completed (never acknowledged)
        checksum = int(e.checksum)
        existing = tenant.objects.get(key)
        if existing is not None:
            if existing.size == length and existing.checksum == checksum:
                for rep in existing.replicas:
                    if rep.segment is segment and rep.offset == offset and rep.alloc_id == alloc_id:
                        return True  # the same replica reported again (a retried report)
                    if rep.segment.node is segment.node:
                        return False  # one replica per node
                if not _reserve(segment, offset, length):
                    return False
                if self.grace.starting(self.membership.rebuilding_count, self.membership.nodes, now):
                    existing.wanted = max(existing.wanted, len(existing.replicas) + 1)
                replica = Replica(segment, offset, alloc_id)
                self.objects.add_replica(existing, replica)
                reported_hash = _reported_hash(e)
                if reported_hash and not existing.engine_hash:  # its first report had none:
                    existing.engine_hash = reported_hash  # its other nodes are told it
                    tenant.index_engine_hash(existing)
                    self.objects.note_engine_hash(existing, [r for r in existing.replicas
                                                             if r is not replica])
                elif existing.engine_hash and not reported_hash:  # this node missed its note
                    self.objects.note_engine_hash(existing, (replica,))
                return True
            if version <= existing.version:
                return False  # an older version of the key (or a copy of one)
            if existing in self.objects.acked_by_receipts:
                # Acknowledged here to its writer's retried PutEnd, so no acknowledged version
                # is newer (its upsert bound would have refused `existing`): this entry is a
                # put never acknowledged
                return False
            if not _reserve(segment, offset, length):
                return False
            self.objects.drop(existing, now)
            out.replaced += 1
        elif not _reserve(segment, offset, length):
            return False
        pinned_from = self.tombstones.hard_pinned_from(tenant.name, key)
        pin_kind = HARD_PIN if pinned_from and version >= pinned_from else NO_PIN
        soft_until_ms = int(e.soft_pin_until_ms)
        soft_left_s = None  # the wall clock is read only for an entry that reports a pin
        if pin_kind == NO_PIN and soft_until_ms:
            soft_left_s = _soft_pin_left_s(soft_until_ms, self.clock.wall_ms())
            if soft_left_s is not None:
                pin_kind = SOFT_PIN
        obj = Obj(tenant, key, length, SegmentAllocator.rounded_size(length), self._next_put_id(),
                  pin_kind, 0.0, key_tag(tenant.name, key))
        obj.engine_hash = _reported_hash(e)
        obj.version = version
        # Its last access by its put's place in the id order (an alloc id counts allocations
        # above its master's epoch in ms), behind everything put or read since this master
        # started: a rebuilt table over its watermark (ranges the old master evicted, their
        # notices unsent) evicts its oldest puts first, not at random among equals.
        accessed = now - ADOPTED_AGE_S_PER_ID * max(0, self._ids_base - version)
        self.objects.adopt(obj, Replica(segment, offset, alloc_id), checksum, accessed)
        if soft_left_s:
            self.objects.lapse_soft_pin(obj, now + soft_left_s)
        return True

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
        if self.tiers is not None:
            self.tiers.tick(now)
        self.evict_to_watermark()
        if self.on_tick is not None:
            self.on_tick()

    def evict_to_watermark(self) -> int:
        capacity, used = self.membership.evicting_usage()
        if not capacity:
            return 0
        config = self.config
        if not self._watermark_evicting and used <= capacity * config.eviction_high_watermark:
            return 0
        low = int(capacity * config.eviction_low_watermark)
        evicted, done = self.evictor.evict_to_watermark(used, low, config.max_evictions_per_tick)
        self._watermark_evicting = not done
        return evicted


def _soft_pin_left_s(until_ms: int, wall_ms: int) -> float | None:
    """What is left of a soft pin a node reports (storage_node/index.py `set_soft_pins`): None
    when it has lapsed, 0.0 for a pin with no lapse, else seconds, at most MAX_SOFT_PIN_TTL_MS
    from now whatever the node says."""
    if until_ms == SOFT_PIN_NO_LAPSE_MS:
        return 0.0
    left_ms = until_ms - wall_ms
    return min(left_ms, MAX_SOFT_PIN_TTL_MS) / 1000 if left_ms > 0 else None


def _reported_hash(e: ReportedLike) -> bytes:
    """A reported entry's engine hash (storage_node/index.py keeps what the master told it), or
    b"" when it has none or it is not a valid encoding (off the wire: checked, never trusted)."""
    raw = bytes(getattr(e, "engine_hash", b""))
    return raw if raw and not engine_hash.error(raw) else b""


def _reserve(segment: Segment, offset: int, length: int) -> bool:
    try:
        return segment.allocator.reserve(offset, length)
    except (ValueError, TypeError):
        return False
