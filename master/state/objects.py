"""The object table and its state machine: WRITING -> COMPLETE -> DROPPED.

Owns every object version (`Obj`, a record of records.py) and its replicas, the in-flight puts
by put id, the writer deadlines, and the one function that gives a dropped object's ranges back
(`release_ranges`).

State machine (asserted at every transition):
- `begin`: a PutStart placed the replicas; the version is WRITING, invisible to readers, held
  in `tenant.writing` and charged to the tenant. For an upsert the old COMPLETE version stays
  visible meanwhile.
- `complete`: PutEnd; the version becomes the visible one (`tenant.objects`), evictable unless
  hard-pinned; an upserted old version is dropped.
- `drop`: revoke, writer timeout, remove, eviction, upsert replacement or loss of every replica.
  The version leaves every table and stops being charged, and the service hears of it
  (`dead_write` for a WRITING one, `vanished` for a COMPLETE one no client removed). Its ranges
  are released at once unless readers still pin it, in which case the last unpin releases
  them, or unless a client's remove or upsert dropped it: then they wait for the removal log
  (below).

Durable first (a remove's or an upsert's drop, `drop(..., until_durable=True)`): the ranges of
the version a client removed or replaced stay allocated, and its nodes untold, until the bound
that records the change is in the removal log (`take_held`, then `release_held` once the
write succeeded; serving/leadership.py). A master that could not write it (etcd away) did not
acknowledge the change; if it then loses the leadership, its successor rebuilds from the nodes'
reports and the removal log, and must find the old version still on its nodes, as the change
never happened for it. Freeing at once let the heartbeat replies tell the nodes first: the
version vanished and the client's retry of its remove answered False (make soak-ha).

Releasing a range (quarantine rule, DESIGN write path 4): a range of a version that never
reached COMPLETE may still receive a late write from its writer until the write grant expires,
so it is held in quarantine until grant expiry + `grant_skew_s` before the allocator sees it. A
COMPLETE version's ranges are freed immediately: storage nodes seal an allocation once all its
bytes were written and refuse further writes to it. Either way the node is told (freed-range
outbox) so it drops the range from its own index.

Replica counts (re-replication, state/repair.py): every version keeps `wanted`, the count it
was written with. Whenever a COMPLETE version may have fewer or more replicas than that (a
replica lost, one added by a report, a PutEnd of a version that lost one while WRITING) the
table calls `watch(obj)`, which the repair queue sets; `drop_replica` takes one surplus
replica away.

This module never chooses placements or victims and never touches payload bytes.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any

from cellar.master.state.expiry import ExpiryRuns
from cellar.master.state.read_frees import RecentReadFrees
from cellar.master.state.read_trust import ReadTrust
from cellar.master.state.records import (
    COMPLETE,
    DROPPED,
    HARD_PIN,
    NO_PIN,
    SOFT_PIN,
    SOFT_PIN_NO_LAPSE_MS,
    TIER_DISK,
    WRITING,
    Obj,
    Replica,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from cellar.master.state.eviction import Evictor
    from cellar.master.state.lifecycle import LifecycleObserver
    from cellar.master.state.membership import Membership
    from cellar.master.state.quarantine import Quarantine
    from cellar.master.state.records import Segment

STATE_NAMES = {WRITING: "WRITING", COMPLETE: "COMPLETE", DROPPED: "DROPPED"}

EXPIRED_PUTS_REMEMBERED = 65536  # so a late PutEnd gets EXPIRED rather than NOT_FOUND
# Versions acknowledged to a PutEnd retried across a restart (`acked_by_receipts`): only the
# puts in flight when a master died, so a few thousand at most; kept until far more come
ACKED_BY_RECEIPTS_REMEMBERED = 65536


def charge(obj: Obj, nbytes: int) -> None:
    """Charge (or, negative, credit) the object's tenant `nbytes` of replica ranges: its used
    bytes, and its WRITING or hard-pinned bytes when the object is one (state/tenants.py)."""
    tenant = obj.tenant
    tenant.used_bytes += nbytes
    if obj.state == WRITING:
        tenant.writing_bytes += nbytes
    if obj.pin_kind == HARD_PIN:
        tenant.hard_pinned_bytes += nbytes
    assert tenant.used_bytes >= 0 and tenant.writing_bytes >= 0 and tenant.hard_pinned_bytes >= 0, \
        "tenant accounting went negative"


class ObjectTable:
    """Object versions across all tenants, in-flight puts, writer deadlines."""

    def __init__(
        self,
        *,
        membership: Membership,
        quarantine: Quarantine,
        evictor_factory: Callable[[Callable[[Obj], int]], Evictor],
        grant_skew_s: float,
        clock: Callable[[], float],
        wall_ms: Callable[[], int],
        read_grant_ttl_s: float = 0.0,
        read_trust: ReadTrust | None = None,
    ) -> None:
        self.membership = membership
        self.quarantine = quarantine
        self.grant_skew_s = grant_skew_s
        # How long a read grant names its range (the master's pin_ttl_s): a sealed range of a
        # version read within that time is remembered when freed (free_sealed)
        self.read_grant_ttl_s = read_grant_ttl_s
        # Until when clients may reuse what GetReplicas named, and so how long a change of a
        # key read lately waits before it is acknowledged (state/read_trust.py)
        self.read_trust = ReadTrust(0.0) if read_trust is None else read_trust
        self._clock = clock
        self._wall_ms = wall_ms  # soft pin lapses go to the nodes in wall clock ms
        self.evictor = evictor_factory(self._drop_now)
        self.puts: dict[int, Obj] = {}
        self._deadlines = ExpiryRuns()  # put ids by write deadline, in put order
        self.expired_puts: OrderedDict[int, None] = OrderedDict()
        # Versions this master adopted from a node and then acknowledged to their writer's
        # PutEnd retry (master/put_ends.py): a node reporting later may hold an older value a
        # tier move gave a higher alloc id and, journaled before value versions, reports
        # without its version; it must not replace them (master/node_rpcs.py)
        self.acked_by_receipts: OrderedDict[Obj, None] = OrderedDict()
        self.complete_count = 0
        self._soft_lapses: list[tuple[float, int, Obj]] = []  # heap of soft pins with a TTL
        self._soft_lapse_at: dict[int, float] = {}  # put id -> its lapse, while in the heap
        self.observer: LifecycleObserver | None = None  # told of visible versions (state/lifecycle.py)
        # Called with a COMPLETE version whose replica count may differ from `wanted`
        # (state/repair.py sets it; the default ignores it).
        self.watch: Callable[[Obj], None] = _ignore
        # Called with a version dropped while WRITING, before its ranges go: the service
        # remembers its alloc ids as dead writes (state/tombstones.py) so that no rebuild
        # adopts bytes a node sealed for a put that was never acknowledged.
        self.dead_write: Callable[[Obj], None] = _ignore
        # Called with a COMPLETE version dropped without a client's remove or upsert (evicted,
        # lost with its node, replaced by a newer report), before its ranges go: no put-ahead
        # allocation older than it may be bound to its key (state/ahead_drops.py), since its
        # node may still report it to a rebuild, which prefers the newer allocation.
        self.vanished: Callable[[Obj], None] = _ignore
        # Versions a remove or upsert dropped whose ranges wait for the removal log: all of
        # them, and those the current request dropped (taken with its bounds, `take_held`).
        # Only where a servicer writes that log and releases them (serving/leadership.py
        # turns it on); a bare table frees at once.
        self.hold_until_durable = False
        self._held: set[Obj] = set()
        self._held_new: list[Obj] = []

    def writing_replicas(self) -> Counter[int]:
        """Replicas of versions being written (put-ahead allocations among them) per segment
        id: a segment's stored replicas are its `objects` less these. Bounded by the puts in
        flight (the WRITING caps), so a status or a scrape may walk them."""
        return Counter(rep.segment.segment_id for obj in self.puts.values()
                       for rep in obj.replicas)

    def _drop_now(self, obj: Obj) -> int:
        return self.drop(obj, self._clock())

    # ---------------------------------------------------------------- transitions

    def begin(
        self, obj: Obj, placements: list[tuple[Segment, int]], alloc_ids: Callable[[], int]
    ) -> None:
        tenant = obj.tenant
        assert obj.state == WRITING and obj.key not in tenant.writing and obj.reserved > 0
        assert placements and obj.put_id not in self.puts, "begin without placements or a fresh id"
        obj.replicas = tuple([Replica(segment, offset, alloc_ids()) for segment, offset in placements])
        obj.version = obj.replicas[0].alloc_id
        obj.wanted = len(placements)
        for segment, _offset in placements:
            segment.objects.add(obj)
        tenant.writing[obj.key] = obj
        charge(obj, obj.reserved * len(placements))
        tenant.object_count += 1
        self.puts[obj.put_id] = obj
        self._deadlines.add(obj.deadline, obj.put_id)

    def begin_one(self, obj: Obj, segment: Segment, offset: int, alloc_id: int) -> Replica:
        """`begin` with one placement (the common put), without the per-placement loops."""
        tenant = obj.tenant
        assert obj.state == WRITING and obj.key not in tenant.writing and obj.pin_kind == NO_PIN
        replica = Replica(segment, offset, alloc_id)
        obj.replicas = (replica,)
        obj.version = alloc_id
        segment.objects.add(obj)
        tenant.writing[obj.key] = obj
        charge(obj, obj.reserved)  # inlining it saved nothing measurable (<1% of a PutStart key)
        tenant.object_count += 1
        self.puts[obj.put_id] = obj
        self._deadlines.add(obj.deadline, obj.put_id)
        return replica

    def complete(self, obj: Obj, checksum: int, now: float) -> None:
        assert obj.state == WRITING, f"complete() of a {STATE_NAMES[obj.state]} object"
        tenant = obj.tenant
        old = tenant.objects.get(obj.key)
        if old is not None:
            self.drop(old, now, until_durable=True)  # upsert: the old version goes once
            # the removal log holds its bound and its readers are done
        del self.puts[obj.put_id]
        del tenant.writing[obj.key]
        tenant.writing_bytes -= obj.reserved * len(obj.replicas)
        obj.state = COMPLETE
        obj.checksum = checksum
        obj.last_access = now
        obj.deadline = 0.0
        tenant.objects[obj.key] = obj
        self.complete_count += 1
        if obj.pin_kind != HARD_PIN:
            self.evictor.enter(obj)
        if obj.engine_hash:
            tenant.index_engine_hash(obj)
            self.note_engine_hash(obj, obj.replicas)
        if obj.pin_kind == SOFT_PIN:
            self.note_soft_pin(obj, obj.replicas, now)
        if self.observer is not None:
            self.observer.stored(obj)
        if len(obj.replicas) < obj.wanted:
            self.watch(obj)  # it lost a replica while being written

    def drop(self, obj: Obj, now: float, until_durable: bool = False) -> int:
        """Take a version out of service; returns the bytes given back to allocators at once.
        `until_durable`: a client removed or replaced it; a sealed version's ranges then wait
        for the removal log (module doc, "Durable first")."""
        tenant = obj.tenant
        state = obj.state
        if state == COMPLETE:
            if tenant.objects.get(obj.key) is obj:
                del tenant.objects[obj.key]
            self.complete_count -= 1
            if obj.pool_kind:
                self.evictor.leave(obj)
            if obj.engine_hash:
                tenant.unindex_engine_hash(obj)
            if self.observer is not None:
                self.observer.dropped(obj)
            if obj.read_at:
                self.read_trust.dropped(tenant.name, obj.key, obj.read_at, obj.reader, now)
            if not until_durable:  # a remove's or upsert's bound covers its older versions
                self.vanished(obj)
        elif state == WRITING:
            del self.puts[obj.put_id]
            if tenant.writing.get(obj.key) is obj:
                del tenant.writing[obj.key]
            self.dead_write(obj)
        else:
            return 0
        charge(obj, -obj.reserved * len(obj.replicas))
        tenant.object_count -= 1
        assert tenant.object_count >= 0 and self.complete_count >= 0, "object counts went negative"
        obj.state = DROPPED
        if until_durable and state == COMPLETE and obj.replicas and self.hold_until_durable:
            self._held.add(obj)
            self._held_new.append(obj)
            return 0  # release_held gives them back
        if obj.pins:
            return 0  # the last unpin releases the ranges
        return self.release_ranges(obj, now)

    @property
    def holding(self) -> bool:
        """Whether the current request dropped versions whose ranges wait for the log."""
        return bool(self._held_new)

    def take_held(self) -> list[Obj]:
        """The versions the current request dropped until durable (its reply's work)."""
        held, self._held_new = self._held_new, []
        return held

    def release_held(self, held: list[Obj], now: float) -> int:
        """The removal log holds the bounds of `held`'s drops: give their ranges back (after
        their last reader, as any drop); returns the bytes freed now."""
        freed = 0
        for obj in held:
            if obj in self._held:
                self._held.discard(obj)
                if not obj.pins:
                    freed += self.release_ranges(obj, now)
        return freed

    @property
    def held_count(self) -> int:
        return len(self._held)

    def release_ranges(self, obj: Obj, now: float) -> int:
        """Give a DROPPED, unpinned version's ranges back (or to quarantine); tell the nodes."""
        assert obj.state == DROPPED and not obj.pins
        hold_until = obj.deadline + self.grant_skew_s if obj.deadline else 0.0
        notify = self.membership.notify_freed
        freed = 0
        for rep in obj.replicas:
            segment = rep.segment
            if segment.gone:
                continue
            segment.objects.discard(obj)
            if hold_until > now:  # WRITING: a late write may still land
                notify(segment, rep.alloc_id, rep.offset, obj.size)
                self.quarantine.hold(segment, rep.offset, obj.reserved, hold_until, obj.tenant)
            else:
                self.free_sealed(obj, rep, now)
                freed += obj.reserved
        obj.replicas = ()
        return freed

    def free_sealed(self, obj: Obj, rep: Replica, now: float) -> None:
        """Give `rep`'s range of a sealed version back (no write can land in it any more) and
        tell its node. If a read grant for it may still live, the range is remembered until
        the node acknowledges the notice, so a shm/rdma write over it claims it first
        (state/read_frees.py says why)."""
        segment = rep.segment
        seq = self.membership.notify_freed(segment, rep.alloc_id, rep.offset, obj.size)
        if obj.read_at and obj.size:
            until = obj.read_at + self.read_grant_ttl_s + self.grant_skew_s
            if until > now:
                if segment.read_frees is None:
                    segment.read_frees = RecentReadFrees()
                segment.read_frees.add(rep.offset, obj.size, seq, until)
        segment.allocator.free(rep.offset)

    def on_last_unpin(self, obj: Obj) -> None:
        if obj.state == DROPPED:
            if obj not in self._held:  # else release_held does
                self.release_ranges(obj, self._clock())
        else:
            self.evictor.on_last_unpin(obj)

    # ---------------------------------------------------------------- sweeps

    def sweep_writers(self, now: float) -> int:
        """Revoke puts whose writer did not PutEnd before the write grants expired."""
        revoked = 0
        for put_id in self._deadlines.pop_due(now):
            obj = self.puts.get(put_id)
            if obj is None:
                continue  # completed or revoked already
            self.remember_expired(put_id)
            self.drop(obj, now)
            revoked += 1
        return revoked

    def lapse_soft_pin(self, obj: Obj, when: float) -> None:
        """`obj`'s soft pin lapses at `when`: it then becomes ordinary cache (sweep_soft_pins)."""
        assert obj.pin_kind == SOFT_PIN
        heapq.heappush(self._soft_lapses, (when, obj.put_id, obj))
        self._soft_lapse_at[obj.put_id] = when

    def note_soft_pin(self, obj: Obj, replicas: tuple[Replica, ...] | list[Replica],
                      now: float) -> None:
        """Tell the nodes of `replicas` the version's soft pin and its lapse (heartbeat
        replies), so a rebuilt master pins it again (storage_node/index.py `set_soft_pins`)."""
        when = self._soft_lapse_at.get(obj.put_id)
        until_ms = SOFT_PIN_NO_LAPSE_MS if when is None else (
            self._wall_ms() + max(0, int((when - now) * 1000)))
        for rep in replicas:
            self.membership.note_soft_pin(rep.segment, rep.alloc_id, until_ms)

    def sweep_soft_pins(self, now: float) -> int:
        """Soft pins whose TTL lapsed leave the second eviction pass; reads never extend them."""
        lapsed, heap = 0, self._soft_lapses
        while heap and heap[0][0] <= now:
            _, put_id, obj = heapq.heappop(heap)
            self._soft_lapse_at.pop(put_id, None)
            if obj.state == DROPPED or obj.pin_kind != SOFT_PIN:
                continue
            pooled = obj.pool_kind != 0
            if pooled:
                self.evictor.leave(obj)
            obj.pin_kind = NO_PIN  # a WRITING version enters the ordinary pool at complete()
            if pooled:
                self.evictor.enter(obj)
            lapsed += 1
        return lapsed

    def remember_expired(self, put_id: int) -> None:
        _remember(self.expired_puts, put_id, EXPIRED_PUTS_REMEMBERED)

    def acked_by_receipt(self, obj: Obj) -> None:
        """`obj`, adopted from a node's report, was just acknowledged to its writer."""
        _remember(self.acked_by_receipts, obj, ACKED_BY_RECEIPTS_REMEMBERED)

    # ---------------------------------------------------------------- rebuild

    def adopt(self, obj: Obj, replica: Replica, checksum: int, last_access: float) -> None:
        """A new COMPLETE version from a node's report (master/node_rpcs.py): its one replica is
        already reserved in its segment's allocator; the version is charged and, unless the
        removal log says it is hard-pinned (`obj.pin_kind`), evictable (in the second pass if
        its node reported a soft pin that has not lapsed). `last_access`: the caller's
        estimate (monotonic s) of when it was last used."""
        tenant = obj.tenant
        assert obj.state == WRITING and not obj.replicas, "adopt a fresh Obj"
        assert obj.key not in tenant.objects, "adopt of a key the tenant already holds"
        obj.state = COMPLETE
        obj.checksum = checksum
        obj.last_access = last_access
        obj.deadline = 0.0
        obj.replicas = (replica,)
        replica.segment.objects.add(obj)
        tenant.objects[obj.key] = obj
        charge(obj, obj.reserved)
        tenant.object_count += 1
        self.complete_count += 1
        if obj.pin_kind != HARD_PIN:
            self.evictor.enter(obj)
        if obj.engine_hash:  # its node's report carried it (below: `complete` notes it)
            tenant.index_engine_hash(obj)
        if self.observer is not None:
            self.observer.stored(obj)

    def note_engine_hash(self, obj: Obj, replicas: tuple[Replica, ...] | list[Replica]) -> None:
        """Tell the nodes of `replicas` the version's engine hash (heartbeat replies), so it is
        in their reports to a rebuilt master (storage_node/index.py `set_engine_hashes`)."""
        if obj.engine_hash:
            for rep in replicas:
                self.membership.note_engine_hash(rep.segment, rep.alloc_id, obj.engine_hash)

    def add_replica(self, obj: Obj, replica: Replica) -> None:
        """One more reported replica of a COMPLETE version (its range already reserved)."""
        assert obj.state == COMPLETE, f"add_replica to a {STATE_NAMES[obj.state]} object"
        self.evictor.resize(obj, 1)
        obj.replicas += (replica,)
        replica.segment.objects.add(obj)
        charge(obj, obj.reserved)
        if obj.pin_kind == SOFT_PIN:  # a repair copy, or a node's report of one more replica
            self.note_soft_pin(obj, (replica,), self._clock())
        self.watch(obj)

    def drop_replica(self, obj: Obj, replica: Replica) -> None:
        """Take one replica of a COMPLETE, unpinned version away (a surplus copy): its range is
        freed at once (the node sealed it, so no late write can land) and its node told."""
        assert obj.state == COMPLETE and not obj.pins and len(obj.replicas) > 1, "drop_replica"
        assert replica in obj.replicas, "drop_replica of a replica the object does not have"
        self.evictor.resize(obj, -1)
        obj.replicas = tuple([rep for rep in obj.replicas if rep is not replica])
        charge(obj, -obj.reserved)
        segment = replica.segment
        segment.objects.discard(obj)
        if not segment.gone:
            self.free_sealed(obj, replica, self._clock())

    def swap_replica(self, obj: Obj, old: Replica, new: Replica) -> None:
        """A tier move is durable (state/tiers.py): `new` (its range already allocated) takes
        `old`'s place in the object. `old`'s range stays allocated and in its node's index: the
        caller frees it once no reader's grant can still name it (readers may hold pins now).
        Charges and pools do not change: same size, same replica count."""
        assert obj.state == COMPLETE, "swap on an object that is not COMPLETE"
        assert old in obj.replicas and new not in obj.replicas, "swap of an unknown replica"
        was_on_disk = all(rep.segment.tier == TIER_DISK for rep in obj.replicas)
        obj.replicas = tuple([new if rep is old else rep for rep in obj.replicas])
        on_disk = all(rep.segment.tier == TIER_DISK for rep in obj.replicas)
        if on_disk != was_on_disk and self.observer is not None:
            self.observer.moved(obj, on_disk)  # its fastest replica changed tier
        if not any(rep.segment is old.segment for rep in obj.replicas):
            old.segment.objects.discard(obj)
        new.segment.objects.add(obj)

    def lose_replicas(self, segment: Segment, alloc_ids: set[int], now: float) -> int:
        """A node found these replicas corrupt and dropped them: forget them, free their ranges
        (the node already did), drop a version left with none. Returns the replicas lost."""
        lost = 0
        for obj in list(segment.objects):
            keep = tuple([rep for rep in obj.replicas
                          if not (rep.segment is segment and rep.alloc_id in alloc_ids)])
            if len(keep) == len(obj.replicas):
                continue
            gone = [rep for rep in obj.replicas if rep not in keep]
            if obj.state != DROPPED:
                charge(obj, -obj.reserved * len(gone))
                self.evictor.resize(obj, -len(gone))
            obj.replicas = keep
            segment.objects.discard(obj)
            for rep in gone:
                segment.allocator.free(rep.offset)
                lost += 1
            if not keep and obj.state != DROPPED:
                self.drop(obj, now)
            elif obj.state == COMPLETE:
                self.watch(obj)
        return lost

    def lose_segment(self, segment: Segment, now: float) -> int:
        """The segment's memory is gone: drop its replicas; objects left with none are dropped."""
        lost = 0
        for obj in list(segment.objects):
            remaining = tuple([rep for rep in obj.replicas if rep.segment is not segment])
            if len(remaining) == len(obj.replicas):
                continue
            if obj.state != DROPPED:
                charge(obj, -obj.reserved * (len(obj.replicas) - len(remaining)))
                self.evictor.resize(obj, len(remaining) - len(obj.replicas))
            obj.replicas = remaining
            if not remaining and obj.state != DROPPED:
                self.drop(obj, now)
                lost += 1
            elif obj.state == COMPLETE:
                self.watch(obj)
        segment.objects.clear()
        return lost


def _remember(memory: OrderedDict[Any, None], item: object, limit: int) -> None:
    """Add `item` to a memory of at most `limit` items, forgetting the oldest beyond it."""
    memory[item] = None
    if len(memory) > limit:
        memory.popitem(last=False)


def _ignore(obj: Obj) -> None:
    """The default `watch`, `dead_write` and `vanished`: nobody listens."""
