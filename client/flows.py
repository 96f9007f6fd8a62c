"""Every multi-step SDK operation once, as a generator of I/O requests a face performs.

Why generators
    `Client` blocks and `AsyncClient` awaits, but what they say to the master and the nodes, in
    which order, with which retries, is the same. Each flow here is a generator that yields
    what it needs done (`Rpc`: call a master RPC by its deadline; `Move`: run a transfer
    round; `RpcAndMove`: both at once, a get's early reads beside its lookup; `Sleep`: back
    off) and receives the result, or the exception, back. A face is a
    ten-line loop around `send`/`throw` (`Client._run`, `AsyncClient._run`), so the
    protocol (failover rounds, put retries, pin release, deadline-bounded gets, probe
    handling) is written, tested and fixed in one place; the faces own only the waiting.

The invariants
    - A flow never blocks and never reads a clock to wait: it yields `Sleep`.
    - A put key is placed again only while time is left and a leader change is recent
      (`MAX_FAILOVER_ROUNDS`); a get batch is asked again at most `MAX_GET_FAILOVER_ROUNDS`
      (a leader change, or a key's grants expired before any replica of it was read).
    - Every pin a flow is granted goes to `Session.release`, also when the flow fails.
    - A budgeted get never starts a transfer round after its budget; what is unread then is LATE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, TypeVar

from cellar.client import read_backs
from cellar.client.checks import MAX_UNPINS_PER_CALL, MIN_RETRY_BUDGET_S, Limits, batch_ranges
from cellar.client.early_reads import Locations
from cellar.client.gets import GetBatch, GetEntry, release_views
from cellar.client.load_costs import LoadCosts
from cellar.client.pointers import PointerRegistry
from cellar.client.put_ahead import PutAheadPool
from cellar.client.puts import PutBatch, PutEntry, PutHints, hash_values
from cellar.client.session_state import (
    DiskReadRates,
    NodeHealth,
    TransferRound,
    TransportSet,
    UnpinQueue,
    plan_round,
    status_to_dict,
)
from cellar.client.statuses import check_result_count, status_error, to_status
from cellar.errors import CellarError, Status, Timeout, Unavailable
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.base import SegmentRoute, TransferOp, TransferResult

T = TypeVar("T")

# Riding through a master failover (the channel follows the leader; these re-place what it voided).
FAILOVER_SETTLE_S = 10.0          # after following a leader change, this long counts as "lately"
MAX_FAILOVER_ROUNDS = 32          # put rounds for keys a leader change left UNAVAILABLE
FAILOVER_BACKOFF_FIRST_S = 0.05
FAILOVER_BACKOFF_MAX_S = 0.5
FAILOVER_PUT_STATUSES = frozenset({Status.UNAVAILABLE, Status.NO_SPACE})
MAX_GET_FAILOVER_ROUNDS = 2       # gets whose batch straddled a leader change (or whose
                                  # grants expired before a replica was read), asked again
REVOKE_MIN_S = 1.0                # a revoke gets at least this long, even past the deadline


@dataclass(slots=True)
class Rpc:
    """Call master RPC `method` with `request` by `deadline` (monotonic s); the reply comes back.
    `hash_behind`: put values the face may hash while the call is in flight."""

    method: str
    request: Any
    deadline: float
    hash_behind: Sequence[PutEntry] = ()


@dataclass(slots=True)
class Move:
    """Run one transfer round; the face sends back `round.outcome()` (one result per op)."""

    round: TransferRound


@dataclass(slots=True)
class RpcAndMove:
    """Call `rpc` and run `move` at the same time (a get's early reads beside its GetReplicas,
    client/early_reads.py); the face sends back (reply, the round's outcome) once both ended,
    or raises the call's error, also only once the move ended (no byte lands later)."""

    rpc: Rpc
    move: Move


@dataclass(slots=True)
class Sleep:
    seconds: float


@dataclass(slots=True)
class Record:
    """What one public call did, for the client metrics (`cellar.client.metrics`): keys asked,
    keys that hit, payload bytes moved, keys found but not used (late: not read within the
    budget; refused: no replica could be read; cut: after an unreadable key in a prefix get),
    and the tokens each key stands for when known. The face adds the times it measured
    (lookup = its Rpc waits, load = its Move waits, wait = all)."""

    keys: int
    hits: int
    nbytes: int = 0
    late: int = 0
    refused: int = 0
    cut: int = 0
    tokens_per_key: int | None = None


Effect = Rpc | Move | RpcAndMove | Sleep | Record
Flow: TypeAlias = Generator[Effect, Any, T]


class MasterView(Protocol):
    """What a flow reads of a face's master channel (no I/O)."""

    @property
    def generation(self) -> int: ...

    @property
    def switched_at(self) -> float: ...


@dataclass(slots=True)
class Session:
    """The per-client state flows share; every piece is safe to use from many threads."""

    tenant: str
    header: Any                        # pb.RequestHeader
    timeout_s: float
    master: MasterView
    transports: TransportSet
    release: Callable[[list[int]], None]   # queue pin ids for release (never blocks for long)
    pointers: PointerRegistry = field(default_factory=PointerRegistry)
    unpins: UnpinQueue = field(default_factory=UnpinQueue)
    health: NodeHealth = field(default_factory=NodeHealth)
    disk_rates: DiskReadRates = field(default_factory=DiskReadRates)  # LATE estimates
    limits: Limits = field(default_factory=Limits)
    costs: LoadCosts = field(default_factory=LoadCosts)  # measured load costs (lookup's estimate)
    locations: Locations | None = field(default_factory=Locations)  # None: no early reads
    aheads: PutAheadPool | None = None  # held put-ahead allocations (None: puts do not ask)
    # PutEnds of at most this many keys read them back (client/read_backs.py; 0: none do)
    read_back_keys: int = field(default_factory=read_backs.keys_from_env)
    tokens_per_key: int | None = None  # tokens one key stands for (the token metrics), if known
    # Whether the last put batch's replicas all went to transports that hash as they copy (a
    # hint, read and written without a lock: a stale value costs one batch some overlap).
    writes_fused: bool = False

    def deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def unpin_batch(self) -> int:
        return min(MAX_UNPINS_PER_CALL, self.limits.max_batch_keys)


# ---- transfers ----------------------------------------------------------------------------

def transfer(s: Session, kind: str, ops: list[TransferOp], deadline: float,
             can_fall_back: bool) -> Flow[list[TransferResult]]:
    if not ops:
        return []
    if deadline - time.monotonic() <= 0:
        raise Timeout(f"{kind} of {len(ops)} ranges: the {s.timeout_s:g}s deadline passed")
    outcome: list[TransferResult] = yield Move(plan_round(s.transports, kind, ops, deadline,
                                                          can_fall_back))
    return outcome


# ---- put ----------------------------------------------------------------------------------

def run_puts(s: Session, entries: list[PutEntry], *, replicas: int, soft_pin: bool,
             upsert: bool, deadline: float, hints: PutHints | None = None) -> Flow[list[PutEntry]]:
    if s.locations is not None:  # a key's newer version: its old place is not trusted
        s.locations.changing([e.key for e in entries])
    for span in batch_ranges(len(entries), s.limits.max_batch_keys):
        chunk = entries[span.start:span.stop]
        generation = s.master.generation
        yield from put_batch(s, chunk, replicas=replicas, soft_pin=soft_pin, upsert=upsert,
                             deadline=deadline, hints=hints)
        # Keys a leader change left UNAVAILABLE (a node refused the old epoch's grant, or the
        # new leader's nodes are still mounting) are placed again while time is left.
        backoff_s = FAILOVER_BACKOFF_FIRST_S
        for _round in range(MAX_FAILOVER_ROUNDS):
            again = [i for i, e in enumerate(chunk) if e.status in FAILOVER_PUT_STATUSES]
            if not again or not near_failover(s, generation):
                break
            if deadline - time.monotonic() <= backoff_s + MIN_RETRY_BUDGET_S:
                break
            yield Sleep(backoff_s)
            backoff_s = min(backoff_s * 2, FAILOVER_BACKOFF_MAX_S)
            fresh = [PutEntry(chunk[i].key, chunk[i].value, chunk[i].checksum, parts=chunk[i].parts)
                     for i in again]
            yield from put_batch(s, fresh, replicas=replicas, soft_pin=soft_pin, upsert=upsert,
                                 deadline=deadline, hints=hints)
            for i, entry in zip(again, fresh, strict=True):
                chunk[i].status, chunk[i].message = entry.status, entry.message
        # Our own earlier attempt may hold the key: after a leader change, or when a key was
        # placed more than once (its first PutEnd unanswered: a single master restarted on the
        # same address, which is no leader change to the link). A key taken at its first
        # attempt is someone else's: no extra round trip on that path.
        if not upsert and (near_failover(s, generation) or any(
                e.status == Status.ALREADY_EXISTS and e.attempts > 1 for e in chunk)):
            yield from settle_own_writes(s, chunk, deadline)
    return entries


def near_failover(s: Session, generation: int) -> bool:
    """Whether the client followed a leader change since `generation`, or lately."""
    return (s.master.generation != generation
            or time.monotonic() - s.master.switched_at < FAILOVER_SETTLE_S)


def put_batch(s: Session, entries: list[PutEntry], *, replicas: int, soft_pin: bool,
              upsert: bool, deadline: float, hints: PutHints | None = None) -> Flow[None]:
    fusing = any(getattr(t, "hashes_writes", False) for t in s.transports.transports)
    # Keys put through a transport that reads from the client's own mapping are remembered
    # for early reads (under the write grant: no node checks it there)
    mapped = s.locations is not None and any(getattr(t, "reads_own_mapping", False)
                                             for t in s.transports.transports)
    batch = PutBatch(entries, tenant=s.tenant, replicas=replicas, soft_pin=soft_pin,
                     upsert=upsert, health=s.health,
                     hashes_writes=_hashes_writes(s) if fusing else None, hints=hints,
                     ahead=s.aheads,
                     reads_own_mapping=_reads_own_mapping(s) if mapped else None)
    # A value whose replicas all go to a transport that hashes as it copies (shm) is hashed by
    # that copy, from cache, right after each piece lands: 16 x 4 MiB puts to a same-host node
    # ran 5.4 -> 7.8 GB/s against hashing them on a helper thread behind PutStart, which reads
    # every value from memory once more. Placement is known only from PutStart's reply, so the
    # last batch's says whether to hash behind it (a remote client keeps that overlap).
    # Scatter-gather values are never hashed behind: their many small parts hold the GIL per
    # part (xxhash releases it only for long inputs), which stalled the copy threads.
    if not fusing:
        behind = batch.entries
    elif s.writes_fused:
        behind = []
    else:
        behind = [e for e in batch.entries if not e.parts]
    try:
        # Keys that held put-ahead allocations take (client/put_ahead.py) skip PutStart: their
        # writes join the first round's (alone, when no key needs a PutStart).
        batch.plan_ahead()
        while not batch.done:
            ask = batch.ahead_ask()
            request = batch.start_request(s.header, ask)
            if request is not None:
                reply = yield Rpc("PutStart", request, deadline, hash_behind=behind)
                ops = batch.on_start_reply(reply)
                batch.on_ahead(reply, ask)
                ask = None
                if ops:
                    s.writes_fused = batch.all_fused
            else:
                ops = batch.ahead_round()
            results = yield from transfer(s, "write", ops, deadline, batch.can_retry())
            may_retry = deadline - time.monotonic() > MIN_RETRY_BUDGET_S
            end_items, revoke_items = batch.on_write_results(results, may_retry=may_retry)
            if revoke_items:
                yield from revoke(s, revoke_items, deadline)
            if end_items:
                ask = batch.ahead_ask() if ask is not None else None  # none granted at PutStart
                wants = read_backs.wanted(s.locations, s.read_back_keys, len(end_items))
                end = pb.PutEndRequest(header=s.header, items=end_items, read_back=wants)
                if ask is not None:
                    end.ahead.CopyFrom(ask)
                sent_at = time.monotonic()
                reply = yield Rpc("PutEnd", end, deadline)
                stored = batch.on_end_reply(
                    reply, may_retry=deadline - time.monotonic() > MIN_RETRY_BUDGET_S)
                if s.locations is not None:  # the keys' old places are stale now
                    s.locations.forget(*stored)
                if batch.written:  # a get of these may read them early (client/early_reads.py)
                    assert s.locations is not None
                    s.locations.remember(batch.written, int(reply.header.master_time_ms))
                    batch.written = []
                if end.read_back:  # ...or read them under the grants brought back, trusted
                    assert s.locations is not None
                    read_backs.remember(s.locations, [item.key for item in end_items], reply,
                                        sent_at)
                batch.on_ahead(reply, ask)
    except GeneratorExit:
        raise
    except BaseException as exc:
        refs = batch.abandon(str(exc) or type(exc).__name__)
        if refs:
            yield from revoke(s, refs, deadline)
        raise


def _hashes_writes(s: Session) -> Callable[[SegmentRoute], bool]:
    def hashes(route: SegmentRoute) -> bool:
        return bool(getattr(s.transports.pick(route), "hashes_writes", False))

    return hashes


def _reads_own_mapping(s: Session) -> Callable[[SegmentRoute], bool]:
    def local(route: SegmentRoute) -> bool:
        return bool(getattr(s.transports.pick(route), "reads_own_mapping", False))

    return local


def revoke(s: Session, refs: list[Any], deadline: float) -> Flow[None]:
    """Best effort: if the master cannot be told, its writer timeout revokes the put."""
    try:
        yield Rpc("PutRevoke", pb.PutRevokeRequest(header=s.header, items=refs),
                  max(deadline, time.monotonic() + REVOKE_MIN_S))
    except CellarError:
        pass


def settle_own_writes(s: Session, chunk: list[PutEntry], deadline: float) -> Flow[None]:
    """A put whose bytes reached the nodes just before the leader died is adopted by the new
    leader from the nodes' indexes; placing it again then finds the key taken. If the stored
    object has exactly our size and checksum, it is our write: report OK, not AlreadyExists."""
    taken = [e for e in chunk if e.status == Status.ALREADY_EXISTS]
    if not taken:
        return
    hash_values(taken)  # refused at their first PutStart, they may be unhashed
    request = pb.GetReplicasRequest(header=s.header, keys=[e.key for e in taken])
    try:
        reply = yield Rpc("GetReplicas", request, deadline)
    except CellarError:
        return  # they stay ALREADY_EXISTS: true, if not the whole story
    check_result_count("GetReplicas", len(reply.results), len(taken))
    s.release([int(r.pin_id) for r in reply.results if r.pin_id])
    for entry, result in zip(taken, reply.results, strict=True):
        if (to_status(result.status) == Status.OK
                and int(result.size_bytes) == entry.nbytes
                and int(result.checksum) == entry.checksum):
            entry.status, entry.message = Status.OK, ""


# ---- get ----------------------------------------------------------------------------------

def run_gets(s: Session, keys: list[str], dests: list[Any] | None, deadline: float, *,
             budget_at: float | None = None, prefix: bool = False,
             allocate: Any = None) -> Flow[list[GetEntry]]:
    """Entries for `keys` in order. `budget_at` (monotonic s): a deadline-bounded get, whose
    unread keys turn LATE at that time instead of raising; `prefix`: stop at the first key that
    cannot be read (later batches are not asked for); `allocate` (nbytes -> (result, view)):
    where keys without a destination land (default: fresh `bytes`)."""
    entries: list[GetEntry] = []
    for span in batch_ranges(len(keys), s.limits.max_batch_keys):
        chunk = yield from get_batch(s, keys[span.start:span.stop],
                                     None if dests is None else dests[span.start:span.stop],
                                     entries, deadline, budget_at, prefix, allocate)
        entries.extend(chunk)
        if prefix and any(e.status != Status.OK for e in chunk):
            break
    return entries


def get_batch(s: Session, keys: list[str], dests: list[Any] | None,
              done: list[GetEntry], deadline: float, budget_at: float | None,
              prefix: bool, allocate: Any = None) -> Flow[list[GetEntry]]:
    """One batch's entries; keys whose grants a leader change voided (the nodes mounted at
    the new leader and refuse the old epoch) are asked for again at the new leader."""
    out: list[GetEntry] = []
    index = list(range(len(keys)))
    until = deadline if budget_at is None else min(deadline, budget_at)
    for _round in range(MAX_GET_FAILOVER_ROUNDS + 1):
        generation = s.master.generation
        batch = GetBatch([keys[i] for i in index],
                         None if dests is None else [dests[i] for i in index],
                         health=s.health, budgeted=budget_at is not None, prefix=prefix,
                         locations=s.locations,
                         **({} if allocate is None else {"allocate": allocate}))
        try:
            try:
                if trusted := batch.start_trusted():  # read without asking (client/gets.py)
                    try:
                        results = yield from transfer(s, "read", trusted, until, True)
                    except BaseException:
                        batch.drop_early()
                        raise
                    batch.on_trusted(results)
                if batch.unsettled():
                    yield from get_replicas(s, batch, until)
            except (Timeout, Unavailable):
                if budget_at is None or budget_at > deadline:
                    raise  # the call's own timeout, not the budget, ran out
                # The budget ran out while the master answered, or no master could answer
                # within it (down, restarting, electing): every key not read yet is LATE, as
                # the call promises, not an exception. The pins of a lookup abandoned in
                # flight are released by the master's pin TTL.
                batch.settle_late()
            if prefix:
                batch.keep_prefix()
            while ops := batch.next_ops(
                    None if budget_at is None else budget_at - time.monotonic(), s.disk_rates):
                started = time.monotonic()
                if budget_at is not None and started >= budget_at:
                    batch.settle_late()
                    break
                try:
                    results = yield from transfer(s, "read", ops, until, batch.can_fall_back())
                except Timeout:
                    if budget_at is None:
                        raise
                    batch.settle_late()  # the budget ended between the check and the round
                    break
                batch.on_read_results(results)
                elapsed = time.monotonic() - started
                for node_id, nbytes in batch.round_disk_bytes.items():
                    s.disk_rates.observe(node_id, nbytes, elapsed)
        except GeneratorExit:
            s.release(batch.pin_ids)
            raise
        except BaseException:
            s.release(batch.pin_ids)
            release_views(done + out + batch.entries)
            raise
        s.release(batch.pin_ids)
        if not out:
            out = batch.entries
        else:
            for i, entry in zip(index, batch.entries, strict=True):
                release_views([out[i]])
                out[i] = entry
        # Asked again: every key a leader change voided, and (in a call with no budget of its
        # own and no prefix to keep whole) every key no replica was read for because its
        # grants expired first (a node that stalled past the pin TTL mid-read: another replica
        # was then refused the same grant, while the call still had time to ask for new ones)
        changed = s.master.generation != generation
        expiry_counts = budget_at is None and not prefix
        index = [i for i in index if out[i].status == Status.UNAVAILABLE
                 and not out[i].corrupt and not out[i].late
                 and (changed or (expiry_counts and out[i].grant_expired))]
        if not index or until - time.monotonic() <= MIN_RETRY_BUDGET_S:
            break
    return out


def get_replicas(s: Session, batch: GetBatch, deadline: float) -> Flow[None]:
    """GetReplicas for `batch`, with its early reads (client/early_reads.py) beside it."""
    unpins = s.unpins.drain(s.unpin_batch())
    rpc = Rpc("GetReplicas", batch.request(s.header, unpins), deadline)
    early = batch.start_early()
    try:
        if early:
            reply, results = yield RpcAndMove(rpc, Move(plan_round(
                s.transports, "read", early, deadline, can_fall_back=True)))
        else:
            reply = yield rpc
    except BaseException:
        s.unpins.requeue(unpins)
        batch.drop_early()
        raise
    try:
        batch.on_reply(reply)
    except BaseException:
        batch.drop_early()
        raise
    if early:
        batch.on_early(results)


def size(s: Session, key: str) -> Flow[int]:
    unpins = s.unpins.drain(s.unpin_batch())
    request = pb.GetReplicasRequest(header=s.header, keys=[key], unpin_ids=unpins)
    try:
        reply = yield Rpc("GetReplicas", request, s.deadline())
    except BaseException:
        s.unpins.requeue(unpins)
        raise
    check_result_count("GetReplicas", len(reply.results), 1)
    result = reply.results[0]
    s.release([int(result.pin_id)] if result.pin_id else [])
    status = to_status(result.status)
    if status != Status.OK:
        raise status_error(status, result.message, key)
    return int(result.size_bytes)


# ---- probes and removal -------------------------------------------------------------------

def exists_many(s: Session, names: list[str]) -> Flow[list[bool]]:
    deadline = s.deadline()
    out: list[bool] = []
    for span in batch_ranges(len(names), s.limits.max_batch_keys):
        chunk = names[span.start:span.stop]
        reply = yield Rpc("Exists", pb.KeysRequest(header=s.header, keys=chunk), deadline)
        check_result_count("Exists", len(reply.statuses), len(chunk))
        for key, st in zip(chunk, reply.statuses, strict=True):
            status = to_status(st)
            if status not in (Status.OK, Status.NOT_FOUND, Status.NOT_READY):
                raise status_error(status, "", key)
            out.append(status == Status.OK)
    return out


def prefix_len(s: Session, names: list[str]) -> Flow[int]:
    deadline = s.deadline()
    total = 0
    for span in batch_ranges(len(names), s.limits.max_batch_keys):
        chunk = names[span.start:span.stop]
        reply = yield Rpc("PrefixLen", pb.KeysRequest(header=s.header, keys=chunk), deadline)
        n = int(reply.prefix_len)
        if not 0 <= n <= len(chunk):
            raise CellarError(f"PrefixLen: master answered {n} for {len(chunk)} keys")
        total += n
        if n < len(chunk):
            break
    return total


def cluster_status(s: Session) -> Flow[dict[str, Any]]:
    reply = yield Rpc("ClusterStatus", pb.ClusterStatusRequest(header=s.header), s.deadline())
    s.limits = Limits.from_status(reply)
    return status_to_dict(reply)


def hand_back_aheads(s: Session, timeout_s: float) -> Flow[None]:
    """At close: revoke the put-ahead allocations held (client/put_ahead.py), one request at
    most; what it cannot carry, or a failure, the master revokes when their grants expire."""
    refs = s.aheads.revoke_refs(s.limits.max_batch_keys) if s.aheads is not None else []
    if refs:
        yield Rpc("PutRevoke", pb.PutRevokeRequest(header=s.header, items=refs),
                  time.monotonic() + min(s.timeout_s, timeout_s))


def unpin(s: Session, ids: list[int], timeout_s: float) -> Flow[None]:
    yield Rpc("Unpin", pb.UnpinRequest(header=s.header, pin_ids=ids),
              time.monotonic() + min(s.timeout_s, timeout_s))
