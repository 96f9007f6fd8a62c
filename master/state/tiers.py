"""Tiers: a node's disk below its DRAM; demotion instead of eviction, promotion on re-read.

What it owns
    The disk-tier segments as the master sees them (membership keeps them out of ordinary
    placement: `Membership.disk_of`), the moves in flight between a node's DRAM and its disk
    (`pending`, by the target's alloc id), the reads that decide promotion, and the tier
    counters (demotions, promotions, disk evictions, spills, disk hits, moves failed or timed out).

The policy, per node with a disk tier (settings in master/config.py, docs/disk-tier.md)
    - Demotion (every tick): while the node's DRAM is above `demote_high_watermark`, down to
      `demote_low_watermark`, its coldest DRAM objects by LRU-2 (the smallest second-to-last
      access, `Obj.prev_access`, the put counting as an access: an object read once since its
      put, as a scan reads it, goes before an object read twice since, however recent the
      scan's read; ties by last access)
      (COMPLETE, unpinned, not soft- or hard-pinned: those stay in DRAM as long as today) get a
      range on the node's disk
      under a new alloc id, and the node is asked to copy them there (a `Move` in its heartbeat
      reply: node-local, no network). The object keeps its DRAM replica and stays readable.
    - The switch: only when the node reports the copy durable (`MoveDone`, ok) does the replica
      become the new one (`ObjectTable.swap_replica`), at once, pins or not: every later read
      gets the new replica. The old range is *retired*, not freed: it stays allocated and in
      the node's index (so a reader holding a grant for it keeps reading valid, sealed bytes)
      until no pin is left on the object or `retire_hold_s` (the pin and read-grant TTL plus
      the clock-skew margin: no grant handed out before the switch is valid after it) has
      passed; only then is it freed and the node told. A switch never waits on readers, so a
      key read continuously still moves. A move not reported within `move_timeout_s` is
      abandoned, its target range quarantined so a late copy lands in nothing live. A dropped
      object's target is freed and the node told.
    - Spill: a put that finds no DRAM room goes to a disk with room (`spill`) before anything
      is evicted, so nothing is thrown away while disk has room.
    - Disk eviction (every tick): above `disk_high_watermark`, down to `disk_low_watermark`, the
      disk's least recently accessed unpinned objects are dropped through the object table,
      the master first (the object is gone from its tables, its ranges freed), the node after
      (freed-range outbox).
    - Promotion, "second read within a window" (LRU-2-like admission): a GetReplicas that
      finds an object only on disk notes the time; a second one within `promote_window_s`
      asks the node to copy it back to DRAM, the switch again on the node's report. A one-pass
      scan reads each cold key once and promotes nothing, so it cannot flush the hot set.
    Candidates come from `ColdPicker` (state/coldest.py; LRU-2 for demotion, last access for
    disk eviction): a partial sort of a segment of up to `exact_scan_objects` objects, above
    that each the coldest of `samples` random picks (approximate, as the evictor's), so a
    round costs O(moves) rather than O(objects in the segment); a round runs only above a
    watermark.

Invariant: an object has at most one move in flight; every pending move's target range is
allocated in its segment and in no replica until the switch; a retired range is allocated, in
no replica, and freed exactly once (or forgotten with its segment). Retired ranges are bounded
by the moves finished within one `retire_hold_s` (each holds its bytes in its allocator). It never touches payload bytes
and never talks to a node (node_rpcs.py carries the moves).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from cellar.master.state.coldest import ColdPicker
from cellar.master.state.membership import Membership
from cellar.master.state.objects import ObjectTable
from cellar.master.state.quarantine import Quarantine
from cellar.master.state.records import (
    COMPLETE,
    NO_PIN,
    TIER_DISK,
    TIER_DRAM,
    Obj,
    Replica,
    Segment,
    being_replaced,
    on_disk_only,
)

MAX_MOVES_IN_FLIGHT = 4096
MAX_MOVES_PER_HEARTBEAT = 1024
MAX_TRACKED_READS = 65536  # disk reads remembered for promotion (oldest forgotten first)


@dataclass(frozen=True)
class TierSettings:
    demote_high: float = 0.80
    demote_low: float = 0.65
    disk_high: float = 0.95
    disk_low: float = 0.90
    promote_window_s: float = 30.0
    max_moves_per_tick: int = 256
    move_timeout_s: float = 30.0
    retire_hold_s: float = 11.0  # pin_ttl_s + grant_skew_s: an old range outlives its grants
    samples: int = 16  # random picks per candidate in a large segment (eviction_samples)
    exact_scan_objects: int = 4096  # objects up to which the order is exact (state/coldest.py)


class Move:
    __slots__ = ("obj", "src", "dst", "node_id", "deadline")

    def __init__(self, obj: Obj, src: Replica, dst: Replica, started: float,
                 timeout_s: float) -> None:
        self.obj = obj
        self.src = src
        self.dst = dst
        self.node_id = src.segment.node.node_id
        # past it `tick` abandons the move; the node is told the time left (proto
        # Move.expires_in_ms) and never writes the target after it (storage_node/disk_tier.py)
        self.deadline = started + timeout_s

    @property
    def to_disk(self) -> bool:
        return self.dst.segment.tier == TIER_DISK


class Tiers:
    def __init__(self, membership: Membership, objects: ObjectTable, quarantine: Quarantine,
                 alloc_ids: Callable[[], int], settings: TierSettings,
                 rng: random.Random | None = None) -> None:
        self.membership = membership
        self.objects = objects
        self.quarantine = quarantine
        self._alloc_id = alloc_ids
        self.settings = settings
        self._coldest = ColdPicker(rng if rng is not None else random.Random(), settings.samples,
                                   settings.exact_scan_objects)
        self.pending: dict[int, Move] = {}
        self.moving: dict[Obj, Move] = {}
        # bytes (reserved) being moved out of each segment: what `_demote` counts as leaving
        # already, kept as the moves start and end instead of summed over `moving` each tick
        self._outgoing: dict[Segment, int] = {}
        self._reads: OrderedDict[Obj, float] = OrderedDict()
        self._disk_evicting: set[str] = set()
        # old ranges of switched moves, kept for readers' grants: (free after, object, replica)
        self.retired: list[tuple[float, Obj, Replica]] = []
        self.demotions = 0
        self.promotions = 0
        self.disk_evictions = 0
        self.spills = 0
        self.moves_failed = 0
        self.moves_timed_out = 0
        # per tier (index TIER_DRAM, TIER_DISK): GetReplicas hits served from it and their
        # bytes; bytes written into it (completed puts' replicas, moves' destinations)
        self.hits = [0, 0]
        self.read_bytes = [0, 0]
        self.write_bytes = [0, 0]

    @property
    def enabled(self) -> bool:
        return bool(self.membership.disk_of)

    # ---------------------------------------------------------------- placement

    def spill(self, size: int, avoid: Collection[str]) -> tuple[Segment, int] | None:
        """A disk range for a put that found no DRAM room (freest disk first), or None."""
        spot = self.disk_range(size, avoid)
        if spot is not None:
            self.spills += 1
        return spot

    def disk_range(self, size: int, avoid: Collection[str]) -> tuple[Segment, int] | None:
        """A range of `size` on the freest disk tier of a node not in `avoid`, or None."""
        disks = [s for node_id, s in self.membership.disk_of.items() if node_id not in avoid]
        disks.sort(key=lambda s: s.allocator.free_bytes, reverse=True)
        for segment in disks:
            offset = segment.allocator.alloc(size)
            if offset is not None:
                return segment, offset
        return None

    # ---------------------------------------------------------------- reads

    def on_read(self, obj: Obj, now: float) -> None:
        """GetReplicas returned `obj`: count the hit in the tier it is read from, and promote
        a disk object on a second read in the window."""
        if not on_disk_only(obj):
            self.hits[TIER_DRAM] += 1
            self.read_bytes[TIER_DRAM] += obj.size
            return
        self.hits[TIER_DISK] += 1
        self.read_bytes[TIER_DISK] += obj.size
        reads = self._reads
        last = reads.pop(obj, None)
        if last is not None and now - last <= self.settings.promote_window_s:
            if obj in self.moving or (obj.pin_kind == NO_PIN and not being_replaced(obj)
                                      and self._promote(obj, now)):
                return
            now = last  # no DRAM room yet: the next read in the window tries again
        reads[obj] = now
        if len(reads) > MAX_TRACKED_READS:
            reads.popitem(last=False)

    def _promote(self, obj: Obj, now: float) -> bool:
        if len(self.pending) >= MAX_MOVES_IN_FLIGHT:
            return False
        src = obj.replicas[0]
        node = src.segment.node
        drams = [s for s in node.segments.values() if s.tier == TIER_DRAM and not s.gone]
        drams.sort(key=lambda s: s.allocator.free_bytes, reverse=True)
        for segment in drams:  # above its watermark, demotion then moves a colder object out
            offset = segment.allocator.alloc(obj.size)
            if offset is not None:
                self._start(obj, src, Replica(segment, offset, self._alloc_id()), now)
                return True
        return False

    # ---------------------------------------------------------------- background

    def tick(self, now: float) -> None:
        """Free retired ranges, abandon overdue moves, evict full disks, demote full DRAM."""
        if self.retired:
            self._release_retired(now)
        if self.enabled or self.pending:
            for move in list(self.pending.values()):
                if now > move.deadline:
                    self.moves_timed_out += 1
                    self._abandon(move, now, late_write_possible=True)
            self._move_round(now)
        self._coldest.end_tick()

    def _move_round(self, now: float) -> None:
        """Disk evictions, then demotions, at most `max_moves_per_tick` in all."""
        budget = self.settings.max_moves_per_tick
        for node_id, disk in list(self.membership.disk_of.items()):
            budget -= self._evict_disk(node_id, disk, now, budget)
            for segment in list(disk.node.segments.values()):
                if budget <= 0:
                    return
                if segment.tier == TIER_DRAM and not segment.gone:
                    budget -= self._demote(segment, disk, now, budget)

    def _evict_disk(self, node_id: str, disk: Segment, now: float, budget: int) -> int:
        alloc = disk.allocator
        settings = self.settings
        evicting = node_id in self._disk_evicting
        if not evicting and alloc.used_bytes <= settings.disk_high * alloc.capacity_bytes:
            return 0
        low = settings.disk_low * alloc.capacity_bytes
        evicted = 0
        for obj in self._coldest.pick(disk.objects, budget, _last_access, self._movable):
            if alloc.used_bytes <= low:
                break
            self.objects.drop(obj, now)  # the master first; the node hears through the outbox
            self._reads.pop(obj, None)
            evicted += 1
        self.disk_evictions += evicted
        if alloc.used_bytes > low and evicted:
            self._disk_evicting.add(node_id)
        else:
            self._disk_evicting.discard(node_id)
        return evicted

    def _demote(self, segment: Segment, disk: Segment, now: float, budget: int) -> int:
        alloc = segment.allocator
        settings = self.settings
        outgoing = self._outgoing.get(segment, 0)
        excess = alloc.used_bytes - outgoing - settings.demote_low * alloc.capacity_bytes
        if alloc.used_bytes - outgoing <= settings.demote_high * alloc.capacity_bytes or excess <= 0:
            return 0
        started = 0
        for obj in self._coldest.pick(segment.objects, budget, _lru2, self._demotable):
            if excess <= 0 or len(self.pending) >= MAX_MOVES_IN_FLIGHT:
                break
            offset = disk.allocator.alloc(obj.size)
            if offset is None:
                break  # the disk is full: its own eviction makes room next tick
            src = next(rep for rep in obj.replicas if rep.segment is segment)
            self._start(obj, src, Replica(disk, offset, self._alloc_id()), now)
            excess -= obj.reserved
            started += 1
        return started

    def move_target(self, obj: Obj) -> int:
        """The alloc id of the range `obj` is being copied into, 0 when it is not moving."""
        move = self.moving.get(obj)
        return move.dst.alloc_id if move is not None else 0

    def _movable(self, obj: Obj) -> bool:
        return obj.state == COMPLETE and not obj.pins and obj not in self.moving

    def _demotable(self, obj: Obj) -> bool:
        return obj.pin_kind == NO_PIN and self._movable(obj) and not being_replaced(obj)

    def _start(self, obj: Obj, src: Replica, dst: Replica, now: float) -> None:
        move = Move(obj, src, dst, now, self.settings.move_timeout_s)
        assert dst.alloc_id not in self.pending and obj not in self.moving
        self.pending[dst.alloc_id] = move
        self.moving[obj] = move
        self._outgoing[src.segment] = self._outgoing.get(src.segment, 0) + obj.reserved

    def _end(self, move: Move) -> None:
        """`move` is no longer in flight (switched or abandoned)."""
        del self.pending[move.dst.alloc_id]
        if self.moving.get(move.obj) is move:
            del self.moving[move.obj]
            src = move.src.segment
            left = self._outgoing[src] - move.obj.reserved
            if left:
                self._outgoing[src] = left
            else:
                del self._outgoing[src]

    def outgoing_bytes(self, segment: Segment) -> int:
        """Bytes of moves out of `segment` in flight (for the tests' cross-check)."""
        return self._outgoing.get(segment, 0)

    # ---------------------------------------------------------------- the node's side

    def moves_for(self, node_id: str) -> list[Move]:
        """The moves a node still has to carry out (re-sent until it reports them)."""
        out = []
        for move in self.pending.values():
            if move.node_id == node_id:
                out.append(move)
                if len(out) >= MAX_MOVES_PER_HEARTBEAT:
                    break
        return out

    def moved(self, node_id: str, done: Sequence[Any], now: float) -> None:
        """The node reports moves carried out (`MoveDone`): switch, or abandon the failed ones."""
        for item in done:
            move = self.pending.get(int(item.dst_alloc_id))
            if (move is None or move.node_id != node_id
                    or move.dst.segment.segment_id != int(item.dst_segment_id)):
                continue  # unknown, another node's, or reported twice: nothing to do
            if not item.ok:
                self.moves_failed += 1
                self._abandon(move, now, late_write_possible=False)
                continue
            self._finish(move, now)

    def on_complete(self, obj: Obj) -> None:
        """A put completed: its replicas' bytes were written into their tiers."""
        if not self.enabled:  # no disk tier: every replica is DRAM
            self.write_bytes[TIER_DRAM] += obj.size * len(obj.replicas)
            return
        for rep in obj.replicas:
            self.write_bytes[rep.segment.tier] += obj.size

    def _finish(self, move: Move, now: float) -> None:
        """Switch the replica at once; the old range is retired until its readers are done."""
        obj = move.obj
        if obj.state != COMPLETE or move.src not in obj.replicas or move.src.segment.gone:
            self._abandon(move, now, late_write_possible=False)
            return
        self._end(move)
        self.objects.swap_replica(obj, move.src, move.dst)
        self.write_bytes[move.dst.segment.tier] += obj.size
        if obj.pins:
            self.retired.append((now + self.settings.retire_hold_s, obj, move.src))
        else:
            self._free_retired(obj, move.src, now)
        if move.to_disk:
            self.demotions += 1
        else:
            self.promotions += 1
            self._reads.pop(obj, None)

    def _release_retired(self, now: float) -> None:
        """Free the retired ranges no grant can still read: the object's pins are all gone
        (those taken since the switch too), or the hold ran out (every older grant expired)."""
        keep = []
        for entry in self.retired:
            until, obj, rep = entry
            if rep.segment.gone:
                continue  # its memory went with the segment
            if obj.pins and now < until:
                keep.append(entry)
            else:
                self._free_retired(obj, rep, now)
        self.retired = keep

    def _free_retired(self, obj: Obj, rep: Replica, now: float) -> None:
        self.objects.free_sealed(obj, rep, now)

    def _abandon(self, move: Move, now: float, *, late_write_possible: bool) -> None:
        """Give the target range back: at once if the node's copy is over (or never was), else
        after a timeout's quarantine. The node drops a copy it made (freed-range outbox)."""
        self._end(move)
        dst = move.dst
        segment = dst.segment
        if segment.gone:
            return
        self.membership.notify_freed(segment, dst.alloc_id, dst.offset, move.obj.size)
        if late_write_possible:
            self.quarantine.hold(segment, dst.offset, move.obj.reserved,
                                 now + self.settings.move_timeout_s)
        else:
            segment.allocator.free(dst.offset)

    def forget_segment(self, segment: Segment, now: float) -> None:
        """The segment is gone (node expired or unmounted): its moves end."""
        for move in list(self.pending.values()):
            if move.src.segment is segment or move.dst.segment is segment:
                self._abandon(move, now, late_write_possible=False)

    # ---------------------------------------------------------------- status

    # The one source of every tier number the master reports: /metrics (serving/metrics.py)
    # and ClusterStatus, /api/v1/status and the status page (serving/cluster_summary.py) all
    # read these three, so no face counts on its own.

    def stats(self) -> list[tuple[int, int, int, int]]:
        """(tier, hits, read bytes, write bytes) per tier, DRAM then disk: TierStats' rows."""
        return [(tier, self.hits[tier], self.read_bytes[tier], self.write_bytes[tier])
                for tier in (TIER_DRAM, TIER_DISK)]

    def moves(self) -> dict[str, int]:
        """The disk tier's moves (TierMoves' fields, cellar.proto.tiers.MOVE_COUNTERS)."""
        return {"demotions": self.demotions, "promotions": self.promotions,
                "disk_evictions": self.disk_evictions, "spills": self.spills}

    def counters(self) -> dict[str, int]:
        return {**self.moves(), "disk_hits": self.hits[TIER_DISK],
                "moves_failed": self.moves_failed, "moves_timed_out": self.moves_timed_out,
                "moves_pending": len(self.pending)}


def _last_access(obj: Obj) -> float:
    return obj.last_access


def _lru2(obj: Obj) -> tuple[float, float]:
    """Demotion order: the second-to-last access first (the put time for an object read once,
    0 for one adopted and never read), then the last: a one-pass scan's objects leave DRAM
    before the ones read again."""
    return obj.prev_access, obj.last_access
