"""Tenants: isolated key namespaces, each with a byte and an object quota.

Owns the tenant table. A tenant holds its own key tables (`objects`: COMPLETE and visible,
`writing`: being written) and its own eviction pools, so (tenant, key) is an object's identity
and per-tenant eviction never scans another tenant's keys. `default` always exists and the
empty tenant name means `default`.

Accounting: `used_bytes` is the sum of reserved (rounded) bytes of every replica of the
tenant's visible or being-written objects and `object_count` counts those objects. Bytes held
back in quarantine or by a removed-but-still-pinned object are not charged: the tenant already
gave them up. A quota of 0 means unlimited. This module never evicts; eviction.py does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cellar.master.config import DEFAULT_TENANT, TENANT_NAME, TenantQuota

if TYPE_CHECKING:
    from cellar.master.eviction import Pool
    from cellar.master.objects import Obj

MAX_TENANTS = 10_000  # bound on tenants created implicitly (allow_unknown_tenants)


class Tenant:
    __slots__ = (
        "name", "quota_bytes", "quota_objects", "used_bytes", "object_count", "objects",
        "writing", "pools",
    )

    def __init__(self, name: str, quota: TenantQuota) -> None:
        from cellar.master.eviction import Pool

        self.name = name
        self.quota_bytes = quota.quota_bytes
        self.quota_objects = quota.quota_objects
        self.used_bytes = 0
        self.object_count = 0
        self.objects: dict[str, Obj] = {}  # COMPLETE, visible
        self.writing: dict[str, Obj] = {}  # WRITING (first puts and pending upserts)
        # eviction pools by kind: [unused, normal, soft-pinned]; hard-pinned objects are in none
        self.pools: tuple[Pool, Pool, Pool] = (Pool(False), Pool(False), Pool(False))

    @property
    def limited(self) -> bool:
        return bool(self.quota_bytes or self.quota_objects)


class Tenants:
    """The tenant table; `resolve` is on every request's path, so it is one dict lookup."""

    def __init__(self, quotas: dict[str, TenantQuota], *, allow_unknown: bool) -> None:
        self.allow_unknown = allow_unknown
        self.by_name: dict[str, Tenant] = {}
        for name, quota in quotas.items():
            self.by_name[name] = Tenant(name, quota)
        if DEFAULT_TENANT not in self.by_name:
            self.by_name[DEFAULT_TENANT] = Tenant(DEFAULT_TENANT, TenantQuota())
        self.by_name[""] = self.by_name[DEFAULT_TENANT]

    def resolve(self, name: str) -> Tenant | None:
        """The tenant for a request header's name; None if unknown and not auto-created."""
        tenant = self.by_name.get(name)
        if tenant is not None or not self.allow_unknown:
            return tenant
        if not TENANT_NAME.match(name) or len(self.by_name) > MAX_TENANTS:
            return None
        return self.configure(name, TenantQuota())

    def configure(self, name: str, quota: TenantQuota) -> Tenant:
        """Create a tenant or change its quotas (existing objects stay; later puts evict)."""
        tenant = self.by_name.get(name)
        if tenant is None:
            tenant = Tenant(name, quota)
            self.by_name[name] = tenant
        else:
            tenant.quota_bytes = quota.quota_bytes
            tenant.quota_objects = quota.quota_objects
        return tenant

    def all(self) -> list[Tenant]:
        return sorted((t for n, t in self.by_name.items() if n), key=lambda t: t.name)
