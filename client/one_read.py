"""One key get in one step: one trusted read, or one lookup and one read, without the flow.

Why
    A get of one key this client read within the master's read trust is one read from the
    node (gets.py `start_trusted`, master/state/read_trust.py). Through the general get flow
    (a GetBatch, a transfer round, the flow's stepping and bookkeeping) that read cost as
    much again in the client's Python: a single 64 KiB get over tcp took 198 us (p50) where
    the transport's read of the same range took 123-132 us (2026-12-05, this 2-core VM).
    A get of a key this client knows nothing about is GetReplicas and one read; the flow's
    stepping around them cost 35-40 us more than making them in a row (12%: 244-300 against
    278-341 us p50 in alternated rounds, 2026-12-06, this VM). `get`, `get_into` and
    `get_into_ptr` (both faces) make them here instead, and fall back to the general flow
    whenever the call is anything but that.

What it owns
    `plan`: the read, or a lookup to make first (`OneRead.batch`), or None when the general
    flow must answer the call (the key's place is known but not trusted: the flow reads it
    early, beside its GetReplicas; a trusted place with a buffer smaller than the value; no
    transport reaching the node). `lookup_request`, `on_lookup`, `lookup_failed`: the
    GetReplicas of a lookup and what its reply plans (the read of the first replica, as the
    flow's first round; a miss raised and counted as the flow raises and counts it).
    `finish`: the size when the bytes hash to the checksum they were read for, the call
    counted and timed as the flow counts a get; otherwise the buffer is cleared (a trusted
    place forgotten, a lookup's pins released) and the face runs the general flow, which
    asks the master.

The invariants
    The same as the general flow's, decided by the same code: a trusted read only of a DRAM
    replica within its trust (`gets.is_trusted`); a lookup's reply read, checked, pinned
    and released by a `GetBatch` as the flow's; only bytes that hash to the value's checksum,
    never a byte past the value's size in the caller's buffer, and a failed read leaves no
    byte of it there.

What it must never do
    Block, sleep or touch a socket (the face makes the lookup and the read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cellar.client import metrics
from cellar.client.buffers import fresh_bytes
from cellar.client.checks import NODE_TROUBLE, attempt_budget_s
from cellar.client.early_reads import Location
from cellar.client.flows import Session
from cellar.client.gets import GetBatch, finished_bytes, is_trusted, landed_digest, release_views
from cellar.errors import Status
from cellar.transfer.base import TransferOp, TransferResult


@dataclass(slots=True)
class OneRead:
    """The one read `plan` chose: where (`location`), by which transport, into what; for a
    lookup (`batch`), all but the key once `on_lookup` planned the read."""

    key: str
    location: Location | None  # the trusted place read (None: a lookup's read)
    view: memoryview | None    # the caller's buffer cut to the value's size
    transport: Any
    op: TransferOp | None
    budget_s: float
    started: float            # perf_counter when the call began (the get's wait)
    deadline: float           # monotonic s: the call's, which the general flow keeps if it runs
    done: Callable[[], None]  # the face calls it once the read ended (a pointer lease's release)
    result: Any = None        # `get`: the new object `view` fills (buffers.fresh_bytes)
    batch: GetBatch | None = None  # a lookup: GetReplicas first, its reply plans the read
    unpins: list[int] = field(default_factory=list)  # pin ids the lookup's request releases
    looked_up: float = 0.0    # perf_counter when the lookup's reply arrived

    def ops(self) -> list[TransferOp]:
        """The read, for the face's `transport.read` (planned: `plan` or `on_lookup`)."""
        assert self.op is not None
        return [self.op]


def _nothing() -> None:
    pass


def plan(s: Session, key: str, buffer: memoryview | None,
         done: Callable[[], None] = _nothing) -> OneRead | None:
    """How a get of `key` (checked) into `buffer` (None: into new bytes, `value`) is made in
    one step: a trusted read, a lookup then a read (`batch` set: `lookup_request` first), or
    None (`done` is then not kept: the caller ends what it holds itself)."""
    started, now = time.perf_counter(), time.monotonic()
    locations = s.locations
    location = None if locations is None else locations.find(key, now)
    if location is None:
        batch = GetBatch([key], None if buffer is None else [buffer], health=s.health,
                         locations=locations)
        return OneRead(key, None, None, None, None, 0.0, started, now + s.timeout_s, done,
                       batch=batch)
    if not is_trusted(location, now, s.health):
        return None  # known but not trusted: the flow reads it early, beside GetReplicas
    if buffer is not None and buffer.nbytes < location.size:
        return None  # the general flow says BufferTooSmall once the master named the size
    transport = s.transports.pick(location.route)
    if transport is None:
        return None
    result = None
    if buffer is None:
        result, view = fresh_bytes(location.size)
    else:
        view = buffer[:location.size]
    grant = location.grant
    op = TransferOp(location.route, grant, grant.offset, view, None, True)
    return OneRead(key, location, view, transport, op, attempt_budget_s(s.timeout_s, True),
                   started, now + s.timeout_s, done, result)


def lookup_request(s: Session, one: OneRead) -> Any:
    """A lookup's GetReplicas request (with queued pin releases, as the flow's)."""
    assert one.batch is not None
    one.unpins = s.unpins.drain(s.unpin_batch())
    return one.batch.request(s.header, one.unpins)


