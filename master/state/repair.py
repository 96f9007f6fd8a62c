"""The repair queue: objects whose replica count differs from the one they were written with.

What it owns: the watched versions (in the order their count first went wrong, so the oldest
loss is repaired first), the copies in flight (one per object, by the new replica's alloc id),
the copies waiting for their target node's next heartbeat, one byte bucket per node (the
pacing) and the counters of what it did.

The story. A version keeps `wanted`, the count its put asked for (records.Obj). A replica's
node can be lost (expired, a segment unmounted, the verifier found it corrupt), a node can be
drained (its replicas no longer count: they are on their way out) and a lost node can come
back with its old replicas (one more than wanted). The object table calls `watch(obj)` at each
of those moments (state/objects.py). `plan` then looks at the watched versions, oldest first:
- fewer live replicas than wanted: one copy is planned from a surviving replica (the source: a
  replica on a node that is ACTIVE, draining or not) to a range placed on another node (the
  placement's own rules: distinct nodes, ACTIVE and not draining, room; a version whose live
  replicas are all on disk tiers is copied to another node's disk tier, as it was, and to
  DRAM only when no disk has room). The range is
  allocated now and is not a replica yet: readers never see it. The behaviour around this
  (master/repair.py) hands the copy to the target node with a read grant for the source and a
  write grant for the target; the node copies node to node and reports (`finish`). Only a
  report whose segment, offset, length and checksum are exactly what was granted, for a
  version still visible, makes the range a replica (`ObjectTable.add_replica`). Anything else,
  or no report before the write grant expires (`expire`), frees the range through the
  quarantine (a late write under that grant cannot land in a later object) and watches the
  version again;
- more live replicas than wanted and no reader pinning it: the surplus replica is dropped
  (`drop_replica`), the newest one first (a returning node's report comes last);
- exactly wanted: it leaves the queue.
Pacing: a copy takes its size from the byte buckets of both its source and its target node,
refilled at `bytes_per_s` each, holding at most one second's worth; a copy starts while both
buckets are positive, so each node reads and writes at most `bytes_per_s` on average.

Invariants: a version has at most one copy in flight; a task's range is allocated in its
target segment until it becomes a replica or is freed, exactly once; nothing is planned for a
version that is not COMPLETE and visible. It never reads a clock (callers pass `now`), never
signs a grant and never touches payload bytes.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import islice
from typing import TYPE_CHECKING

from cellar.master.state.records import (
    ACTIVE,
    COMPLETE,
    WRITING,
    Obj,
    Replica,
    being_replaced,
    on_disk_only,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from cellar.master.state.membership import Membership
    from cellar.master.state.objects import ObjectTable
    from cellar.master.state.placement import Placement
    from cellar.master.state.quarantine import Quarantine
    from cellar.master.state.records import Node, Segment

MAX_SCANS_PER_TICK = 2048      # watched versions `plan` looks at per call
MAX_COPIES_PER_NODE = 256      # copies in flight towards one target node
BUCKET_SECONDS = 1.0           # a node's byte bucket holds at most this long's worth of bytes
UNSENT_TIMEOUT_FACTOR = 2.0    # a copy not handed out within this many write-grant TTLs is given up
DRAIN_RESCAN_S = 1.0           # how often a draining node's objects are looked at again


class CopyTask:
    """One planned copy: `source` is a replica of `obj`; `target`+`offset` the new range."""

    __slots__ = ("alloc_id", "obj", "source", "target", "offset", "deadline", "sent")

    def __init__(self, alloc_id: int, obj: Obj, source: Replica, target: Segment, offset: int,
                 deadline: float) -> None:
        self.alloc_id = alloc_id
        self.obj = obj
        self.source = source
        self.target = target
        self.offset = offset
        self.deadline = deadline  # monotonic: no report by then, the copy has failed
        self.sent = False


def live(rep: Replica) -> bool:
    """Whether a replica counts towards its object's replica count."""
    segment = rep.segment
    return not segment.gone and not segment.node.draining


def live_count(obj: Obj) -> int:
    return sum(1 for rep in obj.replicas if live(rep))


def visible(obj: Obj) -> bool:
    return obj.state == COMPLETE and obj.tenant.objects.get(obj.key) is obj


