"""Rebuild: the object table, allocators and tenant usage, recovered from the nodes' own indexes.

A master that starts (or a node that restarts) does not know what the node's memory holds.
The node knows: its index lists every SEALED allocation (tenant, key, alloc id, offset,
length, checksum, epoch). It mounts with `report_follows` and sends them with ReportObjects,
segment by segment, in batches; this module turns each reported entry into master state:

- the range is `reserve`d in the segment's allocator; a range that is not free (overlaps a
  range placed since, or another reported entry) refuses the entry;
- (tenant, key) unknown: a COMPLETE object is created with that one replica, charged to the
  tenant (quota is not enforced on adoption: the bytes exist; eviction brings a tenant back
  under its quota), evictable like any object. Put-time soft/hard pins are not in the node's
  index, so adopted objects are plain (unpinned) objects;
- (tenant, key) known with the same size and checksum: the entry becomes one more replica of
  it (replicas of one object live on different nodes; a second one on the same node is
  refused, the very same replica reported twice is accepted again);
- (tenant, key) known with another value: the newest version wins, by alloc id. Alloc ids
  are (epoch << 22) + counter, so that order is (master epoch, issue order). A losing existing
  version is dropped the usual way (its nodes hear of it through the freed-range outbox); a
  losing reported entry is refused;
- alloc ids the master freed while the reporting node was down (the outbox of its previous
  incarnation) are refused, so a remove is not undone by the node's restart.

Refused entries go back to the node, which drops them from its index. The master's alloc id
counter is moved above every adopted id so a new allocation never reuses one. Until the
segment's last batch the segment is `rebuilding`: no placements (membership.py).

Invariant: an adopted replica's range is allocated in exactly its segment's allocator, and
its object is charged to its tenant exactly once per replica. It never touches payload bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cellar.master.requests import range_error, valid_id
from cellar.master.state.allocator import SegmentAllocator
from cellar.master.state.objects import COMPLETE, DROPPED, NO_PIN, Obj, Replica, charge
from cellar.proto.grant import key_tag

if TYPE_CHECKING:
    from cellar.master.service import MasterService
    from cellar.master.state.membership import Segment

MAX_REPORT_ENTRIES = 16384  # per ReportObjects call (the node sends 2000)


class ReportedLike(Protocol):
    tenant: str
    key: str
    alloc_id: int
    offset: int
    length: int
    checksum: int
    epoch: int


@dataclass
class AdoptResult:
    accepted: int = 0
    refused: list[int] = field(default_factory=list)
    replaced: int = 0  # existing versions dropped for a newer reported one


def adopt(
    service: MasterService, segment: Segment, entries: Sequence[ReportedLike], now: float,
    refuse_ids: set[int] | frozenset[int] = frozenset(),
) -> AdoptResult:
    """Adopt reported entries of one segment (see the module docstring)."""
    out = AdoptResult()
    highest = 0
    for e in entries:
        alloc_id = int(e.alloc_id)
        if _adopt_one(service, segment, e, alloc_id, now, refuse_ids, out):
            out.accepted += 1
            highest = max(highest, alloc_id)
        else:
            out.refused.append(alloc_id)
    if highest:
        service.ensure_alloc_ids_above(highest)
    return out


def _adopt_one(
    service: MasterService, segment: Segment, e: ReportedLike, alloc_id: int, now: float,
    refuse_ids: set[int] | frozenset[int], out: AdoptResult,
) -> bool:
    length = int(e.length)
    offset = int(e.offset)
    # Every value is off the wire: an alloc id outside 1..MAX_ID would push the id counter past
    # 64 bits (every later grant fails to pack), a range outside the segment corrupts the
    # allocator. Checked before anything is looked up or reserved.
    if not valid_id(alloc_id) or alloc_id in refuse_ids:
        return False
    if range_error(offset, length, segment.size_bytes):
        return False
    tenant = service.tenants.resolve(e.tenant)
    if tenant is None or service.key_error(e.key):
        return False
    key = e.key
    if alloc_id <= service.removed_alloc_id(tenant.name, key):
        return False  # a value a client removed since this node wrote it
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
            service.evictor.resize(existing, 1)
            existing.replicas += (Replica(segment, offset, alloc_id),)
            segment.objects.add(existing)
            charge(existing, existing.reserved)
            return True
        newest = max((rep.alloc_id for rep in existing.replicas), default=0)
        if alloc_id <= newest:
            return False  # an older version of the key
        if not _reserve(segment, offset, length):
            return False
        service.objects.drop(existing, now)
        out.replaced += 1
    elif not _reserve(segment, offset, length):
        return False
    reserved = SegmentAllocator.rounded_size(length)
    obj = Obj(tenant, key, length, reserved, service.next_put_id(), NO_PIN, 0.0,
              key_tag(tenant.name, key))
    obj.state = COMPLETE
    obj.checksum = checksum
    obj.last_access = now
    obj.replicas = (Replica(segment, offset, alloc_id),)
    segment.objects.add(obj)
    tenant.objects[key] = obj
    charge(obj, reserved)
    tenant.object_count += 1
    service.objects.complete_count += 1
    service.evictor.enter(obj)
    return True


def _reserve(segment: Segment, offset: int, length: int) -> bool:
    try:
        return segment.allocator.reserve(offset, length)
    except (ValueError, TypeError):
        return False


def drop_lost(service: MasterService, segment: Segment, alloc_ids: set[int], now: float) -> int:
    """The node found these replicas corrupt and dropped them: forget them, free their ranges."""
    lost = 0
    for obj in list(segment.objects):
        keep = tuple([rep for rep in obj.replicas if not (rep.segment is segment and rep.alloc_id in alloc_ids)])
        if len(keep) == len(obj.replicas):
            continue
        gone = [rep for rep in obj.replicas if rep not in keep]
        if obj.state != DROPPED:
            charge(obj, -obj.reserved * len(gone))
            service.evictor.resize(obj, -len(gone))
        obj.replicas = keep
        segment.objects.discard(obj)
        for rep in gone:
            segment.allocator.free(rep.offset)
            lost += 1
        if not keep and obj.state != DROPPED:
            service.objects.drop(obj, now)
    return lost


def new_counter(start: int) -> Any:
    return itertools.count(start).__next__
