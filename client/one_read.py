"""One key read without asking, in one step: the single-key get's path when it is one read.

Why
    A get of one key this client read within the master's read trust is one read from the
    node (gets.py `start_trusted`, master/state/read_trust.py). Through the general get flow
    (a GetBatch, a transfer round, the flow's stepping and bookkeeping) that read cost as
    much again in the client's Python: a single 64 KiB get over tcp took 198 us (p50) where
    the transport's read of the same range took 123-132 us (2026-12-05, this 2-core VM).
    `get_into` and `get_into_ptr` (both faces) make that read here instead, and fall back to
    the general flow whenever it is anything but one trusted read that lands.

What it owns
    `plan`: the read, or None when the call cannot be one trusted read (no trusted place for
    the key, a disk replica, a node a read failed on lately, a buffer smaller than the value,
    no transport reaching the node). `finish`: the size when the bytes hash to the checksum
    the place was read for, the call counted and timed as the flow counts a get; otherwise
    the buffer is cleared and the place forgotten (as `GetBatch.on_trusted` does), and the
    face runs the general flow, which asks the master.

The invariants
    The same as a trusted read in the general flow, decided by the same code
    (`gets.trusted_place`): only a DRAM replica within its trust, only bytes that hash to the
    value's checksum, never a byte past the value's size in the caller's buffer, and a failed
    read leaves no byte of it there.

What it must never do
    Block, sleep or touch a socket (the face makes the read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cellar.client import metrics
from cellar.client.buffers import fresh_bytes
from cellar.client.checks import NODE_TROUBLE, attempt_budget_s
from cellar.client.early_reads import Location
from cellar.client.flows import Session
from cellar.client.gets import finished_bytes, landed_digest, trusted_place
from cellar.transfer.base import TransferOp, TransferResult


@dataclass(slots=True)
class OneRead:
    """The one read `plan` chose: where (`location`), by which transport, into what."""

    key: str
    location: Location
    view: memoryview          # the caller's buffer cut to the value's size
    transport: Any
    op: TransferOp
    budget_s: float
    started: float            # perf_counter when the call began (the get's wait)
    deadline: float           # monotonic s: the call's, which the general flow keeps if it runs
    done: Callable[[], None]  # the face calls it once the read ended (a pointer lease's release)
    result: Any = None        # `get`: the new object `view` fills (buffers.fresh_bytes)


def _nothing() -> None:
    pass


def plan(s: Session, key: str, buffer: memoryview | None,
         done: Callable[[], None] = _nothing) -> OneRead | None:
    """The read that answers a get of `key` (checked) into `buffer` (None: into new bytes,
    `value`) without asking, or None (`done` is then not kept: the caller ends what it holds
    itself)."""
    locations = s.locations
    if locations is None:
        return None
    started, now = time.perf_counter(), time.monotonic()
    location = trusted_place(locations, key, now, s.health)
    if location is None or (buffer is not None and buffer.nbytes < location.size):
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


def deadline_of(one: OneRead | None) -> float | None:
    """The call's deadline for the general flow after a one-step read was tried, else None
    (the flow counts from its own start)."""
    return None if one is None else one.deadline


def value(one: OneRead) -> bytes:
    """The bytes a `plan(..., None)` read landed, once `finish` kept them."""
    return finished_bytes(one.view, one.result)


def finish(s: Session, one: OneRead, result: TransferResult, read_started: float) -> int:
    """The value's size once `result` landed the bytes the place was read for, counted as the
    general flow counts a get; else -1, with the buffer cleared and the place forgotten (the
    face then runs the general flow)."""
    location, locations = one.location, s.locations
    assert locations is not None  # `plan` needs them
    if result.ok and landed_digest(result, one.view, ()) == location.checksum:
        now = time.perf_counter()
        size = location.size
        locations.counted_trusted(1, 0)
        metrics.record_request("get", keys=1, hits=1, nbytes=size, lookup_s=0.0,
                               load_s=now - read_started, wait_s=now - one.started,
                               tokens_per_key=s.tokens_per_key)
        costs = s.costs
        if costs is not None:
            costs.read(str(getattr(one.transport, "name", "")), size, now - read_started)
            costs.load(size, now - one.started)
        return size
    if result.status in NODE_TROUBLE:
        one.transport.forget(location.route)
    if one.result is None:  # the caller's memory: no byte of a read not kept stays there
        one.view[:] = bytes(location.size)
    locations.forget(one.key)
    locations.counted_trusted(0, 1)
    return -1


__all__ = ["OneRead", "deadline_of", "finish", "plan", "value"]
