"""What the put-ahead tests read of a client and a master: the client's held allocations
(client/put_ahead.py) and how many calls of an RPC the master served (its /metrics)."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

from cellar.client.put_ahead import PutAheadPool
from cellar.devtools.local_cluster import LocalCluster
from tests.support.faces import AsyncFace


def pool(client: Any) -> PutAheadPool:
    """The put-ahead allocations `client` (either face) holds."""
    inner = client.client if isinstance(client, AsyncFace) else client
    found = inner._s.aheads
    assert found is not None, "putting ahead is on by default"
    return found


def rpc_count(cluster: LocalCluster, rpc: str) -> int:
    """Calls of `rpc` the cluster's master has answered (master_rpc_latency_seconds_count)."""
    text = urllib.request.urlopen(cluster.http_url + "/metrics", timeout=10).read().decode()
    match = re.search(rf'^master_rpc_latency_seconds_count{{rpc="{rpc}"}} ([0-9.e+]+)$', text,
                      re.MULTILINE)
    return int(float(match.group(1))) if match else 0
