"""The get state machine: one batch of keys through GetReplicas -> one replica read per key.

What it owns
    `GetBatch` (first reads the keys whose last DRAM replica is still within the master's read
    trust without asking at all (`start_trusted`: master/state/read_trust.py, kept only if the
    bytes hash to the checksum), asks GetReplicas for the rest, records pins and sizes, orders replicas healthy-first and DRAM before disk,
    plans the early reads of keys whose last replica it remembers (`early_reads`: read while
    GetReplicas is in flight, kept only if the reply names that allocation), then one read per
    unsettled key, falls back to the next replica on a transfer error or
    checksum mismatch; in a deadline-bounded get, a disk read that the client's estimate says
    cannot arrive within what is left of the budget is not started: the key is LATE at once,
    and in prefix mode the keys after it are not read either),
    the per-key `GetEntry`, and turning finished entries into results: bytes, sizes, MISS or
    LATE (a key not read within a deadline-bounded call's budget). The choices a one-key get
    made as one read shares with it (client/one_read.py): `is_trusted`, `landed_digest`,
    `finished_bytes`.

The invariants
    - A get hands back only bytes whose xxh3_64 matches the checksum recorded at PutEnd; it tries
      each replica at most once; every pin it was given is handed to the face for release.
    - A destination that cannot hold its object fails the batch (`BufferTooSmall`) before any
      transfer starts, so nothing is written past a caller's buffer.

What it must never do
    Block, sleep or touch a socket.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from cellar.client.buffers import as_bytes, fresh_bytes, reserve_result_memory
from cellar.client.checks import NODE_TROUBLE, checksum
from cellar.client.early_reads import Location, Locations
from cellar.client.session_state import (
    DiskReadRates,
    NodeHealth,
    disk_segment_ids,
    replica_grant,
    routes_from_segments,
)
from cellar.client.statuses import (
    LATE,
    MISS,
    MISS_STATUSES,
    check_result_count,
    status_error,
    to_status,
)
from cellar.errors import BufferTooSmall, CellarError, IntegrityError, InvalidArgument, Status
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_READ, Grant
from cellar.transfer.base import ST_TIMEOUT, SegmentRoute, TransferOp, TransferResult, hash_views
from cellar.transfer.frame import ST_EXPIRED

# Read trust is cut short by this much (s): the master and this client time it on two clocks
# whose rates may differ (NTP slews them by up to 0.05%), and a timer may fire a little early
TRUST_MARGIN_S = 0.01


def is_trusted(loc: Location, now: float, health: NodeHealth) -> bool:
    """Whether `loc` (a key's remembered place, `Locations.find`) may be read without asking
    the master (`GetBatch.start_trusted`'s rule for one key, and client/one_read.py's): within
    its read trust, on a node no read failed on lately."""
    return loc.trusted_until > now and _readable(loc, health.unhealthy(), False)


def _readable(loc: Location, bad: AbstractSet[str], budgeted: bool) -> bool:
    """Whether a remembered place may be read before (or without) asking: not on a node a read
    failed on lately (`bad`), and not a disk replica in a deadline-bounded get."""
    return not (loc.disk and budgeted) and loc.route.node_id not in bad


def landed_digest(res: TransferResult, view: memoryview | None,
                  parts: tuple[memoryview, ...]) -> int:
    """The xxh3_64 of what a read landed in `view` (or `parts`): the transport's, if it hashed
    as it copied, else hashed here."""
    if res.checksum is not None:
        return res.checksum
    if parts:
        return hash_views(parts)
    assert view is not None
    return checksum(view)


@dataclass(slots=True)
class GetEntry:
    key: str
    dest: memoryview | None           # the caller's buffer, or None to allocate one
    status: Status | None = None      # final outcome; None while in flight
    message: str = ""
    size: int = -1
    checksum: int = 0
    view: memoryview | None = None    # where this object's bytes land (size bytes)
    result: Any = None                # the object `view` fills when the batch allocates
    candidates: list[tuple[SegmentRoute, Grant, int]] = field(default_factory=list)
    tried: int = 0
    corrupt: int = 0                  # replicas that failed their checksum
    failures: list[str] = field(default_factory=list)
    timed_out: bool = False           # the last read attempt ran out of time
    grant_expired: bool = False       # a node refused a read: its grant had expired
    late: bool = False                # not read within a deadline-bounded call's budget
    cut: bool = False                 # found, but after an unreadable key (prefix mode)
    parts: tuple[memoryview, ...] = ()  # scatter-gather destination (dest is None then)

    def error(self) -> CellarError:
        assert self.status is not None and self.status != Status.OK
        if self.corrupt:
            return IntegrityError(f"{self.key!r}: no replica passed its checksum "
                                  f"({'; '.join(self.failures)})")
        return status_error(self.status, self.message, self.key)

    @property
    def is_miss(self) -> bool:
        return self.status in MISS_STATUSES and not self.corrupt

    @property
    def refused(self) -> bool:
        """Found (the master gave its replicas) but none could be read, for a reason other
        than the budget or a prefix cut: a node refused, a transfer failed, a checksum."""
        return self.status not in (None, Status.OK) and self.size >= 0 and not self.late \
            and not self.cut


class GetBatch:
    """One batch of keys through GetReplicas -> one replica read per key (falling back to the
    next replica on a transfer error or checksum mismatch) -> pins queued for release."""

    def __init__(self, keys: Sequence[str],
                 dests: Sequence[memoryview | tuple[memoryview, ...]] | None, *,
                 health: NodeHealth, allocate: Any = fresh_bytes, budgeted: bool = False,
                 prefix: bool = False, locations: Locations | None = None) -> None:
        if dests is not None and len(dests) != len(keys):
            raise InvalidArgument(f"{len(keys)} keys but {len(dests)} buffers")
        if dests is None:
            self.entries = [GetEntry(k, None) for k in keys]
        else:  # a tuple of views is one key's scatter-gather destination
            self.entries = [GetEntry(k, None, parts=d) if isinstance(d, tuple) else GetEntry(k, d)
                            for k, d in zip(keys, dests, strict=True)]
        self.pin_ids: list[int] = []
        self._health = health
        self._allocate = allocate
        self._budgeted = budgeted  # a key whose reads ran out of time is LATE, not a miss
        self._prefix = prefix  # a key settled LATE before its read cuts the keys after it
        self.disk_segments: frozenset[int] = frozenset()  # the reply's disk-tier segments
        self.round_disk_bytes: dict[str, int] = {}  # node -> disk bytes the last round read
        self._op_owner: list[int] = []
        self._planned: list[TransferOp] = []
        self._locations = locations  # where keys were last read (None: no early reads)
        self._early: list[tuple[int, Location]] = []  # (entry index, where it is read early)
        self._master_time_ms = 0  # the reply's, for the grants' lifetimes
        self._asked: list[GetEntry] = self.entries  # the entries GetReplicas was asked for
        self.asked_at = 0.0  # monotonic s when the request was built (read trust counts from it)
        self._trusted_until = 0.0  # the reply's read trust ends (0: none)

    def start_trusted(self, now: float | None = None) -> list[TransferOp]:
        """Trusted reads: one per key whose last DRAM replica's read trust has not ended
        (master/state/read_trust.py: until then no change of the key is acknowledged), read
        without asking the master at all; call first, hand the results to `on_trusted`. In
        prefix mode only the leading keys that have one (a later key's bytes are used only
        if every key before it is read)."""
        return self._from_locations(now, trusted=True)

    def on_trusted(self, results: Sequence[TransferResult]) -> None:
        """Keep a trusted read's bytes when they hash to the checksum they were read for (the
        node admitted the read under the grant, so they are that allocation's, and that
        version was current at most the trust before). Any other key (and in prefix mode
        every key after a failed one) is cleared and asked for as usual."""
        check_result_count("trusted read", len(results), len(self._early))
        kept = failed = 0
        broken = False
        for (i, loc), res in zip(self._early, results, strict=True):
            e = self.entries[i]
            if not broken and res.ok and self._digest(e, res) == loc.checksum:
                e.status, e.size, e.checksum = Status.OK, loc.size, loc.checksum
                kept += 1
                continue
            if not broken:
                failed += 1
                broken = self._prefix  # the keys after it wait for the master's answer
            self._scrub(e, loc.size)  # read again into the same memory, as a discarded early read
        self._early = []
        if self._locations is not None:
            self._locations.counted_trusted(kept, failed)

    def unsettled(self) -> bool:
        return any(e.status is None for e in self.entries)

    def start_early(self, now: float | None = None) -> list[TransferOp]:
        """The early reads (client/early_reads.py): one per key whose last replica is known, on
        a node no read failed on lately, whose destination fits it; call before the reply,
        hand the results to `on_early`."""
        return self._from_locations(now, trusted=False)

    def _from_locations(self, now: float | None, trusted: bool) -> list[TransferOp]:
        locations = self._locations
        if locations is None or not len(locations):
            return []
        now = time.monotonic() if now is None else now
        bad = self._health.unhealthy()  # a node that failed a read lately is not tried early
        ops: list[TransferOp] = []
        for i, e in enumerate(self.entries):
            if e.status is not None:
                continue
            loc = locations.find(e.key, now)
            if trusted and (loc is None or loc.trusted_until <= now):
                if self._prefix:
                    break
                continue
            if loc is None or not _readable(loc, bad, self._budgeted):
                continue
            grant = loc.grant
            if e.parts:
                if sum(p.nbytes for p in e.parts) != loc.size:
                    continue
                ops.append(TransferOp(loc.route, grant, grant.offset, want_checksum=True,
                                      parts=e.parts))
            else:
                if e.dest is not None:
                    if e.dest.nbytes < loc.size:
                        continue
                    e.view = e.dest[:loc.size]
                else:
                    e.result, e.view = self._allocate(loc.size)
                ops.append(TransferOp(loc.route, grant, grant.offset, e.view, None, True))
            self._early.append((i, loc))
        return ops

    def on_early(self, results: Sequence[TransferResult]) -> None:
        """After `on_reply`: keep an early read's bytes only if the reply names the allocation
        read under, with the size and checksum the bytes hash to; otherwise the key is read
        from the reply's replicas (and a caller's buffer is first cleared of the early bytes)."""
        check_result_count("early read", len(results), len(self._early))
        if self._prefix:
            self.keep_prefix()  # a key after a miss is not used, early bytes or not
        kept: list[tuple[str, SegmentRoute, Grant, int, int, bool]] = []
        for (i, loc), res in zip(self._early, results, strict=True):
            e = self.entries[i]
            fresh = self._confirms(e, loc) if e.status is None and res.ok else None
            if fresh is not None and self._digest(e, res) == e.checksum:
                e.status = Status.OK
                kept.append((e.key, *fresh))
                continue
            self._scrub(e, loc.size)
        if self._locations is not None:
            self._locations.remember(kept, self._master_time_ms, trusted_until=self._trusted_until,
                                     asked_at=self.asked_at)
            self._locations.counted(len(kept), len(self._early) - len(kept))
        self._early = []

    def drop_early(self) -> None:
        """The lookup failed: clear what early reads wrote into the caller's buffers."""
        for i, loc in self._early:
            self._scrub(self.entries[i], loc.size)
        self._early = []

    def _confirms(self, e: GetEntry, loc: Location) -> tuple[SegmentRoute, Grant, int, int,
                                                            bool] | None:
        """The reply's replica that `loc` read from, unchanged, as `Locations.remember` keeps
        it (with the reply's fresh grant: the kept one would expire sooner); else None."""
        if e.size != loc.size or e.checksum != loc.checksum:
            return None
        old = loc.grant
        for route, grant, _offset in e.candidates:
            if (grant.alloc_id == old.alloc_id and grant.segment_id == old.segment_id
                    and grant.offset == old.offset and grant.length == old.length):
                return (route, grant, e.size, e.checksum,
                        route.segment_id in self.disk_segments)
        return None

    @staticmethod
    def _digest(e: GetEntry, res: TransferResult) -> int:
        assert e.parts or e.view is not None
        return landed_digest(res, e.view, e.parts)

    def _scrub(self, e: GetEntry, nbytes: int) -> None:
        """An early read of `nbytes` not kept: zero what it may have written into the caller's
        memory (the key is read again into it, or ends without a value); drop a view it
        allocated unless the key is still to be read into it."""
        if self._locations is not None:
            self._locations.forget(e.key)
        if e.parts:
            for part in e.parts:
                part[:] = bytes(part.nbytes)
        elif e.dest is not None:
            e.dest[:nbytes] = bytes(nbytes)
        elif e.status not in (None, Status.OK):
            release_views([e])

    def request(self, header: Any, unpin_ids: Sequence[int] = ()) -> Any:
        asked = self._asked = [e for e in self.entries if e.status is None]
        self.asked_at = time.monotonic()
        return pb.GetReplicasRequest(header=header, keys=[e.key for e in asked],
                                     unpin_ids=list(unpin_ids))

    def on_reply(self, reply: Any) -> None:
        """Record pins and sizes, order replicas; BufferTooSmall before any transfer starts."""
        results = reply.results
        check_result_count("GetReplicas", len(results), len(self._asked))
        self.pin_ids = [r.pin_id for r in results if r.pin_id]
        self._master_time_ms = int(reply.header.master_time_ms)
        trust_ms = reply.read_trust_ms
        self._trusted_until = (self.asked_at + trust_ms / 1000 - TRUST_MARGIN_S
                               if trust_ms and self.asked_at else 0.0)
        routes = routes_from_segments(reply.segments)
        disk = self.disk_segments = disk_segment_ids(reply.segments)
        bad = self._health.unhealthy()  # once per batch, not per key
        too_small: GetEntry | None = None
        for e, res in zip(self._asked, results, strict=True):
            if res.status:
                e.status, e.message = to_status(res.status), res.message
                continue
            size = e.size = res.size_bytes
            e.checksum = res.checksum
            replicas = res.replicas
            if bad and len(replicas) > 1:
                replicas = ([r for r in replicas if r.node_id not in bad]
                            + [r for r in replicas if r.node_id in bad])
            candidates = e.candidates
            for rep in replicas:
                checked = replica_grant(rep, routes, size, GRANT_OP_READ)
                if isinstance(checked, str):
                    e.failures.append(f"node {rep.node_id}: {checked}")
                    continue
                route, grant = checked
                candidates.append((route, grant, grant.offset))
            if disk and len(candidates) > 1:  # DRAM first (a stable sort keeps health order)
                candidates.sort(key=lambda c: c[0].segment_id in disk)
            if not candidates:
                e.status = Status.UNAVAILABLE
                e.message = "no usable replica" + (f" ({'; '.join(e.failures)})" if e.failures else "")
                continue
            if too_small is None and (e.dest.nbytes < e.size if e.dest is not None
                                      else e.parts and sum(p.nbytes for p in e.parts) != e.size):
                too_small = e
        if too_small is not None:
            _refuse_destination(too_small)
        if self._allocate is fresh_bytes:  # results this batch allocates stay reusable
            reserve_result_memory(sum(e.size for e in self.entries
                                      if e.status is None and e.dest is None and not e.parts))
        for e in self.entries:
            if e.status is None:
                if e.dest is not None:
                    e.view = e.dest[:e.size]
                elif not e.parts and (e.view is None or e.view.nbytes != e.size):
                    release_views([e])  # an early read's, sized for the old value
                    e.result, e.view = self._allocate(e.size)
                if e.size == 0:
                    e.status = Status.OK

    def next_ops(self, budget_left_s: float | None = None,
                 rates: DiskReadRates | None = None) -> list[TransferOp]:
        """One read per unsettled key from its next untried replica; [] when all are settled.
        With `budget_left_s` (seconds) and `rates`, a disk read expected to take longer (this
        round's disk reads from the same node queued before it) settles its key LATE."""
        ops: list[TransferOp] = []
        owners: list[int] = []
        disk_queued: dict[str, int] = {}  # node -> disk bytes this round reads before this key
        cut = False
        for i, e in enumerate(self.entries):
            if e.status is not None:
                continue
            if cut:
                e.status, e.message = Status.NOT_FOUND, "after a late key (prefix mode)"
                continue
            if e.tried >= len(e.candidates):
                if self._budgeted and e.timed_out:
                    self._settle_late(e)
                    continue
                e.status = Status.INTERNAL if e.corrupt else Status.UNAVAILABLE
                e.message = "no replica could be read: " + "; ".join(e.failures)
                continue
            route, grant, offset = e.candidates[e.tried]
            if route.segment_id in self.disk_segments and budget_left_s is not None:
                queued = disk_queued.get(route.node_id, 0) + e.size
                if rates is None or rates.seconds(route.node_id, queued) > budget_left_s:
                    self._settle_late(e)  # later candidates are disk too (DRAM sorts first)
                    cut = self._prefix
                    continue
                disk_queued[route.node_id] = queued
            if e.parts:
                ops.append(TransferOp(route, grant, offset, want_checksum=True, parts=e.parts))
            else:
                assert e.view is not None
                ops.append(TransferOp(route, grant, offset, e.view, None, True))
            owners.append(i)
        self._planned, self._op_owner = ops, owners
        return ops

    def can_fall_back(self) -> bool:
        """Whether a key of the current round has another replica to try after this one."""
        return any(self.entries[i].tried + 1 < len(self.entries[i].candidates)
                   for i in self._op_owner)

    def on_read_results(self, results: Sequence[TransferResult]) -> None:
        check_result_count("read", len(results), len(self._op_owner))
        disk_bytes: dict[str, int] = {}
        disk = self.disk_segments
        remember = self._locations is not None
        read: list[tuple[str, SegmentRoute, Grant, int, int, bool]] = []  # for early reads
        for op, i, res in zip(self._planned, self._op_owner, results, strict=True):
            e = self.entries[i]
            e.tried += 1
            node = op.route.node_id
            if res.ok and op.route.segment_id in disk:
                disk_bytes[node] = disk_bytes.get(node, 0) + e.size
            if not res.ok:
                e.timed_out = res.status == ST_TIMEOUT
                e.grant_expired |= res.status == ST_EXPIRED
                e.failures.append(f"node {node}: {res}")
                if res.status in NODE_TROUBLE:
                    self._health.mark_failed(node)
                continue
            if self._digest(e, res) == e.checksum:
                e.status = Status.OK
                if remember and e.size:
                    read.append((e.key, op.route, op.grant, e.size, e.checksum,
                                 op.route.segment_id in disk))
            else:
                e.corrupt += 1
                e.failures.append(f"node {node}: checksum mismatch")
        self._planned, self._op_owner = [], []
        self.round_disk_bytes = disk_bytes
        if read:
            assert self._locations is not None
            self._locations.remember(read, self._master_time_ms, trusted_until=self._trusted_until,
                                     asked_at=self.asked_at)

    def settle_late(self) -> None:
        """The budget ran out: every key still in flight is LATE (no more reads are planned)."""
        for e in self.entries:
            if e.status is None:
                self._settle_late(e)

    @staticmethod
    def _settle_late(e: GetEntry) -> None:
        e.status, e.late = Status.UNAVAILABLE, True
        e.message = "not read within the budget"

    def keep_prefix(self) -> None:
        """Prefix mode: keys after the first one that cannot be read are not read at all."""
        cut = False
        for e in self.entries:
            if cut and e.status is None:
                e.status, e.message = Status.NOT_FOUND, "after a miss (prefix mode)"
                e.cut = e.size >= 0  # the master had it: found but not used
            elif e.status is not None and e.status != Status.OK:
                cut = True


