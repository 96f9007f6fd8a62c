"""Tenants and quotas: namespaces, own-LRU eviction, QUOTA_EXCEEDED, bytes given back."""

from __future__ import annotations

import pytest
from test_master_support import FakeClock, MiB, get, make_service, mount, put, put_start

from cellar.errors import ConfigError, Status
from cellar.master.config import MasterConfig, TenantQuota
from cellar.master.service import PutItem, RequestRejected

LONG_LIVED = {"node_suspect_after_s": 1000, "node_expire_after_s": 2000}


def service(**settings):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED, **settings)
    mount(svc, "n1", 1, size=64 * MiB)
    return svc, clock


def test_keys_are_namespaced_per_tenant() -> None:
    svc, _ = service(tenants={"a": {}, "b": {}})
    put(svc, "k", 100, tenant="a", checksum=1)
    assert get(svc, "k", tenant="b").status == Status.NOT_FOUND
    put(svc, "k", 200, tenant="b", checksum=2)
    assert get(svc, "k", tenant="a").checksum == 1
    assert get(svc, "k", tenant="b").checksum == 2
    assert get(svc, "k", tenant="").status == Status.NOT_FOUND
    a, b = (svc.tenant(t).objects["k"].tag for t in ("a", "b"))
    assert a != b  # grants for one tenant's key do not cover another's


def test_default_tenant_is_the_empty_name_and_unlimited() -> None:
    svc, _ = service()
    assert svc.tenant("") is svc.tenant("default")
    assert svc.tenant("").quota_bytes == 0
    put(svc, "k", 100, tenant="default")
    assert get(svc, "k", tenant="").status == Status.OK


def test_over_quota_evicts_own_lru_then_refuses() -> None:
    svc, clock = service(tenants={"small": {"quota_bytes": "3MiB"}, "other": {}})
    put(svc, "theirs", MiB, tenant="other")
    for i in range(3):
        put(svc, f"k{i}", MiB, tenant="small")
        clock.advance(1)
    svc.unpin("small", "reader", [get(svc, "k0", tenant="small").pin_id])  # k0 recently used
    assert svc.put_start("small", "w", [PutItem("k3", MiB)]).results[0].status == Status.OK
    assert set(svc.tenant("small").objects) == {"k0", "k2"}  # its own LRU (k1) went
    assert set(svc.tenant("other").objects) == {"theirs"}  # never another tenant's
    assert svc.tenant("small").used_bytes == 3 * MiB
    # pin everything it has: nothing of its own is evictable -> QUOTA_EXCEEDED
    pins = [get(svc, k, tenant="small").pin_id for k in ("k0", "k2")]
    refused = svc.put_start("small", "w", [PutItem("k4", MiB)]).results[0]
    assert refused.status == Status.QUOTA_EXCEEDED and "small" in refused.message
    # an object bigger than the whole quota is refused outright
    svc.unpin("small", "reader", pins)
    huge = svc.put_start("small", "w", [PutItem("huge", 4 * MiB)]).results[0]
    assert huge.status == Status.QUOTA_EXCEEDED
    assert set(svc.tenant("small").objects) == {"k0", "k2"}


def test_remove_gives_bytes_back() -> None:
    svc, _ = service(tenants={"t": {"quota_bytes": 2 * MiB, "hard_pin": True}})
    put(svc, "a", MiB, tenant="t")
    put(svc, "b", MiB, tenant="t", hard_pin=True)
    assert svc.tenant("t").used_bytes == 2 * MiB
    # "a" is evictable, so a third put evicts it rather than refusing
    assert svc.put_start("t", "w", [PutItem("c", MiB, hard_pin=True)]).results[0].status == Status.OK
    refused = svc.put_start("t", "w", [PutItem("d", MiB)]).results[0]
    assert refused.status == Status.QUOTA_EXCEEDED  # b and c are hard-pinned
    svc.remove("t", ["b"])
    assert svc.tenant("t").used_bytes == MiB
    assert svc.put_start("t", "w", [PutItem("d", MiB)]).results[0].status == Status.OK


