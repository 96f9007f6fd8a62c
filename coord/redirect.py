"""How a master that does not lead points callers at the one that does.

A standby (or a leader whose lease lapsed) answers every RPC but ClusterStatus with gRPC
UNAVAILABLE, whose details end in `leader=HOST:PORT` (or `leader=?` when it knows none), and
with the trailing metadata `cellar-leader: HOST:PORT`. The metadata fast line has no trailing
metadata, so callers parse the details; both forms come from here. ClusterStatus is answered
(role "standby", leader_address), so `cellar status` and discovery work against any master.
No etcd import: clients use this without the etcd library loaded.
"""

from __future__ import annotations

import re

LEADER_METADATA = "cellar-leader"
_LEADER_IN_DETAILS = re.compile(r"leader=(\S+)$")


def redirect_details(master_id: str, role: str, leader_address: str, leader_epoch: int) -> str:
    where = leader_address or "?"
    return (f"master {master_id} is not the leader ({role}); "
            f"leader epoch {leader_epoch} leader={where}")


def leader_from_details(details: str) -> str:
    """The leader address a redirect names, or "" (not a redirect, or no leader known)."""
    match = _LEADER_IN_DETAILS.search(details or "")
    if match is None or match.group(1) == "?":
        return ""
    return match.group(1)
