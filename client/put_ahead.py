"""Put ahead: write allocations held for the next puts of a size, so a put skips PutStart.

Why
    A put is three round trips one after the other: PutStart (where to write, and a write
    grant), the write to the node, PutEnd (the node's receipt, which makes the object visible).
    A client that keeps putting objects of one size (an engine's KV page) can ask the master
    for allocations of that size before it knows their keys (a `PutAheadAsk` riding on the
    PutStart or PutEnd it sends anyway, master/put_ahead.py). Its next put of that size then
    writes under a held allocation at once and binds the key in PutEnd: two round trips.

Why it is safe
    A put-ahead grant names the tenant, not a key (proto/grant.py ANY_KEY): the node stores the
    object under the key the write names, and its receipt names that key; the master binds the
    allocation to the PutEnd's key only if the receipt says the same, the allocation is newer
    than the key's last version and removal, and the put's fields fit (size, replicas). It
    answers EXPIRED otherwise (or NOT_FOUND, for an allocation a new master never granted), and
    the key is put again through PutStart, so the result is the one a plain put would have had.

What it keeps and its limits
    `PutAheadPool`: per (size, replicas) the allocations granted and not used yet, each until
    MARGIN_S before its grants expire by the master's clock (a write and a PutEnd must still
    fit); only those of the newest master epoch. A batch uses held allocations only when they
    cover all its keys: one that needs a PutStart anyway saves no round trip. An allocation
    holds node memory (and may have evicted for it), so a client asks only for what it is
    about to use: for a batch all of whose values are of one size, only when an earlier batch
    put that size too (sizes that do not repeat are never asked for), only for objects of at
    most MAX_OBJECT_BYTES (a larger put is bounded by its transfer, not its round trips), two
    such batches' worth (at least ASK_CHUNK), at most `max_held` per size
    (`$CELLAR_PUT_AHEAD`, default DEFAULT_MAX_HELD; 0 turns putting ahead off) and
    MAX_HELD_BYTES over all sizes and replicas, and nothing when those bounds could never
    cover such a batch. A hard-pinned put, one with a preferred host, and a retry never use
    one. Allocations not used are revoked when the client closes, else by the master when
    their grants expire (`write_grant_ttl_s`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cellar.client.checks import int_from_env
from cellar.client.session_state import replica_grant, routes_from_segments
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_WRITE, Grant
from cellar.transfer.base import SegmentRoute

__all__ = ["DEFAULT_MAX_HELD", "MARGIN_S", "PUT_AHEAD_ENV", "Ahead", "PutAheadPool",
           "put_ahead_from_env"]

PUT_AHEAD_ENV = "CELLAR_PUT_AHEAD"
DEFAULT_MAX_HELD = 64      # allocations held per size (a master grants at most its own limit)
MAX_HELD_LIMIT = 4096      # the most $CELLAR_PUT_AHEAD may ask for
MARGIN_S = 2.0             # an allocation is not used this close to its grants' expiry
# Asks come in chunks: a reply granting one allocation cost a one-key put about 90 us of its
# PutEnd's round trip, one granting 8 every 8th put hardly more (a 64 KiB tcp put, p50:
# 587 -> 412 us; docs/benchmarks.md). What one client holds per size is bounded in bytes too.
ASK_CHUNK = 8
MAX_HELD_BYTES = 8 << 20     # node memory one client's held allocations take, all replicas
MAX_OBJECT_BYTES = 1 << 20   # larger puts never ask ahead
MAX_SIZES_SEEN = 64          # sizes remembered as put by an earlier batch (oldest forgotten)

Shape = tuple[int, int]    # (object size in bytes, replicas as the put asks: 0 = default)


@dataclass(slots=True)
class Ahead:
    """One put-ahead allocation: its put id, one (route, write grant) per replica, the master
    epoch that granted it, and until when (monotonic s) to use it."""

    put_id: int
    # (route, write grant, claim: the master flagged the replica, transfer/base.py TransferOp)
    targets: tuple[tuple[SegmentRoute, Grant, bool], ...]
    epoch: int
    good_until: float


class PutAheadPool:
    """The put-ahead allocations one client holds (safe from many threads)."""

    def __init__(self, max_held: int = DEFAULT_MAX_HELD) -> None:
        if not 1 <= max_held <= MAX_HELD_LIMIT:
            raise ValueError(f"max_held must be in [1, {MAX_HELD_LIMIT}]")
        self.max_held = max_held
        self._held: dict[Shape, deque[Ahead]] = {}
        self._seen: dict[Shape, None] = {}  # shapes earlier batches put, oldest first
        self._epoch = 0
        self._lock = threading.Lock()
        self.used = 0      # puts that wrote under a held allocation
        self.granted = 0   # allocations received
        self.dropped = 0   # ... given up unused (expired here, another epoch, unhealthy node)
        self.one_step = 0  # single puts done in one step under one (client/one_put.py)

    def held(self, shape: Shape | None = None) -> int:
        with self._lock:
            if shape is not None:
                return len(self._held.get(shape, ()))
            return sum(len(q) for q in self._held.values())

    def take(self, shape: Shape, count: int, unhealthy: frozenset[str] | set[str],
             now: float | None = None) -> list[Ahead]:
        """Up to `count` usable allocations of `shape`, oldest first (expired ones and those
        on a node lately unhealthy are dropped)."""
        now = time.monotonic() if now is None else now
        out: list[Ahead] = []
        with self._lock:
            queue = self._held.get(shape)
            while queue and len(out) < count:
                ahead = queue.popleft()
                if ahead.good_until <= now or (unhealthy and any(
                        route.node_id in unhealthy for route, _grant, _claim in ahead.targets)):
                    self.dropped += 1
                    continue
                out.append(ahead)
            self.used += len(out)
        return out

    def give_back(self, shape: Shape, ahead: Ahead) -> None:
        """Hold again an allocation `take` gave out and nothing wrote under (first in line);
        one of an older epoch than the newest reply's is dropped."""
        with self._lock:
            self.used -= 1
            if ahead.epoch != self._epoch:
                self.dropped += 1
                return
            self._held.setdefault(shape, deque()).appendleft(ahead)

    def counted_one_step(self) -> None:
        with self._lock:
            self.one_step += 1

    def repeats(self, shape: Shape) -> bool:
        """Note that a batch puts `shape`; whether an earlier one did (then it may ask)."""
        if shape[0] > MAX_OBJECT_BYTES:
            return False
        with self._lock:
            seen = shape in self._seen
            self._seen.pop(shape, None)
            self._seen[shape] = None  # now the newest
            if len(self._seen) > MAX_SIZES_SEEN:
                del self._seen[next(iter(self._seen))]
        return seen

    def ask(self, shape: Shape, count: int) -> Any | None:
        """The `PutAheadAsk` for a request of a batch that puts `count` objects of `shape` (a
        shape that `repeats`), or None: nothing while what is held covers a batch like it, or
        when `max_held` and MAX_HELD_BYTES leave too little to cover one; else up to two such
        batches' worth, at least ASK_CHUNK, within those bounds, less what is held."""
        # Racy reads are fine: an ask is a hint, and the master bounds what it grants.
        queue = self._held.get(shape)
        held = len(queue) if queue else 0
        if held >= count:
            return None
        held_bytes = sum(len(q) * _bytes(s) for s, q in list(self._held.items()))
        room = min(self.max_held - held, (MAX_HELD_BYTES - held_bytes) // _bytes(shape))
        if room < count - held:
            return None  # never enough for a batch like it: a batch uses them only if so
        return pb.PutAheadAsk(count=min(max(2 * count, ASK_CHUNK) - held, room),
                              size_bytes=shape[0], replicas=shape[1])

    def add(self, granted: Iterable[Any], segments: Iterable[Any], shape: Shape, epoch: int,
            master_time_ms: int, now: float | None = None) -> None:
        """Keep what a reply's `ahead` granted for `shape` (what the request asked). A reply
        of a new epoch drops what older masters granted; an allocation whose replicas are not
        sane (`replica_grant`) is not kept (the master revokes it when its grants expire)."""
        granted = list(granted)
        if not granted or not master_time_ms:
            return
        now = time.monotonic() if now is None else now
        routes = routes_from_segments(segments)
        base_s = now - master_time_ms / 1000 - MARGIN_S
        fresh: list[Ahead] = []
        for result in granted:
            targets = []
            for rep in result.replicas:
                checked = replica_grant(rep, routes, shape[0], GRANT_OP_WRITE)
                if isinstance(checked, str):
                    break
                targets.append((*checked, rep.claim))
            else:
                if targets:
                    expiry_ms = min(grant.expiry_ms for _route, grant, _claim in targets)
                    fresh.append(Ahead(int(result.put_id), tuple(targets), epoch,
                                       base_s + expiry_ms / 1000))
        with self._lock:
            if epoch != self._epoch:
                self.dropped += sum(len(q) for q in self._held.values())
                self._held.clear()
                self._epoch = epoch
            self._held.setdefault(shape, deque()).extend(fresh)
            self.granted += len(fresh)

    def revoke_refs(self, max_refs: int) -> list[Any]:
        """PutRefs revoking at most `max_refs` allocations held, which are forgotten (the
        client is closing; what one request cannot carry the master revokes at expiry)."""
        with self._lock:
            out = [pb.PutRef(key="", put_id=ahead.put_id)
                   for queue in self._held.values() for ahead in queue][:max_refs]
            self._held.clear()
        return out


def _bytes(shape: Shape) -> int:
    """Node memory one allocation of `shape` takes (replicas 0, the master's default: 1)."""
    return max(1, shape[0]) * max(1, shape[1])


def put_ahead_from_env() -> int:
    """Allocations held per size ($CELLAR_PUT_AHEAD: unset DEFAULT_MAX_HELD, 0 off, else
    1..MAX_HELD_LIMIT); `cellar.InvalidArgument` for anything else."""
    return int_from_env(PUT_AHEAD_ENV, DEFAULT_MAX_HELD, MAX_HELD_LIMIT,
                        "allocations held per size; 0: off")
