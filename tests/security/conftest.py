"""Fixtures of the security tests: real clusters on loopback (cellar.devtools.local_cluster), attacked
through the public SDK and through bare gRPC stubs that send exactly what an attacker would.

`cluster` is one `SecurityCluster` per module (2 nodes of 64 MiB) with tenants `alice` and
`bob` and a token for each (`cluster.alice`, `cluster.bob`); `stub` is a bare MasterStub on it.
Helpers live in identity_kit.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from identity_kit import SecurityCluster, running

from cellar.proto import cellar_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def cluster() -> Iterator[SecurityCluster]:
    with running(SecurityCluster(2, "64MiB")) as c:
        c.alice = c.token_for("alice", unlimited=False)  # no quota set: the default quota
        c.bob = c.token_for("bob", unlimited=False)
        yield c


@pytest.fixture(scope="module")
def stub(cluster: SecurityCluster) -> Iterator[Any]:
    with grpc.insecure_channel(cluster.address) as channel:
        yield pb_grpc.MasterStub(channel)
