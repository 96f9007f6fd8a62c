"""The COMMITs and CLAIMs of a batch of shm writes: planned, grouped per node, sent early.

What it owns
    `WritePlan` (per op its result so far, its copy job and its COMMIT; the CLAIMs to send
    before any byte is copied), `group_commits` (per node address, in sending order),
    `with_digest(s)` (a COMMIT names the digest of what was copied when the op left its
    checksum to the copy) and `EarlyCommits` (the sync face's commits sent in groups while the
    rest of the batch is still being copied). transfer/shm.py says what a COMMIT and a CLAIM
    are and why; this module only plans and sends them.

It must not import the transports: it sits under transfer/shm.py and transfer/shm_async.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cellar.transfer.base import TransferOp, TransferResult
from cellar.transfer.control import ControlCall, ControlReply, ControlStream
from cellar.transfer.frame import OP_CLAIM, ST_OK, with_checksum
from cellar.transfer.memcopy import CopyJob

__all__ = ["EARLY_COMMIT_BYTES", "Commit", "EarlyCommits", "WritePlan", "group_commits",
           "triples", "with_digest", "with_digests"]

# A planned write's commit: (op index, node tcp address, the COMMIT frame).
Commit = tuple[int, str, ControlCall]


def triples(replies: dict[str, list[ControlReply]]) -> dict[str, list[tuple[int, str, bytes]]]:
    """The nodes' replies as (status, message, payload), per address: what `on_claims` and
    `ShmTransport.finish_write` take (the asyncio face's channel answers in that form)."""
    return {a: [(r.status, r.message, r.payload) for r in rs] for a, rs in replies.items()}


@dataclass(slots=True)
class WritePlan:
    """A batch of shm writes as planned: per op its result so far, its copy job and its
    COMMIT. Before any byte is copied, each allocation the master flagged (`TransferOp.claim`:
    its range may still be served to an old read grant, master/state/read_frees.py) is
    CLAIMed at its node (frame.OP_CLAIM): the node drops the older entries of the range, so a
    read under a grant of the range's previous allocation (freed by the master, its notice not
    at the node yet) is refused rather than served from the bytes being copied there
    (docs/security.md). One round trip per node per batch, all its claims pipelined; none when
    no op is flagged."""

    results: list[TransferResult]
    jobs: list[tuple[int, CopyJob]]
    commits: list[Commit]

    def claims(self, ops: Sequence[TransferOp]) -> list[Commit]:
        """A CLAIM per flagged op that will be copied: its COMMIT's frame under the claim op."""
        return [(i, address, ControlCall(OP_CLAIM, call.grant, call.segment_id, call.offset,
                                         call.length, call.meta))
                for i, address, call in self.commits if ops[i].claim and self.results[i].ok]

    def on_claims(self, which: dict[str, list[int]],
                  replies: dict[str, list[tuple[int, str, bytes]]]) -> int:
        """A refused claim fails its op (nothing is copied for it, no COMMIT is sent); how
        many were refused."""
        refused = 0
        for address, indexes in which.items():
            for i, (status, message, _) in zip(indexes, replies[address], strict=True):
                if status != ST_OK:
                    self.results[i] = TransferResult(status, f"claim: {message}")
                    refused += 1
        return refused


def with_digest(op: TransferOp, call: ControlCall, digest: int | None) -> None:
    """An op that left its checksum to the copy (`want_checksum`): its COMMIT names the
    digest of what was copied."""
    if op.want_checksum and op.meta is not None:
        if digest is None:
            raise ValueError("a write hashed as it was copied has no digest")
        call.meta = with_checksum(call.meta, digest)


def with_digests(ops: Sequence[TransferOp], results: Sequence[TransferResult],
                 commits: Sequence[Commit]) -> None:
    """`with_digest` for each of `commits` (from `copy_write`), from its op's result."""
    for i, _, call in commits:
        with_digest(ops[i], call, results[i].checksum)


# A batch's COMMITs go in groups of at least this many copied bytes while the rest is still
# being copied, so the node checks and records them on the other core meanwhile.
EARLY_COMMIT_BYTES = 4 << 20


class EarlyCommits:
    """The COMMITs of one batch of writes, sent as their copies complete: EARLY_COMMIT_BYTES
    at a time during the copy (`on_done`, from `memcopy.Copier.run`), the rest after it
    (`send_rest`). 16 x 1 MiB puts into a disk tier waited ~0.6 ms for their 16 commits after
    the copy; sent in groups of 4 while the next are copied, only the last group's remain
    (docs/disk-tier.md). `which`: per node address the op indexes of the commits sent, in
    order (as `group_commits`)."""

    def __init__(self, ops: Sequence[TransferOp], plan: WritePlan, stream: ControlStream) -> None:
        self.ops = ops
        self.stream = stream
        self.which: dict[str, list[int]] = {}
        self._op_of = {id(job): i for i, job in plan.jobs}
        self._commit_of = {c[0]: c for c in plan.commits}
        self._sent: set[int] = set()
        self._held: list[Commit] = []
        self._held_bytes = 0
        self.early_groups = 0  # groups sent while the copy was still running

    def on_done(self, job: CopyJob) -> None:
        i = self._op_of[id(job)]
        commit = self._commit_of[i]
        with_digest(self.ops[i], commit[2], job.digest)
        self._held.append(commit)
        self._held_bytes += job.nbytes
        if self._held_bytes >= EARLY_COMMIT_BYTES:
            self.early_groups += 1
            self._send(self._held)
            self._held, self._held_bytes = [], 0

    def send_rest(self, results: Sequence[TransferResult], done: Sequence[Commit]) -> None:
        """The commits of every op copied in time that did not go during the copy."""
        rest = [c for c in done if c[0] not in self._sent]
        with_digests(self.ops, results, rest)
        self._send(rest)

    def _send(self, commits: Sequence[Commit]) -> None:
        calls, which = group_commits(commits)
        for address, indexes in which.items():
            self.which.setdefault(address, []).extend(indexes)
        self._sent.update(c[0] for c in commits)
        self.stream.send(calls)


def group_commits(commits: Sequence[Commit]
                  ) -> tuple[dict[str, list[ControlCall]], dict[str, list[int]]]:
    """Commits per node address, and the op index of each, in sending order."""
    calls: dict[str, list[ControlCall]] = {}
    which: dict[str, list[int]] = {}
    for i, address, call in commits:
        calls.setdefault(address, []).append(call)
        which.setdefault(address, []).append(i)
    return calls, which
