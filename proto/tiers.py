"""The values of `SegmentInfo.tier` (cellar.proto), written once for every part.

A segment is DRAM (a node's registered memory) or DISK (the node's disk-tier file,
docs/disk-tier.md). The master places, demotes and promotes by it, the node mounts by it,
the client reads it from a reply's segment table (its status rows and its LATE estimate).
"""

TIER_DRAM = 0
TIER_DISK = 1
TIER_NAMES = {TIER_DRAM: "dram", TIER_DISK: "disk"}
