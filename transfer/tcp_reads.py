"""How a TCP lane receives READ replies and hashes them as they land (`tcp.TcpTransport._pump`).

Why here
    A read whose op asked for its checksum (`want_checksum`) is hashed by the lane that
    receives it while its bytes are still in the CPU's cache, instead of by the caller once the
    batch landed (from memory, at a fraction of the rate). Three shapes: runs of small replies
    in one native call (`native_reads`, each hashed right after it lands), a large payload
    received and hashed HASHED_PIECE_BYTES at a time (`receive_payload`), and the frames of a
    multi-frame op hashed in turn when one lane had all of them (`read_span_frame`).

It owns no socket and no state beyond the lane's `Runs`; the pump hands it its inbox and plan.
"""

from __future__ import annotations

from collections import deque

from xxhash import xxh3_64, xxh3_64_intdigest

from cellar.transfer._sockio import Inbox
from cellar.transfer.tcp_plan import Plan

# Payload bytes one native call receives before it returns, so the lane hashes them while
# they are still in the CPU's cache (L2 is 1.25 MiB a core on the machines measured here).
NATIVE_RUN_BYTES = 512 << 10
# A larger read that wants its checksum is received and hashed this much at a time
# (`Inbox.read_into_hashed`), not hashed whole once it landed (4 MiB no longer sit in L2).
HASHED_PIECE_BYTES = 256 << 10
# A multi-frame read being hashed on this lane: op index -> (its digest so far, the segment
# offset its next frame must start at).
Runs = dict[int, tuple[xxh3_64, int]]

# A reply due: (request id, op index, destination views, payload bytes, segment offset).
Pending = tuple[int, int, tuple[memoryview, ...], int, int]


def native_reads(inbox: Inbox, pending: deque[Pending], deadline: float, hashed: list[bool],
                  sums: list[int | None], spans: dict[int, tuple[int, int]],
                  most: int) -> tuple[int, BaseException | None]:
    """Receive up to `most` of the `pending` READ replies (those due first, one destination
    each, about NATIVE_RUN_BYTES) in one native call (`Inbox.read_replies`); pops and hashes
    each that landed. Returns (how many, the error that stopped the call or None). What it
    leaves (an error reply, a scattered destination) the pump's Python loop receives."""
    items: list[tuple[int, memoryview]] = []
    total = 0
    for rid, op_i, views, size, _ in pending:
        if len(items) >= most or total >= NATIVE_RUN_BYTES or len(views) != 1 \
                or len(views[0]) != size or op_i in spans \
                or (hashed[op_i] and size > HASHED_PIECE_BYTES):
            break  # what follows is hashed as it lands (the pump's loop)
        items.append((rid, views[0]))
        total += size
    if not items:
        return 0, None
    done, error = inbox.read_replies(items, deadline, NATIVE_RUN_BYTES)
    for _ in range(done):
        _, op_i, views, _, _ = pending.popleft()
        if hashed[op_i]:
            sums[op_i] = xxh3_64_intdigest(views[0])
    return done, error


def read_span_frame(inbox: Inbox, view: memoryview, early: int, op_i: int, offset: int,
                     span: tuple[int, int], runs: Runs,
                     sums: list[int | None]) -> None:
    """Receive one frame of a multi-frame read that wants its checksum (`Plan.spans`), hashing
    it as it lands while this lane has had every earlier frame of the op, in order: the op's
    first frame starts a run, each next one must start where the run ended, the last one
    gives the op its checksum. A frame that does not continue a run (the op's frames went to
    several lanes) ends it; the caller then hashes the op once it has landed."""
    first, end = span
    if offset == first:
        digest: xxh3_64 | None = xxh3_64()
    else:
        run = runs.pop(op_i, None)
        digest = run[0] if run is not None and run[1] == offset else None
    if digest is None:
        inbox.read_into(view[early:])
        return
    inbox.read_into_hashed(view, early, HASHED_PIECE_BYTES, digest)
    if offset + len(view) == end:
        sums[op_i] = digest.intdigest()
    else:
        runs[op_i] = (digest, offset + len(view))


def receive_payload(inbox: Inbox, view: memoryview, early: int, op_i: int, offset: int,
                    plan: Plan, runs: Runs) -> None:
    """The rest of an OK READ reply's payload into its one destination `view` (its first
    `early` bytes landed with the header), hashed as it lands when the op wants its checksum."""
    if plan.spans and op_i in plan.spans:  # a frame of a multi-frame read
        read_span_frame(inbox, view, early, op_i, offset, plan.spans[op_i], runs, plan.sums)
    elif plan.hashed[op_i] and len(view) > HASHED_PIECE_BYTES:
        digest = xxh3_64()
        inbox.read_into_hashed(view, early, HASHED_PIECE_BYTES, digest)
        plan.sums[op_i] = digest.intdigest()
    else:
        inbox.read_into(view[early:])
        if plan.hashed[op_i]:
            plan.sums[op_i] = xxh3_64_intdigest(view)


__all__ = ["HASHED_PIECE_BYTES", "NATIVE_RUN_BYTES", "Pending", "Runs", "native_reads",
           "read_span_frame", "receive_payload"]
