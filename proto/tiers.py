"""The values of `SegmentInfo.tier` (cellar.proto), written once for every part.

A segment is DRAM (a node's registered memory) or DISK (the node's disk-tier file,
docs/disk-tier.md). The master places, demotes and promotes by it, the node mounts by it,
the client reads it from a reply's segment table (its status rows and its LATE estimate).

The per-tier status rows are built here once, for every face that shows them (the SDK's
`status()["tiers"]`, the master's /api/v1/status and status page, /metrics, `cellar status`
and `cellar top`): `tier_totals` sums the segment rows, `merge_tier_stats` adds the master's
tier counters (ClusterStatus's `tier_stats` and `tier_moves`) to those rows, and
`moves_text` words the disk's moves alike on the page and in the terminal.

One figure of the moves is both sides': the margin a node keeps before a move's deadline
(MOVE_DEADLINE_MARGIN_S), under which the master's `tier_move_timeout_s` cannot work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

TIER_DRAM = 0
TIER_DISK = 1
TIER_NAMES = {TIER_DRAM: "dram", TIER_DISK: "disk"}
# A tier's traffic (TierStats' fields) and the disk tier's moves (TierMoves' fields), in the
# order the status tables print them.
TIER_COUNTERS = ("hits", "read_bytes", "write_bytes")
MOVE_COUNTERS = ("demotions", "promotions", "disk_evictions", "spills")
# A node skips a tier move (proto Move) with less than this left before its master abandons it
# (storage_node/disk_tier.py: it covers the seal after the last deadline check and the rate
# difference of two monotonic clocks). A move may also wait a heartbeat interval before it is
# sent, so the master refuses a `tier_move_timeout_s` under this plus `heartbeat_interval_s`
# (master/config.py): every move, or most, would be skipped.
MOVE_DEADLINE_MARGIN_S = 1.0


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


def merge_tier_stats(totals: Mapping[str, Mapping[str, int]],
                     stats: Iterable[tuple[int, int, int, int]],
                     moves: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """`totals` (from `tier_totals`) with the master's tier counters: each tier's hits,
    read_bytes and write_bytes from `stats`, (tier, hits, read bytes, write bytes) rows
    (0 for a tier with no row), and the disk row with `moves` (demotions, promotions,
    disk_evictions, spills; 0 when missing): every move is the disk tier's doing.

    Only the tiers of `totals` are shown (the tiers mounted now, as the segments say); a
    counted tier with no segment left (its node gone) is left out, as /metrics leaves it out.
    Returns new dicts. A tier's row sets its counters, never adds to them: the master sends
    one row per tier (the counts are its, not a sum over nodes)."""
    out = {name: dict(row) for name, row in totals.items()}
    for row in out.values():
        row.update(dict.fromkeys(TIER_COUNTERS, 0))
    for tier, hits, read_bytes, write_bytes in stats:
        counted = out.get(TIER_NAMES.get(tier, "unknown"))
        if counted is not None:
            counted.update(hits=hits, read_bytes=read_bytes, write_bytes=write_bytes)
    disk = out.get(TIER_NAMES[TIER_DISK])
    if disk is not None:
        disk.update({name: int(moves.get(name, 0)) for name in MOVE_COUNTERS})
    return out


def moves_text(disk: Mapping[str, int]) -> str:
    """The disk row's moves as one line ("disk moves: demotions 3, promotions 1, ..."), as the
    status page, `cellar status` and `cellar top` print it under their tier table."""
    return "disk moves: " + ", ".join(f"{name.replace('_', ' ')} {int(disk.get(name, 0))}"
                                      for name in MOVE_COUNTERS)
