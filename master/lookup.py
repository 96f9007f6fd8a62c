"""What the cache holds of an ordered list of page keys: the leading run, per tier, in bytes.

An engine asks before it schedules a prefill: of these pages (in order), how many leading ones
can I load, from which tier, and how many bytes is that? `lookup` answers in one pass over the
keys (in C loops where it can), on the master's one loop, without pinning or touching last
access (a probe must not make objects unevictable or look hot, as for `prefix_len`). The SDK turns the bytes into a load-time
estimate from its own measurements and, given the caller's prefill rate, into load-or-recompute
advice (client/lookup.py); the master only says what it holds.

Tiers: an object is served from its fastest replica's tier (`records.on_disk_only`): "dram"
when any replica sits in a DRAM segment, "disk" when all of them are on nodes' disk tiers (state/tiers.py). The
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
from operator import attrgetter

from cellar.master.service import MasterService
from cellar.master.state.records import on_disk_only

TIER_DRAM = "dram"
TIER_DISK_NAME = "disk"
TIERS = (TIER_DRAM, TIER_DISK_NAME)  # fastest first; the order replies list them in
_size = attrgetter("size")


@dataclass(slots=True)
class LookupOutcome:
    prefix_len: int = 0
    prefix_bytes: int = 0
    tiers: list[tuple[str, int, int]] = field(default_factory=list)  # (tier, keys, bytes)


def lookup(service: MasterService, tenant_name: str, keys: Sequence[str]) -> LookupOutcome:
    """The leading run of `keys` the tenant holds, split by tier (see the module docstring).
    One pass over the keys (this is a hot probe: 256 keys in well under the 0.3 ms target),
    then the same checks as PrefixLen past the run."""
    tenant = service.tenant(tenant_name, len(keys))  # checks the batch before it may create one
    found = list(map(tenant.objects.get, keys))  # C loops: the run and its sizes
    count = found.index(None) if None in found else len(found)
    run = found[:count]
    if not service.membership.tiered:  # no node with a disk tier: every replica is DRAM
        dram_keys, dram_bytes, disk_keys, disk_bytes = count, sum(map(_size, run)), 0, 0
    else:
        dram_keys = dram_bytes = disk_keys = disk_bytes = 0
        for obj in run:
            if on_disk_only(obj):
                disk_keys += 1
                disk_bytes += obj.size
            else:
                dram_keys += 1
                dram_bytes += obj.size
    service.check_run_end(tenant, keys, count)
    tiers = [(tier, n, nbytes) for tier, n, nbytes in ((TIER_DRAM, dram_keys, dram_bytes),
                                                       (TIER_DISK_NAME, disk_keys, disk_bytes)) if n]
    return LookupOutcome(count, dram_bytes + disk_bytes, tiers)