def test_object_quota() -> None:
    svc, _ = service(tenants={"t": {"quota_objects": 2, "hard_pin": True}})
    put(svc, "a", 100, tenant="t", hard_pin=True)
    put(svc, "b", 100, tenant="t")
    assert svc.put_start("t", "w", [PutItem("c", 100)]).results[0].status == Status.OK
    assert set(svc.tenant("t").objects) == {"a"}  # b was evicted to make room for c
    assert svc.tenant("t").object_count == 2
    refused = svc.put_start("t", "w", [PutItem("d", 100)]).results[0]
    assert refused.status == Status.QUOTA_EXCEEDED  # c is still WRITING: not evictable


def test_quota_counts_reserved_bytes_of_every_replica() -> None:
    svc, _ = service(tenants={"t": {"quota_bytes": 10 * MiB}})
    mount(svc, "n2", 2)
    put(svc, "k", 1000, tenant="t", replicas=2)
    assert svc.tenant("t").used_bytes == 2 * 1024


def test_quota_change_applies_to_later_puts() -> None:
    svc, _ = service(tenants={"t": {"quota_bytes": "unlimited"}})
    for i in range(4):
        put(svc, f"k{i}", MiB, tenant="t")
    svc.set_tenant_quota("t", TenantQuota(quota_bytes=2 * MiB))
    assert len(svc.tenant("t").objects) == 4  # nothing evicted by the change itself
    assert svc.put_start("t", "w", [PutItem("k4", MiB)]).results[0].status == Status.OK
    assert svc.tenant("t").used_bytes <= 2 * MiB


def test_own_pools_are_built_when_a_quota_is_set_and_dropped_when_it_goes() -> None:
    """A tenant without a quota keeps no eviction pools of its own; setting one builds them from
    its objects (read pins and soft pins included), so quota eviction sees what it should."""
    svc, clock = service(tenants={"t": {"hard_pin": True, "quota_bytes": 0}})
    put(svc, "hard", MiB, tenant="t", hard_pin=True)
    put(svc, "soft", MiB, tenant="t", soft_pin=True)
    put(svc, "old", MiB, tenant="t")
    clock.advance(1)
    put(svc, "pinned", MiB, tenant="t")
    pin = get(svc, "pinned", tenant="t").pin_id
    assert svc.tenant("t").pools is None
    svc.set_tenant_quota("t", TenantQuota(quota_bytes=4 * MiB))
    pools = svc.tenant("t").pools
    assert pools is not None
    assert sorted(o.key for o in pools[1].items) == ["old", "pinned"] and pools[1].pinned == 1
    assert pools[1].held_bytes == 2 * MiB and pools[1].pinned_bytes == MiB
    assert [o.key for o in pools[2].items] == ["soft"]
    # one object over quota: "old" is the only evictable normal one ("pinned" is read-pinned)
    assert svc.put_start("t", "w", [PutItem("new", MiB)]).results[0].status == Status.OK
    assert set(svc.tenant("t").objects) == {"hard", "soft", "pinned"}
    assert [o.key for o in pools[1].items] == ["pinned"]
    svc.unpin("t", "reader", [pin])
    assert pools[1].pinned == 0 and svc.evictor.pools[1].pinned == 0
    svc.set_tenant_quota("t", TenantQuota())
    assert svc.tenant("t").pools is None
    svc.remove("t", ["pinned", "soft"])  # leaving the global pools only: nothing out of sync
    assert svc.evictor.pools[1].items == [] and svc.evictor.pools[2].items == []


def test_unknown_tenant_rejected_unless_allowed() -> None:
    svc, _ = service()
    with pytest.raises(RequestRejected, match="unknown tenant 'x'"):
        svc.put_start("x", "w", [PutItem("k", 1)])
    svc2, _ = service(allow_unknown_tenants=True)
    assert put_start(svc2, "k", 100, tenant="x").status == Status.OK
    with pytest.raises(RequestRejected):
        svc2.exists("bad name!", ["k"])