class RepairQueue:
    """Watched versions, copies in flight, byte buckets (see the module docstring)."""

    def __init__(
        self, *, objects: ObjectTable, membership: Membership, placement: Placement,
        quarantine: Quarantine, next_alloc_id: Callable[[], int], bytes_per_s: int,
        grant_ttl_s: float, grant_skew_s: float,
        disk_range: Callable[[int, Collection[str]], tuple[Segment, int] | None],
    ) -> None:
        assert bytes_per_s > 0 and grant_ttl_s > 0 and grant_skew_s >= 0
        self.objects = objects
        self.membership = membership
        self.placement = placement
        # A range on another node's disk tier (state/tiers.py `disk_range`), None without room
        self.disk_range = disk_range
        self.quarantine = quarantine
        self.next_alloc_id = next_alloc_id
        self.bytes_per_s = bytes_per_s
        self.grant_ttl_s = grant_ttl_s
        self.grant_skew_s = grant_skew_s
        self.watched: OrderedDict[Obj, None] = OrderedDict()
        self.tasks: dict[int, CopyTask] = {}
        self.by_obj: dict[Obj, CopyTask] = {}
        self.unsent: dict[str, deque[CopyTask]] = {}   # target node id -> tasks to hand out
        self.in_flight: dict[str, int] = {}            # target node id -> tasks planned
        self._buckets: dict[str, tuple[float, float]] = {}  # node id -> (bytes, at)
        self._drains_scanned_at = 0.0
        self.bytes_copied = 0
        self.copies_done = 0
        self.copy_failures = 0
        self.replicas_trimmed = 0
        objects.watch = self.watch

    # ---------------------------------------------------------------- watching

    def watch(self, obj: Obj) -> None:
        """`obj`'s count may differ from `wanted`; a version already watched keeps its place."""
        if obj not in self.watched:
            self.watched[obj] = None

    def under_replicated(self) -> int:
        """Versions known to have fewer live replicas than wanted (O(watched), for metrics)."""
        short = sum(1 for obj in self.watched if visible(obj) and live_count(obj) < obj.wanted)
        return short + sum(1 for obj in self.by_obj if obj not in self.watched)

    # ---------------------------------------------------------------- planning

    def plan(self, now: float) -> int:
        """Look at up to MAX_SCANS_PER_TICK watched versions; returns the copies planned."""
        if now - self._drains_scanned_at >= DRAIN_RESCAN_S:
            self._drains_scanned_at = now
            for node in list(self.membership.nodes.values()):
                if node.draining:
                    self.drain_remaining(node)
        planned = 0
        for obj in list(islice(self.watched, MAX_SCANS_PER_TICK)):
            if not visible(obj):
                del self.watched[obj]
                continue
            if obj in self.by_obj:
                continue  # its copy's report decides
            count = live_count(obj)
            if count < obj.wanted:
                if self._plan_copy(obj, now):
                    planned += 1
                    del self.watched[obj]
            elif count > obj.wanted:
                if not obj.pins:  # a reader may hold a grant for any replica: wait for it
                    self._trim(obj)
                    if live_count(obj) <= obj.wanted:
                        del self.watched[obj]
            else:
                del self.watched[obj]
        return planned

    def copy_target(self, obj: Obj) -> int:
        """The alloc id of the range a copy of `obj` is being made into, 0 when none is."""
        task = self.by_obj.get(obj)
        return task.alloc_id if task is not None else 0

    def _plan_copy(self, obj: Obj, now: float) -> bool:
        if being_replaced(obj):
            return False  # its upsert is in flight: a copy now would outrank it (records.py)
        source = next((rep for rep in obj.replicas
                       if not rep.segment.gone and rep.segment.node.state == ACTIVE), None)
        if source is None:
            return False  # every replica is on a silent node: wait for it or for its expiry
        source_node = source.segment.node.node_id
        if not self._has_budget(source_node, now):
            return False
        used = {rep.segment.node.node_id for rep in obj.replicas}
        spot = None
        if on_disk_only(obj):  # cold: not into another node's DRAM
            spot = self.disk_range(obj.size, used)
        if spot is None:
            spot = self.placement.place_one(obj.size, used, now)
        if spot is None:
            return False  # no room on any eligible node: try again later
        target, offset = spot
        target_node = target.node.node_id
        if (not self._has_budget(target_node, now)
                or self.in_flight.get(target_node, 0) >= MAX_COPIES_PER_NODE):
            target.allocator.free(offset)  # never granted: free at once
            return False
        self._take(source_node, obj.reserved)
        self._take(target_node, obj.reserved)
        task = CopyTask(self.next_alloc_id(), obj, source, target, offset,
                        now + UNSENT_TIMEOUT_FACTOR * self.grant_ttl_s)
        self.tasks[task.alloc_id] = task
        self.by_obj[obj] = task
        self.unsent.setdefault(target_node, deque()).append(task)
        self.in_flight[target_node] = self.in_flight.get(target_node, 0) + 1
        return True

    def _trim(self, obj: Obj) -> None:
        for rep in reversed(obj.replicas):
            if live_count(obj) <= obj.wanted:
                return
            if live(rep):
                self.objects.drop_replica(obj, rep)
                self.replicas_trimmed += 1

    # ---------------------------------------------------------------- pacing

    def _has_budget(self, node_id: str, now: float) -> bool:
        cap = self.bytes_per_s * BUCKET_SECONDS
        tokens, at = self._buckets.get(node_id, (cap, now))
        tokens = min(cap, tokens + (now - at) * self.bytes_per_s)
        self._buckets[node_id] = (tokens, now)
        return tokens > 0

    def _take(self, node_id: str, nbytes: int) -> None:
        tokens, at = self._buckets[node_id]
        self._buckets[node_id] = (tokens - nbytes, at)

    # ---------------------------------------------------------------- the target node

    def take_for(self, node: Node, now: float, limit: int) -> list[CopyTask]:
        """Copies to hand to `node` in this heartbeat reply (at most `limit`); each one's
        deadline becomes the write grant's expiry the caller signs (now + grant TTL)."""
        queue = self.unsent.get(node.node_id)
        out: list[CopyTask] = []
        while queue and len(out) < limit:
            task = queue.popleft()
            if task.target.node is not node or self.tasks.get(task.alloc_id) is not task:
                continue
            if not visible(task.obj) or task.source.segment.gone or task.source not in task.obj.replicas:
                self._fail(task, now, counted=False)
                continue
            task.sent = True
            task.deadline = now + self.grant_ttl_s
            out.append(task)
        return out

    def finish(self, node: Node, alloc_id: int, segment_id: int, offset: int, length: int,
               checksum: int, ok: bool, now: float) -> bool:
        """A target node's report of one copy; True when the range became a replica."""
        task = self.tasks.get(alloc_id)
        if task is None or task.target.node is not node or not task.sent:
            return False  # not a copy this node was handed (or one already given up)
        obj = task.obj
        exact = (segment_id, offset, length, checksum) == (
            task.target.segment_id, task.offset, obj.size, obj.checksum)
        if not (ok and exact and visible(obj) and not task.target.gone):
            self._fail(task, now, counted=visible(obj))
            return False
        self._forget(task)
        if any(rep.segment.node is node for rep in obj.replicas):
            self._release(task, now)  # the node got a replica meanwhile (a report): no second
            self.watch(obj)
            return False
        replica = Replica(task.target, task.offset, alloc_id)
        self.objects.add_replica(obj, replica)  # watches obj
        self.objects.note_engine_hash(obj, (replica,))  # the copy's node keeps it too
        self.bytes_copied += obj.size
        self.copies_done += 1
        return True

    def expire(self, now: float) -> int:
        """Give up copies not reported by their deadline; returns how many."""
        late = [task for task in self.tasks.values() if task.deadline <= now or task.target.gone]
        for task in late:
            self._fail(task, now, counted=not task.target.gone)
        return len(late)

    def _fail(self, task: CopyTask, now: float, *, counted: bool) -> None:
        self._forget(task)
        self._release(task, now)
        if counted:
            self.copy_failures += 1
        if visible(task.obj):
            self.watch(task.obj)

    def _forget(self, task: CopyTask) -> None:
        del self.tasks[task.alloc_id]
        if self.by_obj.get(task.obj) is task:
            del self.by_obj[task.obj]
        node_id = task.target.node.node_id
        left = self.in_flight.get(node_id, 0) - 1
        if left > 0:
            self.in_flight[node_id] = left
        else:
            self.in_flight.pop(node_id, None)

    def _release(self, task: CopyTask, now: float) -> None:
        """Free a task's range: through the quarantine until its write grant (if one was
        signed) can no longer be used, and tell the node to drop what it holds there."""
        target = task.target
        if target.gone:
            return  # the allocator went with the segment
        if not task.sent:
            target.allocator.free(task.offset)
            return
        self.membership.notify_freed(target, task.alloc_id, task.offset, task.obj.size)
        self.quarantine.hold(target, task.offset, task.obj.reserved,
                             max(task.deadline, now) + self.grant_skew_s)

    # ---------------------------------------------------------------- drain

    def drain_remaining(self, node: Node) -> tuple[int, int]:
        """(objects on `node` still short of their count elsewhere, bytes of them); watches
        the COMPLETE ones. A version being written there counts as remaining until its put
        ends (then it is copied like the others)."""
        remaining = nbytes = 0
        seen: set[Obj] = set()
        for segment in node.segments.values():
            for obj in _objects(segment):
                if obj in seen:
                    continue
                seen.add(obj)
                if obj.state == WRITING:
                    remaining += 1
                    nbytes += obj.size
                elif visible(obj) and live_count(obj) < obj.wanted:
                    remaining += 1
                    nbytes += obj.size
                    self.watch(obj)
        return remaining, nbytes


def _objects(segment: Segment) -> Iterable[Obj]:
    return list(segment.objects)
