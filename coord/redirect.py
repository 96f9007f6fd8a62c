"""How a master that does not lead points callers at the one that does: written and read here.

A standby (or a leader whose lease lapsed) answers every RPC but ClusterStatus with gRPC
UNAVAILABLE, whose details end in `leader=HOST:PORT` (or `leader=?` when it knows none), and
with the trailing metadata `cellar-leader: HOST:PORT`. The metadata fast line has no trailing
metadata, so callers parse the details; both forms are written by `redirect_details` (and the
master's LEADER_METADATA) and read by `leader_from` only, for the SDK's two faces and the
storage node alike. ClusterStatus is answered (role "standby", leader_address), so
`cellar status` and discovery work against any master.

Invariant: `leader_from` returns "" or a HOST:PORT that parses (at most MAX_ADDRESS_CHARS): a
caller never dials what a peer made up. Must never: import grpc or the etcd library (clients
use this without either loaded; the caller hands over the metadata and details it holds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from cellar.units import parse_host_port

LEADER_METADATA = "cellar-leader"
NO_LEADER = "leader=?"          # how a standby that knows no leader ends its refusal
MAX_ADDRESS_CHARS = 300
_LEADER_IN_DETAILS = re.compile(r"leader=(\S+)$")


def redirect_details(master_id: str, role: str, leader_address: str, leader_epoch: int) -> str:
    where = leader_address or "?"
    return (f"master {master_id} is not the leader ({role}); "
            f"leader epoch {leader_epoch} leader={where}")


def leader_from_details(details: str) -> str:
    """The leader address a redirect's details name, unchecked, or "" (none, or `leader=?`)."""
    match = _LEADER_IN_DETAILS.search(details or "")
    if match is None or match.group(1) == "?":
        return ""
    return match.group(1)


def names_no_leader(details: str) -> bool:
    """Whether a refusal comes from a master that knows no leader (an election is under way)."""
    return (details or "").endswith(NO_LEADER)


def is_refusal(details: str) -> bool:
    """Whether `details` is a redirect at all (named leader or not), as opposed to a master
    that did not answer."""
    return "leader=" in (details or "")


def valid_address(address: str) -> str:
    """`address` when it is a usable HOST:PORT, else "" (never trust a reply's text)."""
    if not address or len(address) > MAX_ADDRESS_CHARS:
        return ""
    try:
        parse_host_port(address)
    except ValueError:
        return ""
    return address


def leader_from(metadata: Iterable[tuple[str, Any]] | None, details: str) -> str:
    """The leader a refusal names: trailing metadata `cellar-leader` first (str or bytes), then
    `leader=HOST:PORT` at the end of the details; "" when neither names a usable address."""
    address = ""
    try:
        for key, value in metadata or ():
            if key == LEADER_METADATA:
                address = value.decode() if isinstance(value, bytes) else str(value)
                break
    except (TypeError, ValueError):
        address = ""
    return valid_address(address) or valid_address(leader_from_details(details))
