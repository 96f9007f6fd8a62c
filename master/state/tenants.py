"""Tenants: isolated key namespaces, each with its quotas and rights.

Owns the tenant table (the `Tenant` record is in records.py). A tenant holds its own key tables
(`objects`: COMPLETE and visible, `writing`: being written) and, while it has a quota, its own
eviction pools, so (tenant, key) is an object's identity and per-tenant eviction never scans
another tenant's keys. A tenant without a quota is only ever evicted from the global pools, so
it keeps no pools of its own (a pool slot costs ~40 bytes and a list append per object); they
are built from its objects when a quota is set. `default` always exists and the empty tenant
name means `default`.

Accounting: `used_bytes` is the sum of reserved (rounded) bytes of every replica of the
tenant's visible or being-written objects and `object_count` counts those objects; of those
bytes, `writing_bytes` are held by puts not yet ended (WRITING) and `hard_pinned_bytes` by
hard-pinned objects (both charged by `cellar.master.state.objects.charge`). Bytes held back in
quarantine or by a removed-but-still-pinned object are not in `used_bytes`; a revoked put's
ranges in quarantine are in `quarantined_bytes`, which quota.py counts against the tenant's
WRITING cap and byte quota (its grants can still write them). A quota of 0 means unlimited; `hard_pin` is a right (TenantQuota), off by default.

Default quota (issue 19, finding 3): a tenant whose byte quota nobody set (created by the admin
API without `quota_bytes`, configured without one, or created implicitly) gets
`default_quota_fraction` of the cluster's capacity, following the capacity as nodes come and
go (`follow_capacity`, called by every PutStart of the tenant), so one tenant alone cannot
evict every other tenant's objects. Unlimited is explicit (`quota_bytes: 0` or "unlimited").
The `default` tenant is unlimited unless given a `quota_bytes`: it is the one tenant of a
cluster without tenants, and the whole cache is its own.

Bound: at most `max_tenants` tenants exist (configured, admin-created or implicit), so the
table and every listing of it stay bounded; `listing` gives a bounded page for ClusterStatus.
This module never evicts; eviction.py does.
"""

from __future__ import annotations

import heapq
import re

from cellar.errors import QuotaExceeded
from cellar.master.state.records import Tenant, TenantQuota

DEFAULT_TENANT = "default"
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DEFAULT_MAX_TENANTS = 10_000


class Tenants:
    """The tenant table; `resolve` is on every request's path, so it is one dict lookup."""

    def __init__(
        self, quotas: dict[str, TenantQuota], *, allow_unknown: bool,
        max_tenants: int = DEFAULT_MAX_TENANTS, default_quota_fraction: float = 0.0,
    ) -> None:
        assert 0.0 <= default_quota_fraction <= 1.0, default_quota_fraction
        self.default_quota_fraction = default_quota_fraction
        self.allow_unknown = allow_unknown
        self.max_tenants = max_tenants
        self.count = 0  # tenants (the "" alias of default is not one)
        self.by_name: dict[str, Tenant] = {}
        for name, quota in quotas.items():
            self.by_name[name] = Tenant(name, quota)
        if DEFAULT_TENANT not in self.by_name:
            self.by_name[DEFAULT_TENANT] = Tenant(DEFAULT_TENANT, TenantQuota())
        self.count = len(self.by_name)
        assert self.count <= max_tenants, "MasterConfig.validate bounds the configured tenants"
        self.by_name[""] = self.by_name[DEFAULT_TENANT]

    def resolve(self, name: str) -> Tenant | None:
        """The tenant for a request header's name; None if unknown and not auto-created."""
        tenant = self.by_name.get(name)
        if tenant is not None or not self.allow_unknown:
            return tenant
        if not TENANT_NAME.match(name) or self.count >= self.max_tenants:
            return None
        return self.configure(name, self.new_quota())

    def new_quota(self) -> TenantQuota:
        """The quotas of a tenant nobody set any for: the default byte quota (if one is set)."""
        return TenantQuota(default_bytes=self.default_quota_fraction > 0)

    def follow_capacity(self, tenant: Tenant, capacity_bytes: int) -> None:
        """A default-quota tenant's `quota_bytes` as the fraction of `capacity_bytes` (at
        least 1 byte: 0 would mean unlimited; left as it is while there is no capacity, when
        nothing can be placed anyway); O(1), pools built the first time."""
        if not tenant.default_quota:
            return
        if not self.default_quota_fraction:  # the setting was switched off: unlimited
            tenant.default_quota = False
            tenant.quota_bytes = 0
        elif capacity_bytes > 0:  # no capacity yet: nothing can be placed, nothing to bound
            tenant.quota_bytes = max(1, int(capacity_bytes * self.default_quota_fraction))
        if tenant.pools is None and tenant.limited:
            tenant.set_quota(TenantQuota(tenant.quota_bytes, tenant.quota_objects,
                                         tenant.quota_writing_bytes, tenant.may_hard_pin,
                                         tenant.quota_hard_pin_bytes, tenant.default_quota))

    def check_room(self, name: str) -> None:
        """QuotaExceeded if `configure(name, ...)` would create one more than `max_tenants`."""
        if name not in self.by_name and self.count >= self.max_tenants:
            raise QuotaExceeded(f"max_tenants ({self.max_tenants}) tenants exist; "
                                f"tenant {name!r} is not created")

    def configure(self, name: str, quota: TenantQuota) -> Tenant:
        """Create a tenant or change its quotas (existing objects stay; later puts evict).

        QuotaExceeded when creating one more than `max_tenants`; nothing changes then."""
        tenant = self.by_name.get(name)
        if tenant is None:
            self.check_room(name)
            tenant = Tenant(name, quota)
            self.by_name[name] = tenant
            self.count += 1
        else:
            tenant.set_quota(quota)
        return tenant

    def all(self) -> list[Tenant]:
        return sorted((t for n, t in self.by_name.items() if n), key=lambda t: t.name)

    def listing(self, first: str, limit: int) -> list[Tenant]:
        """At most `limit` tenants: `first` (the caller's, if it exists), then others by name.

        O(tenants) (a bounded heap, not a sort), bounded by max_tenants; the reply it feeds
        stays bounded whatever their number."""
        assert limit >= 1
        head = self.by_name.get(first)
        rest = (t for n, t in self.by_name.items() if n and t is not head)
        if head is None:
            return heapq.nsmallest(limit, rest, key=_name)
        return [head, *heapq.nsmallest(limit - 1, rest, key=_name)]


def _name(tenant: Tenant) -> str:
    return tenant.name
