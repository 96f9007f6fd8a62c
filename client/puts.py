"""The put state machine: one batch of keys through PutStart -> replica writes -> PutEnd.

What it owns
    `PutBatch` (a face asks it for the next request, hands it the reply, gets the writes to
    perform, hands back their results), the per-key `PutEntry`, and hashing of put values
    (which a face may do behind PutStart, since the master needs only sizes).

The invariants
    - A put is visible only after PutEnd: a key whose replicas were not all written is revoked,
      never ended. Retries of one key are bounded (`MAX_PUT_ATTEMPTS`).
    - Results come back in input order, one per key; a batch never exceeds the master's batch
      limit (the flows cut key lists with `batch_ranges`).

What it must never do
    Block, sleep or touch a socket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cellar.client.checks import MAX_PUT_ATTEMPTS, NODE_TROUBLE, checksum
from cellar.client.put_ahead import PutAheadPool, Shape
from cellar.client.session_state import NodeHealth, replica_grant, routes_from_segments
from cellar.client.statuses import check_result_count, status_error, to_status
from cellar.errors import CellarError, InvalidArgument, Status
from cellar.proto import cellar_pb2 as pb
from cellar.proto import engine_hash
from cellar.proto.grant import GRANT_OP_WRITE, Grant
from cellar.proto.tiers import TIER_DISK
from cellar.transfer.base import SegmentRoute, TransferOp, TransferResult, hash_views
from cellar.transfer.frame import WriteMeta

MAX_SOFT_PIN_TTL_MS = 1 << 53          # bound on garbage input (the master has its own maximum)
# A key this client put, where it may read it early: (key, route, write grant, size, checksum,
# on disk), as `early_reads.Locations.remember` takes it
Written = tuple[str, SegmentRoute, Grant, int, int, bool]
# PutEnd statuses of a put-ahead allocation after which the key is put again through PutStart
AHEAD_RETRY = frozenset({Status.EXPIRED, Status.NOT_FOUND})
MAX_PREFERRED_HOST_CHARS = 256         # a host id (machine-id or hostname), as the master bounds it


@dataclass(frozen=True, slots=True)
class PutHints:
    """What a write may ask of the master beyond replicas and soft pin (carried in each
    PutStart item): a soft pin that lapses `soft_pin_ttl_ms` after the write (0: it does
    not lapse), a hard pin (never evicted; the tenant needs the hard-pin right), and the host
    whose node should take the first replica when it has room (a preference, not a rule).

    `engine_hashes` maps keys of the call to the engine's own hash of the page or chunk each
    holds (an int in [-2**63, 2**64) or 1..32 bytes; proto/engine_hash.py): the master keeps
    it with the object and KV events carry it in `block_hashes` instead of the key's hash, so
    a router that hashes tokens as the engine does can match them (docs/events.md)."""

    soft_pin_ttl_ms: int = 0
    hard_pin: bool = False
    preferred_host_id: str = ""
    engine_hashes: Mapping[str, int | bytes] | None = None

    def check(self, soft_pin: bool) -> PutHints:
        """This, or InvalidArgument for values the master would refuse anyway."""
        ttl = self.soft_pin_ttl_ms
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= MAX_SOFT_PIN_TTL_MS:
            raise InvalidArgument(f"soft_pin_ttl_ms must be an int in [0, {MAX_SOFT_PIN_TTL_MS}]")
        if ttl and not soft_pin:
            raise InvalidArgument("soft_pin_ttl_ms needs soft_pin=True")
        if self.hard_pin and soft_pin:
            raise InvalidArgument("soft_pin and hard_pin are exclusive")
        host = self.preferred_host_id
        if not isinstance(host, str) or len(host) > MAX_PREFERRED_HOST_CHARS:
            raise InvalidArgument(f"preferred_host_id must be a str of at most "
                                  f"{MAX_PREFERRED_HOST_CHARS} characters")
        if self.engine_hashes is not None:
            if not isinstance(self.engine_hashes, Mapping):
                raise InvalidArgument("engine_hashes must be a mapping of key -> int or bytes")
            for key, value in self.engine_hashes.items():
                try:
                    engine_hash.encode(value)
                except ValueError as e:
                    raise InvalidArgument(f"engine_hashes[{key!r}]: {e}") from None
        return self

    def engine_hash_of(self, key: str) -> bytes:
        """The encoded engine hash of `key` (b"": none given)."""
        value = None if self.engine_hashes is None else self.engine_hashes.get(key)
        return b"" if value is None else engine_hash.encode(value)

    def fields(self) -> dict[str, Any]:
        """The PutItem fields these hints set (defaults are left out: not serialized)."""
        out: dict[str, Any] = {}
        if self.soft_pin_ttl_ms:
            out["soft_pin_ttl_ms"] = self.soft_pin_ttl_ms
        if self.hard_pin:
            out["hard_pin"] = True
        if self.preferred_host_id:
            out["preferred_host_id"] = self.preferred_host_id
        return out


@dataclass(slots=True)
class PutEntry:
    key: str
    value: memoryview                # the source; empty when `parts` is set
    checksum: int | None             # xxh3_64 of value; None until hashed (hash_values)
    status: Status | None = None     # final outcome; None while in flight
    message: str = ""
    attempts: int = 0
    put_id: int = 0
    avoid_node_ids: set[str] = field(default_factory=set)  # nodes this put failed to reach
    health_avoid: bool = True        # also avoid nodes other calls saw fail (dropped if it hurts)
    health_avoided: bool = False     # the last PutStart avoided such nodes
    parts: tuple[memoryview, ...] = ()  # scatter-gather source: the value is their concatenation
    nbytes: int = -1                 # the value's size (set from value or parts at creation)
    ahead_epoch: int = 0             # this attempt writes under a put-ahead allocation of
                                     # that master epoch (client/put_ahead.py); 0: it does not

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            self.nbytes = sum(p.nbytes for p in self.parts) if self.parts else self.value.nbytes

    def error(self) -> CellarError:
        assert self.status is not None and self.status != Status.OK
        return status_error(self.status, self.message, self.key)


class PutBatch:
    """One batch of keys through PutStart -> replica writes -> PutEnd / PutRevoke, retrying a
    key whose write failed on other nodes (PutStart with `avoid_node_ids`), at most
    `max_attempts` times per key."""

    def __init__(self, entries: list[PutEntry], *, tenant: str, replicas: int, soft_pin: bool,
                 upsert: bool, health: NodeHealth, max_attempts: int = MAX_PUT_ATTEMPTS,
                 hashes_writes: Callable[[SegmentRoute], bool] | None = None,
                 hints: PutHints | None = None, ahead: PutAheadPool | None = None,
                 reads_own_mapping: Callable[[SegmentRoute], bool] | None = None) -> None:
        self.entries = entries
        # Whether the transport for a route reads from the client's own mapping (shm): a key
        # written there is `written` once put, so a get of it may read early under the write
        # grant (client/early_reads.py); None: nothing is kept.
        self._reads_own_mapping = reads_own_mapping
        self._readable: dict[int, tuple[SegmentRoute, Grant]] = {}  # ending keys' such replica
        self._dram_segments: set[int] = set()  # segments a PutStart reply named as DRAM
        self.written: list[Written] = []  # keys put OK this round with such a replica
        # Whether the transport that will write to a route hashes as it copies: then a value
        # not hashed yet is hashed by that copy (`TransferOp.want_checksum`), not beforehand.
        self._hashes_writes = hashes_writes
        # Whether every replica of the last PutStart reply went to such a transport: the face
        # then leaves the next batch's hashing to the copy instead of hashing behind PutStart.
        self.all_fused = False
        self._tenant = tenant
        self._replicas = replicas
        self._soft_pin = soft_pin
        self._upsert = upsert
        self._hints = hints
        self._health = health
        self._max_attempts = max_attempts
        self._inflight: list[int] = []       # entry indexes of the last PutStart, in order
        self._started: list[int] = []        # ... of those that got placements
        self._bad_placement: dict[int, str] = {}
        self._op_owner: list[int] = []       # entry index per planned op
        self._ending: list[int] = []         # entry indexes of the last PutEnd, in order
        self._planned: list[TransferOp] = []
        self._start_epoch = 0                # master epoch that answered the last PutStart
        # Put ahead (client/put_ahead.py): the pool, when this batch's puts may use it, and
        # the writes planned under its allocations before this round's PutStart, if any.
        self._ahead = ahead if ahead is not None and may_put_ahead(hints) else None
        self._pre: tuple[list[TransferOp], list[int], list[int]] = ([], [], [])
        # The batch's (size, replicas) and its key count (0: mixed sizes or not asked for)
        self._shape: tuple[Shape, int] | None = None

    @property
    def done(self) -> bool:
        return all(e.status is not None for e in self.entries)

    def ahead_ask(self) -> Any | None:
        """The `PutAheadAsk` a PutStart or PutEnd of this batch carries, or None: enough
        allocations for a batch like it, when all its values are of one size (only held
        allocations covering every key are used, `plan_ahead`) and an earlier batch put it."""
        if self._ahead is None or not self.entries:
            return None
        if self._shape is None:
            entries = self.entries
            size = entries[0].nbytes
            shape = size, self._replicas
            uniform = all(e.nbytes == size for e in entries)
            self._shape = shape, len(entries) if uniform and self._ahead.repeats(shape) else 0
        if not self._shape[1]:
            return None  # mixed sizes, or no earlier batch put this size: it may never come
        return self._ahead.ask(*self._shape)

    def on_ahead(self, reply: Any, ask: Any) -> None:
        """Keep what a reply granted for the batch's `ask` (client/put_ahead.py)."""
        if self._ahead is not None and ask is not None and len(reply.ahead):
            self._ahead.add(reply.ahead, reply.segments, (int(ask.size_bytes),
                            int(ask.replicas)), int(reply.header.epoch),
                            int(reply.header.master_time_ms))

    def plan_ahead(self) -> None:
        """Plan the writes of the batch's keys under held put-ahead allocations when they
        cover every key; they are this round's writes (`ahead_round`; should another thread
        have taken some meanwhile, the keys left go through PutStart, `on_start_reply`), and
        `start_request` leaves their keys out."""
        if self._ahead is None:
            return
        wanting: dict[int, list[int]] = {}
        for i, e in enumerate(self.entries):
            if e.status is not None:
                continue
            if e.attempts or e.avoid_node_ids:
                return  # a key needs a PutStart anyway
            wanting.setdefault(e.nbytes, []).append(i)
        # Only when held allocations cover every key: a batch that needs a PutStart anyway
        # saves no round trip, and its writes under held ones would cost it the hashing that
        # PutStart hides (16 x 1 MiB over tcp half under held ones: 1.25x the time)
        if any(self._ahead.held((size, self._replicas)) < len(indexes)
               for size, indexes in wanting.items()):
            return
        unhealthy = self._health.unhealthy()
        ops, owners, started = self._pre
        for size, indexes in wanting.items():
            taken = self._ahead.take((size, self._replicas), len(indexes), unhealthy)
            for i, ahead in zip(indexes, taken, strict=False):
                e = self.entries[i]
                e.attempts += 1
                e.put_id = ahead.put_id
                e.ahead_epoch = ahead.epoch
                started.append(i)
                planned = self._plan(e, ahead.targets)
                ops.extend(planned)
                owners.extend([i] * len(planned))

    def ahead_round(self) -> list[TransferOp]:
        """This round's writes when every key in flight writes under put-ahead allocations."""
        self._begin_round()
        return self._planned

    def _begin_round(self) -> None:
        ops, owners, started = self._pre
        self._planned, self._op_owner, self._started = ops, owners, started
        self._bad_placement = {}
        self._pre = ([], [], [])

    def start_request(self, header: Any, ahead: Any | None = None) -> Any | None:
        """The next PutStart for every key still in flight and not written under a put-ahead
        allocation this round (`ahead`: the request's PutAheadAsk), or None when none is."""
        planned = set(self._pre[2])
        pending = [i for i, e in enumerate(self.entries) if e.status is None and i not in planned]
        if not pending:
            return None
        unhealthy = self._health.unhealthy()
        items = []
        PutItem = pb.PutItem
        # Flags that are set, once: a field at its default is not serialized anyway, and
        # every keyword costs the protobuf constructor time (this runs once per key).
        flags: dict[str, Any] = {name: True for name, on in (("soft_pin", self._soft_pin),
                                                             ("upsert", self._upsert)) if on}
        if self._hints is not None:
            flags.update(self._hints.fields())
        engine_hash_of = (self._hints.engine_hash_of if self._hints is not None
                          and self._hints.engine_hashes else None)
        replicas = self._replicas
        for i in pending:
            e = self.entries[i]
            e.attempts += 1
            if engine_hash_of is not None:
                flags["engine_hash"] = engine_hash_of(e.key)
            if not e.avoid_node_ids and not unhealthy:  # the common case, kept lean
                e.health_avoided = False
                items.append(PutItem(key=e.key, size_bytes=e.nbytes, replicas=replicas,
                                     **flags))
                continue
            avoid = set(e.avoid_node_ids)
            e.health_avoided = e.health_avoid and bool(unhealthy - avoid)
            if e.health_avoid:
                avoid |= unhealthy
            items.append(PutItem(key=e.key, size_bytes=e.nbytes, replicas=replicas,
                                 avoid_node_ids=sorted(avoid), **flags))
        self._inflight = pending
        if ahead is not None:
            return pb.PutStartRequest(header=header, items=items, ahead=ahead)
        return pb.PutStartRequest(header=header, items=items)

    def on_start_reply(self, reply: Any) -> list[TransferOp]:
        """Settle refused keys; plan one write per replica of every placed key."""
        check_result_count("PutStart", len(reply.results), len(self._inflight))
        self._start_epoch = int(reply.header.epoch)
        routes = routes_from_segments(reply.segments)
        if self._reads_own_mapping is not None:
            self._dram_segments.update(int(seg.segment_id) for seg in reply.segments
                                       if seg.tier != TIER_DISK)
        self._begin_round()
        ops = self._planned
        hashes = self._hashes_writes
        all_fused = hashes is not None
        entries = self.entries
        started, owners = self._started, self._op_owner
        # Once per key: each proto field is read once, the common OK case tested on the raw int.
        for i, res in zip(self._inflight, reply.results, strict=True):
            e = entries[i]
            if res.status:  # not OK
                status = to_status(res.status)
                if (status in (Status.UNAVAILABLE, Status.NO_SPACE) and e.health_avoided
                        and e.attempts < self._max_attempts):
                    e.health_avoid = False  # the nodes we shunned may be fine: ask again
                    continue
                earlier = f" (earlier attempt: {e.message})" if e.message else ""
                e.status, e.message = status, (res.message or status.name.lower()) + earlier
                continue
            e.put_id = int(res.put_id)
            e.ahead_epoch = 0
            started.append(i)
            replicas = res.replicas
            if not replicas:
                self._bad_placement[i] = "master placed no replica"
                continue
            fused = hashes is not None and all(
                (r := routes.get(rep.segment_id)) is not None and hashes(r[0]) for rep in replicas)
            all_fused = all_fused and fused
            targets = []
            for rep in replicas:
                checked = replica_grant(rep, routes, e.nbytes, GRANT_OP_WRITE)
                if isinstance(checked, str):
                    self._bad_placement[i] = checked
                    break
                targets.append((*checked, rep.claim))
            else:
                planned = self._plan(e, targets, fused)
                ops.extend(planned)
                owners.extend([i] * len(planned))
        if ops:
            self.all_fused = all_fused
        return ops

    def _plan(self, e: PutEntry, targets: Sequence[tuple[SegmentRoute, Grant, bool]],
              fused: bool | None = None) -> list[TransferOp]:
        """One write per replica of `e` (`fused`: every target's transport hashes as it
        copies; None: ask). A value not hashed yet and not hashed by the copy is hashed here."""
        if fused is None:
            hashes = self._hashes_writes
            fused = hashes is not None and all(hashes(route) for route, _grant, _claim in targets)
        return plan_writes(e, targets, self._tenant, fused)

    def can_retry(self) -> bool:
        """Whether a key of the current round could still be retried after a failed write."""
        return any(self.entries[i].attempts < self._max_attempts for i in self._started)

    def on_write_results(self, results: Sequence[TransferResult], *,
                         may_retry: bool) -> tuple[Any | None, Any | None]:
        """(PutEnd items, PutRevoke items) after the writes; failed keys stay in flight when
        they may be retried on other nodes."""
        check_result_count("write", len(results), len(self._op_owner))
        failures: dict[int, list[str]] = {}
        receipts: dict[int, list[bytes]] = {}
        readable = self._reads_own_mapping
        local: dict[int, bool] = {}  # by route id: the ops of a round share a few routes
        self._readable = {}
        for op, i, res in zip(self._planned, self._op_owner, results, strict=True):
            if res.ok:
                if readable is not None and i not in self._readable:
                    route = op.route
                    here = local.get(id(route))
                    if here is None:
                        here = local[id(route)] = readable(route)
                    if here:
                        self._readable[i] = (route, op.grant)
                if op.meta is not None and (op.want_checksum or self.entries[i].checksum is None):
                    why = take_checksum(self.entries[i], op, res)
                    if why:
                        failures.setdefault(i, []).append(f"node {op.route.node_id}: {why}")
                if res.receipt:  # the master completes the put only with one per replica
                    receipts.setdefault(i, []).append(res.receipt)
                else:
                    failures.setdefault(i, []).append(
                        f"node {op.route.node_id}: the write returned no receipt")
                continue
            node = op.route.node_id
            failures.setdefault(i, []).append(f"node {node}: {res}")
            if res.status in NODE_TROUBLE:
                self.entries[i].avoid_node_ids.add(node)
                self._health.mark_failed(node)
        end_items, revoke_items = [], []
        self._ending = []
        for i in self._started:
            e = self.entries[i]
            if i in self._bad_placement:
                revoke_items.append(self._ref(e))
                e.status, e.message = Status.INTERNAL, f"bad placement: {self._bad_placement[i]}"
            elif i in failures:
                revoke_items.append(self._ref(e))
                e.message = "write failed: " + "; ".join(failures[i])
                e.ahead_epoch = 0
                if not (may_retry and e.attempts < self._max_attempts):
                    e.status = Status.UNAVAILABLE
            elif e.ahead_epoch:  # the PutEnd names the key and the put's fields (bind)
                end_items.append(pb.PutEndItem(key=e.key, put_id=e.put_id, checksum=e.checksum,
                                               receipts=receipts[i],
                                               bind=bind_item(e, self._replicas, self._soft_pin,
                                                              self._upsert, self._hints)))
                self._ending.append(i)
            else:
                end_items.append(pb.PutEndItem(key=e.key, put_id=e.put_id, checksum=e.checksum,
                                               receipts=receipts[i]))
                self._ending.append(i)
        return end_items or None, revoke_items or None

    @staticmethod
    def _ref(e: PutEntry) -> Any:
        """The PutRef that revokes `e`'s put (a put-ahead allocation is named by "")."""
        return pb.PutRef(key="" if e.ahead_epoch else e.key, put_id=e.put_id)

    def on_end_reply(self, reply: Any, *, may_retry: bool = False) -> list[str]:
        """Settle the keys of the last PutEnd from its reply; the keys it stored (a new
        version each). With `may_retry` (time is left), a key whose put the master revoked
        after its writer timeout (a node that stalled under the write past the write grant's
        life) stays in flight, to be placed again."""
        check_result_count("PutEnd", len(reply.results), len(self._ending))
        stored: list[str] = []
        # A master that restarted between PutStart and PutEnd never heard of the put: the key
        # is written again from the start (new placement) rather than reported as NOT_FOUND.
        epoch = int(reply.header.epoch)
        for i, res in zip(self._ending, reply.results, strict=True):
            e = self.entries[i]
            status = to_status(res.status)
            if e.ahead_epoch:
                master_changed = epoch != e.ahead_epoch
                e.ahead_epoch = 0
                # A put-ahead allocation the master would not bind (older than the key's last
                # version, expired, unknown to a new master): put the key again via PutStart.
                if status in AHEAD_RETRY and not master_changed and e.attempts < self._max_attempts:
                    e.message = f"put-ahead refused: {res.message}"
                    continue
            else:
                master_changed = epoch != self._start_epoch
                if status == Status.EXPIRED and may_retry and not master_changed \
                        and e.attempts < self._max_attempts:
                    # revoked, its allocation freed: nothing of it is stored or acknowledged
                    e.message = f"revoked: {res.message}"
                    continue
            if master_changed and status != Status.OK:
                if e.attempts < self._max_attempts:
                    continue  # still unsettled: the next start_request places it again
                status = Status.UNAVAILABLE
                e.message = "the master restarted during the put; retry"
                e.status = status
                continue
            e.status, e.message = status, res.message
            if status != Status.OK:
                continue
            stored.append(e.key)
            if i in self._readable:
                route, grant = self._readable[i]
                assert e.checksum is not None  # a PutEnd carries it
                self.written.append((e.key, route, grant, e.nbytes, e.checksum,
                                     route.segment_id not in self._dram_segments))
        self._ending = []
        return stored

    def abandon(self, message: str) -> list[Any]:
        """Settle every key in flight as UNAVAILABLE; the PutRefs to revoke."""
        refs = []
        for i in self._started:
            e = self.entries[i]
            if e.status is None or i in self._ending:
                refs.append(self._ref(e))
        for e in self.entries:
            if e.status is None:
                e.status, e.message = Status.UNAVAILABLE, message
        return refs


