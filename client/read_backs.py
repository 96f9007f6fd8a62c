"""Read backs: a put's PutEnd brings back read grants, so the writer's next get is one read.

Why
    A get of a key this client has just put costs two round trips over tcp: GetReplicas, then
    the read. Early and trusted reads (client/early_reads.py) need a place and a read grant
    the client already holds, and a put holds only write grants, which a node never reads
    under. A PutEnd that asks `read_back` is answered, for each value it stored, with the
    replicas and read grants a GetReplicas sent right after it would name, and the same read
    trust (master/service.py `read_back`). Kept in the client's `Locations`, they make its
    next get of the key within the trust one read without asking (a single 64 KiB tcp get of
    a key just put: docs/benchmarks.md), and an early read until the grant expires.

What it costs, and who: off unless asked for
    The master signs one grant per replica of each value stored (no pin is taken, no hit
    counted), and the version counts as read by this client from the PutEnd on: another
    client's remove or new version of that key within `read_trust_s` (0.5 s by default) waits
    for the rest of it, as it would after this client's get (master/state/read_trust.py);
    this client's own changes never wait. Measured alternated on this 2-core VM (`make
    bench-read-backs`, docs/benchmarks.md "Read backs"), it makes the first get of a key just
    put about 4x faster and the puts a few percent to a sixth slower: the master's work and the
    client's bookkeeping are on the put's critical path, for keys most writers (an engine
    writing its KV pages through) do not read back within the trust. So a client asks only
    when `$CELLAR_READ_BACK_KEYS` (READ_BACK_ENV) is set, for PutEnds of at most that many
    keys (0, the default: never; at most MAX_KEYS_LIMIT, what `Locations` keeps), and only
    where it trusts reads at all (`$CELLAR_TRUSTED_READS`, `Locations.trust`).

Safety
    A read back is a GetReplicas answer in all but the pin: the grants name the allocation
    the PutEnd sealed, and the node checks them as any read grant; a read under one returns
    that version's bytes or nothing. A reply from a master that does not know `read_back`
    carries no `reads`, and nothing is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cellar.client.checks import int_from_env
from cellar.client.early_reads import MAX_LOCATIONS, Locations
from cellar.client.gets import TRUST_MARGIN_S
from cellar.client.session_state import disk_segment_ids, replica_grant, routes_from_segments
from cellar.proto.grant import GRANT_OP_READ, Grant
from cellar.transfer.base import SegmentRoute

__all__ = ["MAX_KEYS_LIMIT", "READ_BACK_ENV", "keys_from_env", "remember", "wanted"]

READ_BACK_ENV = "CELLAR_READ_BACK_KEYS"
MAX_KEYS_LIMIT = MAX_LOCATIONS  # keys one PutEnd may read back: what `Locations` keeps


def keys_from_env() -> int:
    """The most keys a PutEnd reads back ($CELLAR_READ_BACK_KEYS: unset or 0 never, else up
    to MAX_KEYS_LIMIT); `cellar.InvalidArgument` for anything else."""
    return int_from_env(READ_BACK_ENV, 0, MAX_KEYS_LIMIT, "keys a PutEnd reads back; 0: off")


def wanted(locations: Locations | None, max_keys: int, keys: int) -> bool:
    """Whether a PutEnd of `keys` keys asks for read backs, `max_keys` the client's setting."""
    return locations is not None and locations.trust and 0 < keys <= max_keys


def remember(locations: Locations, keys: Sequence[str], reply: Any, asked_at: float) -> int:
    """Keep in `locations` the read grants a PutEnd `reply` brought back for `keys` (its items'
    keys, in order), trusted until the reply's read trust counted from `asked_at` (monotonic
    s, when the request left); the number of keys kept. A reply whose `reads` do not match
    the items one to one (a master that does not read back) gives none."""
    reads = reply.reads
    if len(reads) != len(keys):
        return 0
    trust_ms = int(reply.read_trust_ms)
    trusted_until = asked_at + trust_ms / 1000 - TRUST_MARGIN_S if trust_ms else 0.0
    routes = routes_from_segments(reply.segments)
    disk = disk_segment_ids(reply.segments)
    kept: list[tuple[str, SegmentRoute, Grant, int, int, bool]] = []
    for key, read in zip(keys, reads, strict=True):
        if read.status:
            continue
        size = int(read.size_bytes)
        for replica in read.replicas:  # the first sane one: the master orders them healthiest first
            checked = replica_grant(replica, routes, size, GRANT_OP_READ)
            if not isinstance(checked, str):
                kept.append((key, *checked, size, int(read.checksum),
                             int(replica.segment_id) in disk))
                break
    if kept:
        locations.remember(kept, int(reply.header.master_time_ms), trusted_until=trusted_until,
                           asked_at=asked_at)
    return len(kept)
