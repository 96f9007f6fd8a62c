"""Finding: 35,000 tenant creations pushed the ClusterStatus reply past the 4 MiB message limit,
and then every new `cellar.connect` (which starts with ClusterStatus) failed.

The number of tenants is bounded (`max_tenants`: configured, admin-created and implicit
together; one more is QuotaExceeded and changes nothing), and ClusterStatus lists at most
`max_status_tenants` of them, the caller's own first, whatever their number. A smaller bound
keeps the test fast; the reply size is checked against the real servicer's reply message.
"""

from __future__ import annotations

import pytest

from cellar.errors import ConfigError, QuotaExceeded
from cellar.master.config import MasterConfig, TenantQuota
from cellar.master.serving.auth import Authorizer
from cellar.master.serving.leadership import Leadership
from cellar.master.serving.metrics import RpcStats
from cellar.master.serving.servicer import MasterServicer
from cellar.proto import cellar_pb2 as pb
from cellar.tokens import TokenStore

SECRET = bytes(range(32))
LONG_NAME = "t" * 100  # long names made the old reply grow fastest


def _servicer(**settings: object) -> MasterServicer:
    config = MasterConfig(**settings)  # type: ignore[arg-type]
    config.validate()
    # the bodies are called directly, behind no Authorizer check (cellar.master.serving.auth)
    return MasterServicer(Leadership(config, SECRET, ha=False), Authorizer(TokenStore(None), SECRET))


def _status(servicer: MasterServicer, tenant: str = "") -> pb.ClusterStatusReply:
    request = pb.ClusterStatusRequest(header=pb.RequestHeader(tenant=tenant))
    return servicer.ClusterStatus(request, RpcStats())


def test_tenant_flood_is_bounded_and_cluster_status_stays_small() -> None:
    servicer = _servicer(max_tenants=1000, max_status_tenants=16)
    service = servicer.service
    created = refused = 0
    for i in range(35_000):
        try:
            service.set_tenant_quota(f"{LONG_NAME}{i:05d}", TenantQuota(quota_bytes=1 << 30))
            created += 1
        except QuotaExceeded:
            refused += 1
    assert created == 999 and refused == 35_000 - 999  # "default" is the 1000th
    assert service.tenants.count == 1000
    reply = _status(servicer, f"{LONG_NAME}00500")
    size = reply.ByteSize()
    print(f"\n{created} tenants created, {refused} refused; ClusterStatus {size} bytes, "
          f"{len(reply.tenants)} tenants listed")
    assert len(reply.tenants) == 16
    assert reply.tenants[0].name == f"{LONG_NAME}00500"  # the caller's own first
    assert size < 16 << 10
    # an existing tenant's quota can still change at the bound
    assert service.set_tenant_quota("default", TenantQuota(quota_bytes=5)).quota_bytes == 5


def test_implicit_tenants_are_bounded_too() -> None:
    servicer = _servicer(max_tenants=10, allow_unknown_tenants=True)
    service = servicer.service
    names = [f"auto{i}" for i in range(50)]
    resolved = [service.tenants.resolve(name) for name in names]
    assert sum(t is not None for t in resolved) == 9
    assert service.tenants.count == 10
    with pytest.raises(QuotaExceeded):
        service.set_tenant_quota("one-more", TenantQuota())
    assert "one-more" not in service.tenants.by_name


def test_configured_tenants_over_the_bound_stop_the_start() -> None:
    with pytest.raises(ConfigError, match="max_tenants"):
        MasterConfig(max_tenants=3, tenants={f"t{i}": {} for i in range(3)}).validate()


def test_listing_without_a_known_caller_is_bounded_and_sorted() -> None:
    servicer = _servicer(max_status_tenants=4, tenants={f"z{i}": {} for i in range(9)})
    names = [t.name for t in _status(servicer, "nobody").tenants]
    assert names == sorted(names) and len(names) == 4
