"""The soak's replica locator (devtools/soak/replicas.py) answers over TLS as in plaintext.

Found 2026-12-06: it always opened a plaintext gRPC channel, so under `cellar soak --tls` every
question failed its handshake (the masters logged ~170 refused handshakes a second) and a loss
could never be explained by what happened to the key's nodes. Real master and nodes.
"""

from __future__ import annotations

import pytest

import cellar
from cellar.devtools.local_cluster import LocalCluster
from cellar.devtools.soak.replicas import ReplicaLocator


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_the_locator_names_a_keys_nodes(tls: bool) -> None:
    if tls:
        pytest.importorskip("cryptography")
    with LocalCluster(2, "64MiB", tls=tls) as cluster, \
            cellar.connect(cluster.address, timeout_s=20) as client:
        client.put("located", b"v" * 4096, replicas=2)
        locator = ReplicaLocator(cluster.address)
        try:
            assert locator.nodes_of("located") == ["node-0", "node-1"]
            assert locator.nodes_of("never-put") is None
        finally:
            locator.close()
