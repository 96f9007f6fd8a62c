"""The values of `SegmentInfo.tier` (cellar.proto), written once for every part.

A segment is DRAM (a node's registered memory) or DISK (the node's disk-tier file,
docs/disk-tier.md). The master places, demotes and promotes by it, the node mounts by it,
the client reads it from a reply's segment table (its status rows and its LATE estimate).
"""

from __future__ import annotations

from collections.abc import Iterable

TIER_DRAM = 0
TIER_DISK = 1
TIER_NAMES = {TIER_DRAM: "dram", TIER_DISK: "disk"}


def tier_totals(rows: Iterable[tuple[int, int, int, int]]) -> dict[str, dict[str, int]]:
    """Per tier name ("dram", then "disk" when there is one): capacity_bytes, used_bytes,
    objects and segments, from (tier, capacity bytes, used bytes, objects) rows, one a
    segment. The one sum behind ClusterStatus's readers, the status page and /metrics."""
    out: dict[str, dict[str, int]] = {"dram": {"capacity_bytes": 0, "used_bytes": 0,
                                               "objects": 0, "segments": 0}}
    for tier, capacity, used, objects in rows:
        row = out.setdefault(TIER_NAMES.get(tier, "unknown"), {
            "capacity_bytes": 0, "used_bytes": 0, "objects": 0, "segments": 0})
        row["capacity_bytes"] += capacity
        row["used_bytes"] += used
        row["objects"] += objects
        row["segments"] += 1
    return out