def plan_writes(e: PutEntry, targets: Sequence[tuple[SegmentRoute, Grant, bool]], tenant: str,
                fused: bool) -> list[TransferOp]:
    """One write per replica target of `e` (`fused`: every target's transport hashes as it
    copies). A value not hashed yet and not hashed by the copy is hashed here."""
    deferred = e.checksum is None and fused
    if e.checksum is None and not fused:  # not hashed while PutStart was in flight
        e.checksum = hash_views(e.parts) if e.parts else checksum(e.value)
    meta = WriteMeta(0 if e.checksum is None else e.checksum, e.nbytes, tenant, e.key)
    return [TransferOp(route, grant, grant.offset, e.value, meta, deferred, e.parts, claim)
            for route, grant, claim in targets]


def take_checksum(e: PutEntry, op: TransferOp, res: TransferResult) -> str:
    """A value hashed as it was written (by the transport, or by `session_state.hash_for`): its
    digest becomes the entry's checksum; every replica must agree (else the caller's buffer
    changed during the put). Returns why the write cannot stand, or ""."""
    digest = res.checksum if op.want_checksum else op.meta.checksum if op.meta else None
    if digest is None:
        return "the transport returned no checksum for a write that asked for one"
    if e.checksum is None:
        e.checksum = digest
    elif e.checksum != digest:
        return "the value changed while it was being written (replicas differ)"
    return ""


