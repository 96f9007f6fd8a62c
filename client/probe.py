"""One master's own answer, not followed anywhere: `probe_master` (`cellar status --master`,
the Mooncake adapter's health check).

What it owns
    Asking one master "host:port" for its ClusterStatus over the sync gRPC line, with no
    redirect followed and no fast line: its role ("leader", "standby", "single"), epoch and
    leader address, whatever the rest of the cluster says. A `Client` follows the leader; this
    is how a tool asks a given master about itself.

What it must never do
    Follow a redirect, ask etcd, or keep a connection past the call.
"""

from __future__ import annotations

import time
from typing import Any

from cellar.client.checks import resolve_token, validate_tenant, validate_timeout
from cellar.client.connect_args import client_id, parse_master_address
from cellar.client.rpc import MasterChannel
from cellar.errors import InvalidArgument
from cellar.proto import cellar_pb2 as pb

__all__ = ["probe_master"]


def probe_master(address: str, *, tenant: str = "default", token: str | None = None,
                 timeout_s: float = 5.0) -> dict[str, Any]:
    """One master's own ClusterStatus, not following any redirect: its role ("leader",
    "standby", "single"), epoch and leader_address, plus (when it serves) the summary
    `Client.status` gives. `address` is "host:port"; `cellar.Unavailable` if it is down."""
    from cellar.client.session_state import status_to_dict

    if parse_master_address(address) is not None:
        raise InvalidArgument(f"probe_master takes one master's 'host:port', not {address!r}")
    timeout_s = validate_timeout(timeout_s)
    header = pb.RequestHeader(tenant=validate_tenant(tenant), client_id=client_id(),
                              token=resolve_token(address, token))
    channel = MasterChannel(address, fast=False, follow=False)
    try:
        reply = channel.call("ClusterStatus", pb.ClusterStatusRequest(header=header),
                             time.monotonic() + timeout_s)
    finally:
        channel.close()
    return status_to_dict(reply)
