"""Where the master placed each object: the node ids of its replicas, asked with a raw gRPC
stub and an admin token, every pin released at once (a probe must not keep anything alive).

Failure tests use it to tell a lost acknowledged write from an allowed miss: after a node is
killed, a key may read as a miss only if every one of its replicas was on a killed node.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence

import grpc

from cellar.proto import cellar_pb2 as pb
from cellar.proto import cellar_pb2_grpc as pb_grpc

BATCH_KEYS = 512  # under the master's max_batch_keys


def replica_nodes(address: str, admin_token: str, keys: Sequence[str],
                  tenant: str = "default") -> dict[str, frozenset[str]]:
    """key -> node ids of its COMPLETE replicas; keys the master does not serve are absent."""
    header = pb.RequestHeader(tenant=tenant, client_id="placement-probe", token=admin_token)
    out: dict[str, frozenset[str]] = {}
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.MasterStub(channel)
        for start in range(0, len(keys), BATCH_KEYS):
            batch = list(keys[start:start + BATCH_KEYS])
            reply = stub.GetReplicas(pb.GetReplicasRequest(header=header, keys=batch))
            pins = [r.pin_id for r in reply.results if r.pin_id]
            if pins:
                stub.Unpin(pb.UnpinRequest(header=header, pin_ids=pins))
            for key, result in zip(batch, reply.results, strict=True):
                if result.status == pb.OK:
                    out[key] = frozenset(r.node_id for r in result.replicas)
    return out


def allowed_misses(placed: dict[str, frozenset[str]], killed: set[str]) -> set[str]:
    """The keys that may read as a miss: every replica was on a killed node."""
    return {key for key, nodes in placed.items() if nodes and nodes <= killed}


def evicted_keys(http_url: str) -> float:
    """The master's `master_evicted_key_count`: a test that calls every miss a loss checks that
    nothing was evicted (an evicted key is a legitimate miss)."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("master_evicted_key_count "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the master exports no master_evicted_key_count")
