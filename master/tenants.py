"""Tenants: isolated key namespaces, each with a byte and an object quota.

Owns the tenant table. A tenant holds its own key tables (`objects`: COMPLETE and visible,
`writing`: being written) and, while it has a quota, its own eviction pools, so (tenant, key) is
an object's identity and per-tenant eviction never scans another tenant's keys. A tenant
without a quota is only ever evicted from the global pools, so it keeps no pools of its own
(a pool slot costs ~40 bytes and a list append per object); they are built from its objects
when a quota is set. `default` always exists and the
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
        self.name = name
        self.used_bytes = 0
        self.object_count = 0
        self.objects: dict[str, Obj] = {}  # COMPLETE, visible
        self.writing: dict[str, Obj] = {}  # WRITING (first puts and pending upserts)
        # eviction pools by kind: [unused, normal, soft-pinned]; hard-pinned objects are in none.
        # None while the tenant has no quota (module docstring).
        self.pools: tuple[Pool, Pool, Pool] | None = None
        self.set_quota(quota)

    @property
    def limited(self) -> bool:
        return bool(self.quota_bytes or self.quota_objects)

    def set_quota(self, quota: TenantQuota) -> None:
        """Change the quotas; keep own eviction pools exactly while there is a quota."""
        self.quota_bytes = quota.quota_bytes
        self.quota_objects = quota.quota_objects
        if not self.limited:
            self.pools = None
        elif self.pools is None:
            self.pools = self._build_pools()

    def _build_pools(self) -> tuple[Pool, Pool, Pool]:
        """Own pools holding what the global pools hold of this tenant (every evictable object
        is visible, so in `objects`), pinned counts included."""
        from cellar.master.eviction import Pool

        pools = (Pool(False), Pool(False), Pool(False))
        for obj in self.objects.values():
            kind = obj.pool_kind
            if kind:
                pools[kind].add(obj)
                if obj.pins:
                    pools[kind].pinned += 1
        return pools


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
            tenant.set_quota(quota)
        return tenant

    def all(self) -> list[Tenant]:
        return sorted((t for n, t in self.by_name.items() if n), key=lambda t: t.name)