def test_tenant_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="tenants"):
        MasterConfig(tenants={"a": {"quota_bytes": "lots"}}).validate()
    with pytest.raises(ConfigError, match="tenants"):
        MasterConfig(tenants={"bad name": {}}).validate()
    with pytest.raises(ConfigError, match="tenants"):
        MasterConfig(tenants={"a": {"quota_bytez": 1}}).validate()
    quotas = MasterConfig(tenants={"a": {"quota_bytes": "4GiB", "quota_objects": 10}}).tenant_quotas()
    assert quotas["a"] == TenantQuota(4 << 30, 10)
    assert quotas["default"] == TenantQuota()


def test_a_tenant_nobody_set_a_quota_for_gets_the_default_fraction() -> None:
    """Issue 19, finding 3: a tenant with no quota evicted every other tenant's objects. Now
    it gets default_tenant_quota_fraction of the capacity, following the capacity; unlimited
    is explicit; the unconfigured `default` tenant stays unlimited."""
    svc, _ = service(tenants={"a": {"quota_bytes": "unlimited"}, "b": {}},
                     allow_unknown_tenants=True, default_tenant_quota_fraction=0.25)
    capacity = svc.space.capacity_bytes()
    for i in range(capacity // MiB):  # b puts the whole capacity: it evicts only its own
        put(svc, f"k{i}", MiB, tenant="b")
    b = svc.tenant("b")
    assert b.quota_bytes == capacity // 4 and b.used_bytes <= capacity // 4
    implicit = svc.tenant("new")  # created by its first request
    assert implicit.default_quota and implicit.limited
    assert svc.tenant("a").quota_bytes == 0 and not svc.tenant("a").limited
    assert not svc.tenant("default").limited
    svc.set_tenant_quota("b", TenantQuota(quota_bytes=0))  # explicit unlimited
    assert not svc.tenant("b").limited
    quotas = MasterConfig(tenants={"x": {}, "y": {"quota_bytes": 0},
                                   "z": {"quota_bytes": "unlimited"}}).tenant_quotas()
    assert quotas["x"].default_bytes and not quotas["y"].default_bytes
    assert quotas["z"] == TenantQuota()
    with pytest.raises(ConfigError, match="default_tenant_quota_fraction"):
        MasterConfig(default_tenant_quota_fraction=1.5).validate()



@pytest.mark.parametrize("call", ["exists", "prefix_len", "get_replicas", "unpin", "put_start",
                                  "put_end", "put_revoke", "remove", "lookup"])
def test_a_batch_refused_as_too_large_creates_no_tenant(call: str) -> None:
    """With allow_unknown_tenants a tenant is created by its first request; one refused for
    its batch size must not create it (a refused request changes nothing)."""
    from cellar.master.lookup import lookup
    from cellar.master.service import PutEndItem, PutRef

    svc, _ = service(allow_unknown_tenants=True, max_batch_keys=2)
    keys = ["a", "b", "c"]
    calls = {
        "exists": lambda t: svc.exists(t, keys),
        "prefix_len": lambda t: svc.prefix_len(t, keys),
        "get_replicas": lambda t: svc.get_replicas(t, "c", keys),
        "unpin": lambda t: svc.unpin(t, "c", [1, 2, 3]),
        "put_start": lambda t: svc.put_start(t, "c", [PutItem(k, 1) for k in keys]),
        "put_end": lambda t: svc.put_end(t, "c", [PutEndItem(k, 1, 0, []) for k in keys]),
        "put_revoke": lambda t: svc.put_revoke(t, "c", [PutRef(k, 1) for k in keys]),
        "remove": lambda t: svc.remove(t, keys),
        "lookup": lambda t: lookup(svc, t, keys),
    }
    with pytest.raises(RequestRejected, match="max_batch_keys"):
        calls[call]("newcomer")
    assert "newcomer" not in svc.tenants.by_name
    svc.exists("newcomer", keys[:2])  # within the limit, the first request creates it
    assert "newcomer" in svc.tenants.by_name
