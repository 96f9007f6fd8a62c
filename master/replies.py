"""Replies: what a master RPC answers, and the signed grants inside those answers.

Owns the plain output types (`PutStartResult`, `GetResult`, the `*Outcome`s) that the servicer
turns into protobuf, and `GrantIssuer`, the one place that turns an object's replicas into
`GrantedReplica`s: where each replica is and the MAC a storage node checks (cellar.proto.grant).
Every reply also names each segment it refers to once, so the servicer sends its endpoints once.

Invariant: a grant names exactly the replica's segment, offset and the object's size, its
alloc id, this master's epoch and the key tag; nothing here allocates, frees or evicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cellar.errors import Status
from cellar.master.grant_issuer import GrantSigner
from cellar.proto.grant import GRANT_FLAG_COMMIT, Grant

if TYPE_CHECKING:
    from cellar.master.state.records import Obj, Replica, Segment

KeyResults = list[tuple[int, str]]


class GrantedReplica:
    """One replica as returned to a client: where it is and the signed grant for it."""

    __slots__ = ("node_id", "segment_id", "offset", "length", "op", "alloc_id", "epoch", "expiry_ms",
                 "key_tag", "mac", "claim")

    def __init__(
        self, node_id: str, segment_id: int, offset: int, length: int, op: int, alloc_id: int,
        epoch: int, expiry_ms: int, key_tag: int, mac: bytes, claim: bool = False,
    ) -> None:
        self.node_id = node_id
        self.segment_id = segment_id
        self.offset = offset
        self.length = length
        self.op = op
        self.alloc_id = alloc_id
        self.epoch = epoch
        self.expiry_ms = expiry_ms
        self.key_tag = key_tag
        self.mac = mac
        # a shm/rdma write must CLAIM the allocation at the node before copying: the range
        # overlaps one an old read grant may still reach (state/read_frees.py)
        self.claim = claim

    def grant(self) -> Grant:
        """As a `cellar.proto.grant.Grant` (what a storage node verifies)."""
        return Grant(self.op, self.segment_id, self.offset, self.length, self.alloc_id, self.epoch,
                     self.expiry_ms, self.key_tag, self.mac)


class PutStartResult:
    __slots__ = ("status", "message", "put_id", "replicas")

    def __init__(
        self, status: Status, message: str = "", put_id: int = 0,
        replicas: list[GrantedReplica] | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.put_id = put_id
        self.replicas = replicas or []


class GetResult:
    __slots__ = ("status", "message", "size_bytes", "checksum", "pin_id", "replicas")

    def __init__(
        self, status: Status, message: str = "", size_bytes: int = 0, checksum: int = 0,
        pin_id: int = 0, replicas: list[GrantedReplica] | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.size_bytes = size_bytes
        self.checksum = checksum
        self.pin_id = pin_id
        self.replicas = replicas or []


@dataclass
class PutStartOutcome:
    results: list[PutStartResult]
    segments: list[Segment]  # every segment the results (and `ahead`) refer to, once
    ahead: list[PutStartResult] = field(default_factory=list)  # put-ahead allocations granted


@dataclass
class GetOutcome:
    results: list[GetResult]
    segments: list[Segment]


@dataclass
class HeartbeatOutcome:
    remount: bool
    freed: list[tuple[int, int, int, int, int]]  # (seq, segment_id, alloc_id, offset, length)
    freed_seq: int
    moves: list[Any] = field(default_factory=list)  # state/tiers.py Move: node-local copies
    # (segment_id, alloc_id, engine hash) of the node's sealed replicas (state/membership.py)
    engine_hashes: list[tuple[int, int, bytes]] = field(default_factory=list)
    # (segment_id, alloc_id, soft pin lapse in wall-clock ms) of the node's sealed replicas, the
    # same way
    soft_pins: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass
class MountOutcome:
    results: list[tuple[int, str]]
    heartbeat_interval_ms: int
    write_grant_ttl_ms: int = 0
    read_grant_ttl_ms: int = 0


@dataclass
class ReportOutcome:
    status: Status
    message: str = ""
    refused: list[int] = field(default_factory=list)
    accepted: int = 0


class GrantIssuer:
    """Signs the grants of one master epoch."""

    def __init__(self, secret: bytes, epoch: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._mac = GrantSigner(secret).mac
        self.epoch = epoch
        self._clock = clock  # the master's monotonic clock (read_frees' times are on it)

    def one(
        self, obj: Obj, rep: Replica, op: int, expiry_ms: int, segments: dict[int, Segment]
    ) -> GrantedReplica:
        """`all` for one replica (the put fast path's)."""
        segment = rep.segment
        segment_id = segment.segment_id
        segments[segment_id] = segment
        size = obj.size
        offset = rep.offset
        alloc_id = rep.alloc_id
        epoch = self.epoch
        tag = obj.tag
        assert offset >= 0 and offset + size <= segment.size_bytes and alloc_id > 0 and expiry_ms > 0, \
            "a grant for a range outside its segment, or without an allocation or an expiry"
        return GrantedReplica(
            segment.node.node_id, segment_id, offset, size, op, alloc_id, epoch, expiry_ms, tag,
            self._mac(op, segment_id, offset, size, alloc_id, epoch, expiry_ms, tag),
            _claim(segment, op, offset, size, self._clock),
        )

    def all(
        self, obj: Obj, op: int, expiry_ms: int, segments: dict[int, Segment]
    ) -> list[GrantedReplica]:
        mac = self._mac
        epoch = self.epoch
        size = obj.size
        tag = obj.tag
        out = []
        assert obj.replicas and expiry_ms > 0, "a grant for an object without replicas or an expiry"
        for rep in obj.replicas:
            segment = rep.segment
            segment_id = segment.segment_id
            segments[segment_id] = segment
            assert rep.offset >= 0 and rep.offset + size <= segment.size_bytes and rep.alloc_id > 0, \
                "a grant for a range outside its segment or without an allocation"
            out.append(GrantedReplica(
                segment.node.node_id, segment_id, rep.offset, size, op, rep.alloc_id, epoch,
                expiry_ms, tag, mac(op, segment_id, rep.offset, size, rep.alloc_id, epoch, expiry_ms, tag),
                _claim(segment, op, rep.offset, size, self._clock),
            ))
        return out


def _claim(segment: Segment, op: int, offset: int, size: int,
           clock: Callable[[], float]) -> bool:
    """Whether a write grant with the COMMIT right (a shm/rdma writer copies itself) covers a
    range the node may still serve to an old read grant (state/read_frees.py), or is on a
    node whose transfers of an earlier mount may still be moving bytes (`Node.claim_until`)."""
    node = segment.node
    frees = segment.read_frees
    if not op & GRANT_FLAG_COMMIT or (frees is None and not node.claim_until):
        return False
    now = clock()
    if now < node.claim_until:
        return True
    return frees is not None and frees.overlaps(offset, size, node.freed_acked, now,
                                                node.outbox_dropped_seq)