def lookup_failed(s: Session, one: OneRead, error: BaseException) -> None:
    """The lookup raised `error` (the face re-raises it): counted as the flow counts it."""
    s.unpins.requeue(one.unpins)
    metrics.record_error("get", error)


def on_lookup(s: Session, one: OneRead, reply: Any) -> bool:
    """After a lookup's reply: True once the read of its first replica is planned (`ops`);
    False when the general flow must answer the call (its pins released); a miss (NotFound)
    or a buffer the value does not fit is raised and counted as the flow raises and counts
    it."""
    batch = one.batch
    assert batch is not None
    one.looked_up = time.perf_counter()
    lookup_s = one.looked_up - one.started
    s.costs.rpc("GetReplicas", lookup_s)
    entry = batch.entries[0]
    try:
        batch.on_reply(reply)
    except BaseException as exc:  # BufferTooSmall, a reply that does not fit the request
        s.release(batch.pin_ids)
        release_views(batch.entries)
        metrics.record_error("get", exc)
        raise
    ops = batch.next_ops() if entry.status is None else []
    transport = s.transports.pick(ops[0].route) if ops else None
    budget_s = attempt_budget_s(one.deadline - time.monotonic(), batch.can_fall_back())
    if transport is None or budget_s <= 0:
        s.release(batch.pin_ids)
        if entry.status == Status.NOT_FOUND:  # a miss, raised and counted as the flow does
            metrics.record_request("get", keys=1, hits=0, nbytes=0, lookup_s=lookup_s,
                                   load_s=None, wait_s=time.perf_counter() - one.started,
                                   tokens_per_key=s.tokens_per_key)
            raise entry.error()
        # anything else (a value of 0 bytes, a key being written, no transport, no time) is
        # the flow's to answer: it asks again, and retries or raises as it would have
        release_views(batch.entries)
        return False
    one.op, one.transport, one.budget_s = ops[0], transport, budget_s
    one.view, one.result = entry.view, entry.result
    return True


def abandon(s: Session, one: OneRead) -> None:
    """The read raised (cancelled, interrupted): a lookup's pins are released, as the flow
    releases a batch's."""
    if one.batch is not None:
        s.release(one.batch.pin_ids)
        release_views(one.batch.entries)


def deadline_of(one: OneRead | None) -> float | None:
    """The call's deadline for the general flow after a one-step read was tried, else None
    (the flow counts from its own start)."""
    return None if one is None else one.deadline


def value(one: OneRead) -> bytes:
    """The bytes a `plan(..., None)` read landed, once `finish` kept them."""
    assert one.view is not None
    return finished_bytes(one.view, one.result)


def finish(s: Session, one: OneRead, result: TransferResult, read_started: float) -> int:
    """The value's size once `result` landed the bytes the read was planned for, counted as
    the general flow counts a get; else -1, with the buffer cleared and a trusted place
    forgotten (the face then runs the general flow)."""
    if one.batch is not None:
        return _finish_lookup(s, one, result, read_started)
    location, locations, view = one.location, s.locations, one.view
    assert location is not None and locations is not None and view is not None  # `plan`'s
    if result.ok and landed_digest(result, view, ()) == location.checksum:
        size = location.size
        locations.counted_trusted(1, 0)
        _count(s, one, size, 0.0, read_started)
        return size
    if result.status in NODE_TROUBLE:
        one.transport.forget(location.route)
    if one.result is None:  # the caller's memory: no byte of a read not kept stays there
        view[:] = bytes(location.size)
    locations.forget(one.key)
    locations.counted_trusted(0, 1)
    return -1


def _finish_lookup(s: Session, one: OneRead, result: TransferResult, read_started: float) -> int:
    batch, op = one.batch, one.op
    assert batch is not None and op is not None
    if result.status in NODE_TROUBLE:
        one.transport.forget(op.route)
    batch.on_read_results([result])  # checksum, node health, the place remembered
    s.release(batch.pin_ids)
    entry = batch.entries[0]
    read_s = time.perf_counter() - read_started
    for node_id, nbytes in batch.round_disk_bytes.items():
        s.disk_rates.observe(node_id, nbytes, read_s)
    if entry.status == Status.OK:
        _count(s, one, entry.size, one.looked_up - one.started, read_started)
        if s.locations is not None:
            s.locations.counted_lookup()
        return entry.size
    if one.result is None and one.view is not None:  # the caller's memory, as above
        one.view[:] = bytes(one.view.nbytes)
    release_views(batch.entries)
    return -1


def _count(s: Session, one: OneRead, size: int, lookup_s: float, read_started: float) -> None:
    """A get answered in one step, counted and timed as the flow counts one."""
    now = time.perf_counter()
    metrics.record_request("get", keys=1, hits=1, nbytes=size, lookup_s=lookup_s,
                           load_s=now - read_started, wait_s=now - one.started,
                           tokens_per_key=s.tokens_per_key)
    s.costs.read(str(getattr(one.transport, "name", "")), size, now - read_started)
    s.costs.load(size, now - one.started)


__all__ = ["OneRead", "abandon", "deadline_of", "finish", "lookup_failed", "lookup_request", "on_lookup",
           "plan", "value"]