def bind_item(e: PutEntry, replicas: int, soft_pin: bool, upsert: bool,
              hints: PutHints | None) -> Any:
    """The put's fields a put-ahead PutEnd carries (the PutItem its PutStart would)."""
    flags: dict[str, Any] = {name: True for name, on in (("soft_pin", soft_pin),
                                                         ("upsert", upsert)) if on}
    if hints is not None:
        if hints.soft_pin_ttl_ms:
            flags["soft_pin_ttl_ms"] = hints.soft_pin_ttl_ms
        if hints.engine_hashes:
            flags["engine_hash"] = hints.engine_hash_of(e.key)
    return pb.PutItem(size_bytes=e.nbytes, replicas=replicas, **flags)


def may_put_ahead(hints: PutHints | None) -> bool:
    """Whether puts with these hints may use put-ahead allocations: not a hard-pinned put (the
    master checks its right at PutStart) nor one that prefers a host (placed at PutStart)."""
    return hints is None or not (hints.hard_pin or hints.preferred_host_id)


def parts_entries(items: Sequence[tuple[str, tuple[memoryview, ...]]]) -> list[PutEntry]:
    """Entries for scatter-gather puts: (key, parts), the value being their concatenation."""
    return [PutEntry(key, _EMPTY, None, parts=parts) for key, parts in items]


_EMPTY = memoryview(b"")


def put_entries(pairs: Sequence[tuple[str, memoryview]]) -> list[PutEntry]:
    """Entries for (key, value) pairs, checksums left for `hash_values` (or, at the latest,
    `PutBatch.on_start_reply`) to compute."""
    return [PutEntry(key, view, None) for key, view in pairs]


def hash_values(entries: Sequence[PutEntry]) -> None:
    """Compute the checksums still missing (xxh3 releases the GIL: a helper thread can hash
    while the caller waits for PutStart, which needs only the sizes)."""
    for e in entries:
        if e.checksum is None:
            e.checksum = hash_views(e.parts) if e.parts else checksum(e.value)


def unhashed_bytes(entries: Sequence[PutEntry]) -> int:
    return sum(e.nbytes for e in entries if e.checksum is None)


