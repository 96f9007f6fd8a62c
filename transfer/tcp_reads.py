"""How a TCP lane receives READ replies and hashes them as they land (`tcp.TcpTransport._pump`).

Why here
    A read whose op asked for its checksum (`want_checksum`) is hashed by the lane that
    receives it while its bytes are still in the CPU's cache, instead of by the caller once the
    batch landed (from memory, at a fraction of the rate). Three shapes: runs of small replies
    in one native call (`native_reads`, each hashed right after it lands), a large payload
    received and hashed HASHED_PIECE_BYTES at a time (`receive_payload`), and the frames of a
    multi-frame op hashed in turn when one lane had all of them (`frame_digest`). The
    asyncio transport (`tcp_async`) feeds the same digests as its non-blocking receives land.

It owns no socket and no state beyond the plan's (`Plan.runs`, `Plan.sums`).
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
# A reply due: (request id, op index, destination views, payload bytes, segment offset).
Pending = tuple[int, int, tuple[memoryview, ...], int, int]


def native_reads(inbox: Inbox, pending: deque[Pending], deadline: float, plan: Plan,
                 most: int) -> tuple[int, BaseException | None]:
    """Receive up to `most` of the `pending` READ replies (those due first, one destination
    each, about NATIVE_RUN_BYTES) in one native call (`Inbox.read_replies`); pops and hashes
    each that landed. Returns (how many, the error that stopped the call or None). What it
    leaves (an error reply, a scattered destination, a frame hashed as it lands) the pump's
    Python loop receives."""
    items: list[tuple[int, memoryview]] = []
    total = 0
    for rid, op_i, views, size, _ in pending:
        if len(items) >= most or total >= NATIVE_RUN_BYTES or len(views) != 1 \
                or len(views[0]) != size or lands_hashed(plan, op_i, size):
            break
        items.append((rid, views[0]))
        total += size
    if not items:
        return 0, None
    done, error = inbox.read_replies(items, deadline, NATIVE_RUN_BYTES)
    hashed, sums = plan.hashed, plan.sums
    for _ in range(done):
        _, op_i, views, _, _ = pending.popleft()
        if hashed[op_i]:
            sums[op_i] = xxh3_64_intdigest(views[0])
    return done, error


def lands_hashed(plan: Plan, op_i: int, size: int) -> bool:
    """Whether an OK READ frame of op `op_i`, `size` bytes, is hashed piece by piece as it
    lands (`frame_digest`): a frame of a multi-frame read that wants its checksum
    (`Plan.spans`), or a one-frame read larger than HASHED_PIECE_BYTES that does."""
    return (bool(plan.spans) and op_i in plan.spans) or \
        (plan.hashed[op_i] and size > HASHED_PIECE_BYTES)


def frame_digest(plan: Plan, op_i: int, offset: int, size: int) -> xxh3_64 | None:
    """The digest an OK READ frame of `size` bytes at segment `offset` is to be hashed into as
    it lands, or None (`lands_hashed` says which; a small frame is hashed whole after it
    landed, if at all). A frame of a multi-frame read continues its op's run: the op's first
    frame starts one, each next frame must start where the run ended (frames of one op reach
    one lane in order; when they went to several, a frame finds no run to continue and the
    caller hashes the op once it has landed). Pops the run: only the frame holding a digest
    updates it."""
    if not lands_hashed(plan, op_i, size):
        return None
    span = plan.spans.get(op_i)
    if span is None or offset == span[0]:
        return xxh3_64()
    run = plan.runs.pop(op_i, None)
    return run[0] if run is not None and run[1] == offset else None


def frame_hashed(plan: Plan, op_i: int, offset: int, size: int, digest: xxh3_64) -> None:
    """A frame fed to `digest` (`frame_digest`) has landed: the op's checksum when it was the
    op's last frame, else its run goes on."""
    span = plan.spans.get(op_i) if plan.spans else None
    if span is None or offset + size == span[1]:
        plan.sums[op_i] = digest.intdigest()
    else:
        plan.runs[op_i] = (digest, offset + size)


def receive_payload(inbox: Inbox, view: memoryview, early: int, op_i: int, offset: int,
                    plan: Plan) -> None:
    """The rest of an OK READ reply's payload into its one destination `view` (its first
    `early` bytes landed with the header), hashed as it lands when the op wants its checksum."""
    digest = frame_digest(plan, op_i, offset, len(view))
    if digest is not None:
        inbox.read_into_hashed(view, early, HASHED_PIECE_BYTES, digest)
        frame_hashed(plan, op_i, offset, len(view), digest)
        return
    inbox.read_into(view[early:])
    if plan.hashed[op_i]:
        plan.sums[op_i] = xxh3_64_intdigest(view)


__all__ = ["HASHED_PIECE_BYTES", "NATIVE_RUN_BYTES", "Pending", "frame_digest", "frame_hashed",
           "lands_hashed", "native_reads", "receive_payload"]