def _refuse_destination(e: GetEntry) -> None:
    """BufferTooSmall (or, for parts holding more than the object, InvalidArgument) before any
    transfer, so nothing lands past the caller's memory and no part is left half-filled."""
    if e.dest is not None:
        raise BufferTooSmall(f"buffer for {e.key!r} holds {e.dest.nbytes} bytes; the object is "
                             f"{e.size} bytes", needed_bytes=e.size)
    total = sum(p.nbytes for p in e.parts)
    if total < e.size:
        raise BufferTooSmall(f"parts for {e.key!r} hold {total} bytes; the object is {e.size} "
                             "bytes", needed_bytes=e.size)
    raise InvalidArgument(f"parts for {e.key!r} total {total} bytes; the object is {e.size} "
                          "bytes (parts must add up to the object exactly)")


def take_value(entry: GetEntry) -> bytes:
    """The bytes an allocating get read for `entry`; its view is released first, so nothing
    can write into the returned object afterwards."""
    assert entry.status == Status.OK and entry.view is not None
    view, value = entry.view, entry.result
    entry.view = entry.result = None
    return finished_bytes(view, value)


def finished_bytes(view: memoryview, value: Any) -> bytes:
    """A `fresh_bytes` object filled through `view`, as bytes: the view released first, so
    nothing can write into the object afterwards."""
    try:
        view.release()
    except BufferError:  # something still holds the storage: hand out a copy instead
        return bytes(view)
    return as_bytes(value)


def release_views(entries: Iterable[GetEntry]) -> None:
    """Drop every view an allocating get still holds (on errors and misses)."""
    for e in entries:
        if e.view is not None and e.dest is None:
            e.view.release()
        e.view = None
        e.result = None


def miss_or_raise(entry: GetEntry) -> None:
    """For batched gets: return quietly for a miss, raise for anything worse."""
    if entry.status != Status.OK and not entry.is_miss:
        raise entry.error()



def into_result(entry: GetEntry) -> int:
    """A batched `_into` get's per-key result: the size, MISS, LATE, or raise for worse."""
    if entry.status == Status.OK:
        return entry.size
    if entry.late:
        return LATE
    miss_or_raise(entry)
    return MISS
