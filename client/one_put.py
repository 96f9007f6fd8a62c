"""One key put under a held put-ahead allocation, in one step: one write, then one PutEnd.

Why
    A single put of a size this client keeps putting writes under a put-ahead allocation
    (client/put_ahead.py): two round trips, the write to the node and PutEnd. Through the
    general put flow (run_puts, a PutBatch, a transfer round, the flow's stepping and
    bookkeeping) it cost 65-70 us more in the client's Python: a single 64 KiB put over tcp
    took 454-488 us (p50) where the same write and PutEnd made directly took 387-425 us
    (2026-12-05, this 2-core VM, alternated in one process). `put`, `upsert` and `put_from`
    (both faces) make them here instead, and fall back to the general flow whenever the put is
    anything but one write that landed and one PutEnd that answered OK (or AlreadyExists the
    general flow would report as well).

What it owns
    `plan`: the writes of one held allocation, or None (no held allocation of the value's size
    and replica count, hints that never put ahead, a target no single transport reaches).
    `end_request`: the PutEnd once every replica landed with its receipt, else None (the face
    then hands the allocation back with `revoke_request` and runs the general flow, which
    shuns a node that failed as the flow does). `finish`: True once the PutEnd answered OK,
    counted as the flow counts a put; raises AlreadyExists where the general flow would
    (a key taken, asked without upsert, away from a leader change); False for anything else
    (the face runs the general flow, which puts the key through PutStart: the result a plain
    put would have, as after a put-ahead PutEnd refused in a batch).

The invariants
    The put-ahead rules, decided by the code a batch uses (`puts.plan_writes`,
    `puts.take_checksum`, `puts.bind_item`): the PutEnd carries every replica's receipt and
    the put's fields, the master binds the allocation only to the key every receipt names, and
    an allocation written and not bound is revoked (the master records it as a dead write).
    A key's old trusted place is forgotten before the write (as `run_puts` does).

What it must never do
    Block, sleep or touch a socket (the face makes the write and the calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cellar.client import metrics, read_backs
from cellar.client.checks import NODE_TROUBLE, attempt_budget_s
from cellar.client.flows import REVOKE_MIN_S, Session, near_failover
from cellar.client.put_ahead import Ahead, Shape
from cellar.client.puts import (
    PutEntry,
    PutHints,
    bind_item,
    may_put_ahead,
    plan_writes,
    take_checksum,
)
from cellar.client.statuses import check_result_count, status_error, to_status
from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.base import TransferOp, TransferResult


@dataclass(slots=True)
class OnePut:
    """The put `plan` chose: the entry, the allocation it writes under, the writes, how."""

    entry: PutEntry
    ahead: Ahead
    shape: Shape
    ops: list[TransferOp]
    transport: Any              # moves every op (one call)
    upsert: bool
    bind: Any                   # the PutItem the PutEnd carries
    budget_s: float             # the writes' share of the call's time
    started: float              # perf_counter when the call began
    deadline: float             # monotonic s: the call's, which the general flow keeps
    generation: int             # the master link's generation when the call began
    done: Callable[[], None]    # the face calls it once the put ended (a pointer lease's release)
    ask: Any = None             # the PutAheadAsk the PutEnd carried, if any
    end_sent_at: float = 0.0    # monotonic s when the PutEnd left (its read backs' trust)


def _nothing() -> None:
    pass


def plan(s: Session, key: str, view: memoryview, *, replicas: int, soft_pin: bool,
         upsert: bool, hints: PutHints | None,
         done: Callable[[], None] = _nothing) -> OnePut | None:
    """The writes that put checked `view` under `key` in one step, or None (`done` is then not
    kept: the caller ends what it holds itself)."""
    aheads = s.aheads
    if aheads is None or not may_put_ahead(hints) or view.nbytes == 0:
        return None
    shape = (view.nbytes, replicas)
    started, now = time.perf_counter(), time.monotonic()
    taken = aheads.take(shape, 1, s.health.unhealthy(), now)
    if not taken:
        return None
    ahead = taken[0]
    transport = s.transports.pick(ahead.targets[0][0])
    if transport is None or any(s.transports.pick(route) is not transport
                                for route, _grant, _claim in ahead.targets[1:]):
        aheads.give_back(shape, ahead)
        return None
    if s.locations is not None:  # a key's newer version: its old place is not trusted
        s.locations.changing([key])
    entry = PutEntry(key, view, None, attempts=1, put_id=ahead.put_id, ahead_epoch=ahead.epoch)
    ops = plan_writes(entry, ahead.targets, s.tenant,
                      bool(getattr(transport, "hashes_writes", False)))
    return OnePut(entry, ahead, shape, ops, transport, upsert,
                  bind_item(entry, replicas, soft_pin, upsert, hints),
                  attempt_budget_s(s.timeout_s, True), started, now + s.timeout_s,
                  s.master.generation, done)


def deadline_of(one: OnePut | None) -> float | None:
    """The call's deadline for the general flow after a one-step put was tried, else None."""
    return None if one is None else one.deadline


