"""What rides on a node's heartbeat besides liveness, both ways.

Up: the replicas the verifier found corrupt after a restart (`lost`, storage_node/verifier.py),
the disk tier's finished moves (`moved`, storage_node/disk_tier.py) and the re-replication
copies finished or failed (`copied`, storage_node/copier.py). Down: the moves and the copies
the master asks for (`moves`, `copies`). The master link (master_link.py) sends the heartbeat and decides
when it was delivered; this module only loads a request, puts the load back when the
heartbeat failed (so the next one carries it: nothing is reported twice or lost), and hands
the reply's moves to the mover and its copies to the copier (and tells both before each mount:
earlier moves and copies are void). It never talks to the master itself.

Limits: a load is bounded by its sources (`Verifier.take_lost`, `TierMover.take_done`,
`Copier.take_done`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from cellar.proto import cellar_pb2 as pb
from cellar.storage_node.copier import Copier
from cellar.storage_node.disk_tier import MOUNT_GATE_TIMEOUT_S, TierMover
from cellar.storage_node.verifier import Verifier


@dataclass
class Load:
    """What one heartbeat request carries up."""

    lost: list[tuple[int, int, int, int]] = field(default_factory=list)
    moved: list[tuple[int, int, bool]] = field(default_factory=list)
    copied: list[pb.CopyDone] = field(default_factory=list)
    sent_s: float = 0.0  # the mover's clock when it was loaded, just before the send


class HeartbeatCargo:
    def __init__(self, verifier: Verifier | None, mover: TierMover | None,
                 copier: Copier | None = None) -> None:
        self.verifier = verifier
        self.mover = mover  # the disk tier's moves, if the node has one
        self.copier = copier  # re-replication orders (copier.py)

    def load(self, request: Any) -> Load:
        """Take what waits to go up and add it to the heartbeat `request`."""
        load = Load()
        if self.verifier is not None:
            load.lost = self.verifier.take_lost()
        for segment_id, alloc_id, offset, length in load.lost:
            request.lost.add(segment_id=segment_id, alloc_id=alloc_id, offset=offset, length=length)
        if self.mover is not None:
            load.sent_s = self.mover.clock()
            load.moved = self.mover.take_done()
        for segment_id, alloc_id, ok in load.moved:
            request.moved.add(dst_segment_id=segment_id, dst_alloc_id=alloc_id, ok=ok)
        if self.copier is not None:
            load.copied = self.copier.take_done()
            request.copied.extend(load.copied)
        return load

    def undelivered(self, load: Load) -> None:
        """The heartbeat failed: the next one carries `load` again."""
        if load.lost and self.verifier is not None:
            self.verifier.requeue_lost(load.lost)
        if load.moved and self.mover is not None:
            self.mover.requeue_done(load.moved)
        if load.copied and self.copier is not None:
            self.copier.requeue(load.copied)

    def unload(self, reply: Any, load: Load | None = None) -> None:
        """Hand the reply's moves to the mover and its copies to the copier (after the freed
        ranges they may reuse); `load` is what the request carried (its send time bounds the
        moves' deadlines)."""
        if reply.moves and self.mover is not None:
            self.mover.submit(reply.moves, load.sent_s if load is not None and load.sent_s
                              else None)
        if reply.copies and self.copier is not None:
            self.copier.start(reply.copies)

    async def begin_mount(self) -> bool:
        """Before a mount: the copier cancels an earlier mount's copies (copier.py), the mover
        drops its moves (disk_tier.py, in a thread); False if a copy or a move is still writing
        after MOUNT_GATE_TIMEOUT_S (the mount is tried again)."""
        if self.copier is not None and not await self.copier.begin_mount(MOUNT_GATE_TIMEOUT_S):
            return False
        return self.mover is None or await asyncio.to_thread(self.mover.begin_mount)

    async def aclose(self) -> None:
        if self.copier is not None:
            await self.copier.aclose()
