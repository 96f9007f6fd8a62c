"""The full invariant check of the master's tables: O(n), for tests, the soak and the fault tests.

The transitions assert what they can in O(1) as they happen (allocator bounds, object states,
pin and tenant counts, grant fields). This walks everything once and checks what only a walk
can see:
- every segment's allocator keeps its own invariants (`SegmentAllocator.check_invariants`);
- every replica of a visible or being-written version is a live allocation of exactly its
  reserved size in its segment, on a segment that is mounted, one replica per node;
- a tenant's `used_bytes`, `writing_bytes`, `hard_pinned_bytes` and `object_count` are the sums
  over its versions (what `objects.charge` kept), and the object table's `complete_count` and
  in-flight puts match the tenants' tables;
- a tenant's `quarantined_bytes` is the sum of the quarantined ranges charged to it.
It raises `InvariantBroken` (an AssertionError) naming the first broken rule, and never changes
anything. It runs on the master's event loop between RPCs, so it sees a consistent snapshot;
with millions of objects it takes seconds: never on a request path.
"""

from __future__ import annotations

from cellar.master.state.membership import Membership
from cellar.master.state.objects import ObjectTable
from cellar.master.state.records import COMPLETE, HARD_PIN, WRITING
from cellar.master.state.tenants import Tenants


class InvariantBroken(AssertionError):
    """A table of the master is inconsistent (a bug, never a bad request)."""


def check_tables(membership: Membership, tenants: Tenants, objects: ObjectTable) -> int:
    """Check every table (module docstring); returns how many versions were checked."""
    for segment in membership.segments.values():
        segment.allocator.check_invariants()
    checked = complete = 0
    in_flight = set()
    for tenant in tenants.all():
        used = writing = hard_pinned = 0
        for table, state in ((tenant.objects, COMPLETE), (tenant.writing, WRITING)):
            for key, obj in table.items():
                _require(obj.tenant is tenant and obj.key == key and obj.state == state,
                         f"{tenant.name}/{key}: filed as {state} but is {obj.state}")
                nodes = set()
                for rep in obj.replicas:
                    segment = rep.segment
                    _require(membership.segments.get(segment.segment_id) is segment,
                             f"{tenant.name}/{key}: a replica on unmounted segment {segment.segment_id}")
                    _require(segment.allocator.allocated_size(rep.offset) == obj.reserved,
                             f"{tenant.name}/{key}: replica at {rep.offset} of segment "
                             f"{segment.segment_id} is not a live allocation of {obj.reserved} bytes")
                    _require(obj in segment.objects, f"{tenant.name}/{key}: not in its segment's set")
                    nodes.add(segment.node.node_id)
                _require(len(nodes) == len(obj.replicas), f"{tenant.name}/{key}: two replicas on one node")
                held = obj.reserved * len(obj.replicas)
                used += held
                if state == WRITING:
                    writing += held
                    in_flight.add(obj.put_id)
                    _require(objects.puts.get(obj.put_id) is obj, f"{tenant.name}/{key}: put not in flight")
                else:
                    complete += 1
                if obj.pin_kind == HARD_PIN:
                    hard_pinned += held
                _require(obj.pins >= 0, f"{tenant.name}/{key}: negative pin count")
                checked += 1
        _require((tenant.used_bytes, tenant.writing_bytes, tenant.hard_pinned_bytes)
                 == (used, writing, hard_pinned),
                 f"tenant {tenant.name}: charged (used, writing, hard-pinned) "
                 f"{(tenant.used_bytes, tenant.writing_bytes, tenant.hard_pinned_bytes)}, "
                 f"its versions hold {(used, writing, hard_pinned)}")
        _require(tenant.object_count == len(tenant.objects) + len(tenant.writing),
                 f"tenant {tenant.name}: object_count {tenant.object_count}")
    held = objects.quarantine.held_by_tenant()
    for name, tenant in tenants.by_name.items():
        if name:
            _require(tenant.quarantined_bytes == held.get(name, 0),
                     f"tenant {name}: quarantined_bytes {tenant.quarantined_bytes}, its ranges in "
                     f"quarantine hold {held.get(name, 0)}")
    _require(objects.complete_count == complete,
             f"complete_count {objects.complete_count}, tenants hold {complete}")
    _require(set(objects.puts) == in_flight, "in-flight puts differ from the tenants' WRITING keys")
    return checked


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantBroken(message)