def end_request(s: Session, one: OnePut, results: list[TransferResult]) -> Any | None:
    """The PutEnd once every write landed with its receipt (asking for more allocations of
    the size when few are held, as a batch's does); else None, a failed node marked as the
    flow marks it."""
    check_result_count(f"{one.transport.name} write", len(results), len(one.ops))
    e = one.entry
    receipts = []
    for op, res in zip(one.ops, results, strict=True):
        if not res.ok:
            if res.status in NODE_TROUBLE:
                one.transport.forget(op.route)
                s.health.mark_failed(op.route.node_id)
            return None
        if op.meta is not None and (op.want_checksum or e.checksum is None) and \
                take_checksum(e, op, res):
            return None
        if not res.receipt:
            return None
        receipts.append(res.receipt)
    item = pb.PutEndItem(key=e.key, put_id=e.put_id, checksum=e.checksum, receipts=receipts,
                         bind=one.bind)
    aheads = s.aheads
    assert aheads is not None  # `plan` took from them
    one.ask = aheads.ask(one.shape, 1) if aheads.repeats(one.shape) else None
    request = pb.PutEndRequest(header=s.header, items=[item],
                               read_back=read_backs.wanted(s.locations, s.read_back_keys, 1))
    if one.ask is not None:
        request.ahead.CopyFrom(one.ask)
    one.end_sent_at = time.monotonic()
    return request


def revoke_request(s: Session, one: OnePut) -> tuple[str, Any, float]:
    """(method, request, deadline) handing the allocation back, best effort (else the
    master's writer timeout revokes it), as the flow's `revoke`."""
    request = pb.PutRevokeRequest(header=s.header,
                                  items=[pb.PutRef(key="", put_id=one.entry.put_id)])
    return "PutRevoke", request, max(one.deadline, time.monotonic() + REVOKE_MIN_S)


def finish(s: Session, one: OnePut, reply: Any, write_s: float, end_s: float) -> bool:
    """True once `reply` (the PutEnd's) says the put is done, counted as the general flow
    counts one; raises the AlreadyExists the flow would raise; False: the face runs the
    general flow."""
    check_result_count("PutEnd", len(reply.results), 1)
    result = reply.results[0]
    status = to_status(result.status)
    epoch, master_ms = int(reply.header.epoch), int(reply.header.master_time_ms)
    aheads = s.aheads
    if one.ask is not None and aheads is not None and len(reply.ahead):
        aheads.add(reply.ahead, reply.segments, one.shape, epoch, master_ms)
    if s.costs is not None:
        s.costs.rpc("PutEnd", end_s)
    e = one.entry
    if status == Status.OK:
        if s.locations is not None:  # the key's old places are stale now
            s.locations.forget(e.key)
            # its next get reads under the grant the PutEnd brought back, if it asked...
            kept = read_backs.remember(s.locations, [e.key], reply, one.end_sent_at)
            if not kept and getattr(one.transport, "reads_own_mapping", False):  # ...else early
                op = one.ops[0]  # the tier of a put-ahead replica is not known here: as disk
                assert e.checksum is not None  # the PutEnd carried it
                s.locations.remember([(e.key, op.route, op.grant, e.nbytes, e.checksum, True)],
                                     master_ms)
        _count(one, e.nbytes, write_s, end_s)
        if aheads is not None:
            aheads.counted_one_step()
        return True
    if (status == Status.ALREADY_EXISTS and not one.upsert and epoch == one.ahead.epoch
            and not near_failover(s, one.generation)):
        _count(one, 0, write_s, end_s)
        raise status_error(status, result.message, e.key)
    return False


def _count(one: OnePut, nbytes: int, write_s: float, end_s: float) -> None:
    metrics.record_request("put", keys=1, hits=1, nbytes=nbytes, lookup_s=end_s,
                           load_s=write_s, wait_s=time.perf_counter() - one.started)


__all__ = ["OnePut", "deadline_of", "end_request", "finish", "plan", "revoke_request"]
