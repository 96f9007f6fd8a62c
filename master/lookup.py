"""What the cache holds of an ordered list of page keys: the leading run, per tier, in bytes.

An engine asks before it schedules a prefill: of these pages (in order), how many leading ones
can I load, from which tier, and how many bytes is that? `lookup` answers in one pass over the
keys, on the master's one loop, without pinning or touching last access (a probe must not make
objects unevictable or look hot, as for `prefix_len`). The SDK turns the bytes into a load-time
estimate from its own measurements and, given the caller's prefill rate, into load-or-recompute
advice (client/lookup.py); the master only says what it holds.

Tiers: an object is served from its fastest replica's tier (`tier_of`): "dram" when any replica
sits in a DRAM segment, "disk" when all of them are on nodes' disk tiers (state/tiers.py). The
tier is a field of the answer, so the disk tier added a name here and nothing on the wire.
Readable means COMPLETE (in `tenant.objects`): a put in flight or a removed key ends the run.

Invariants: the counts of `tiers` add up to `prefix_len`, their bytes to `prefix_bytes`; the
input is checked exactly as PrefixLen checks it (batch bound, key errors past the run, the
rebuild grace), so a refused request changes nothing and says the same as PrefixLen would.
It never mutates a table and never touches payload bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cellar.master.service import MasterService
from cellar.master.state.records import TIER_DISK, Obj

TIER_DRAM = "dram"
TIER_DISK_NAME = "disk"
TIERS = (TIER_DRAM, TIER_DISK_NAME)  # fastest first; the order replies list them in


def tier_of(obj: Obj) -> str:
    """The tier a read of `obj` is served from: its fastest replica's."""
    for rep in obj.replicas:
        if rep.segment.tier != TIER_DISK:
            return TIER_DRAM
    return TIER_DISK_NAME if obj.replicas else TIER_DRAM


@dataclass(slots=True)
class LookupOutcome:
    prefix_len: int = 0
    prefix_bytes: int = 0
    tiers: list[tuple[str, int, int]] = field(default_factory=list)  # (tier, keys, bytes)


def lookup(service: MasterService, tenant_name: str, keys: Sequence[str]) -> LookupOutcome:
    """The leading run of `keys` the tenant holds, split by tier (see the module docstring)."""
    count = service.prefix_len(tenant_name, keys)  # the same checks and grace as PrefixLen
    objects = service.tenant(tenant_name).objects
    by_tier: dict[str, list[int]] = {}
    total = 0
    for key in keys[:count]:
        obj = objects[key]
        size = obj.size
        total += size
        tier = tier_of(obj)
        entry = by_tier.get(tier)
        if entry is None:
            by_tier[tier] = [1, size]
        else:
            entry[0] += 1
            entry[1] += size
    tiers = [(tier, by_tier[tier][0], by_tier[tier][1]) for tier in TIERS if tier in by_tier]
    assert sum(t[1] for t in tiers) == count and sum(t[2] for t in tiers) == total
    return LookupOutcome(count, total, tiers)
