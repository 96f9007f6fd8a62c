"""Eviction: which object to drop when memory or a tenant's quota runs short.

The policy
    By bytes, approximate LRU on last access. An object's `last_access` is the monotonic time of
    its PutEnd or of the last GetReplicas that returned it; Exists and PrefixLen never touch it
    (a probe must not keep an object alive). Eviction runs
    - in the background when used/capacity goes above the high watermark (0.90), down to the low
      watermark (0.85), at most `max_evictions_per_tick` objects per tick;
    - synchronously inside PutStart when no segment has room, at most `max_evictions_per_put`
      objects per key, so a writer is refused NO_SPACE only when nothing was evictable;
    - per tenant, inside PutStart, when the tenant would go over its quota: only that tenant's
      own objects, and QUOTA_EXCEEDED only when none of them is evictable.

Why approximate (like Redis's evict.c)
    An exact LRU needs a linked list touched on every read; in CPython an OrderedDict entry costs
    ~100 bytes and a move_to_end per read. Instead every evictable object sits in a flat list
    (a "pool", records.Pool), knows its index, and leaves it by swap-with-last: O(1) with one pointer per object.
    To pick a victim we sample `eviction_samples` (16) random entries and take the one accessed
    longest ago. Like Redis's sampling, the victim is almost always among the oldest few percent,
    which is what an LRU cache needs; a pool no larger than the sample is scanned exactly, so small
    caches (and the unit tests) get exact LRU order. A touch is one attribute store.

What it skips
    - read-pinned objects (a reader holds a pin from GetReplicas until Unpin or the pin TTL): they
      stay in the pool, are skipped when sampled, and each pool counts them so "nothing evictable"
      is known without scanning;
    - hard-pinned objects are never in a pool: they are never evicted (they count against quota);
    - soft-pinned objects live in a second pool that is only sampled when the first has nothing
      evictable (the "second pass").
    WRITING objects are never in a pool; they are dropped by revoke or by the writer timeout.

What it never does: free ranges itself (it calls the object table's `drop`, which knows about
pins and quarantine) or look at payload bytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from cellar.master.state.records import Obj, Pool, Tenant

NORMAL = 1  # pool kinds (index into the pools tuples); 0 = not in any pool
SOFT = 2
_SAMPLE_ROUNDS = 4


class Evictor:
    """Owns the global pools, picks victims and runs the eviction loops."""

    def __init__(self, samples: int, drop: Callable[[Obj], int], rng: random.Random) -> None:
        self.samples = samples
        self._drop = drop  # ObjectTable.drop bound to "now": returns bytes freed at once
        self._random = rng.random
        self.pools: tuple[Pool, Pool, Pool] = (Pool(True), Pool(True), Pool(True))
        self.evicted_keys = 0
        self.evicted_bytes = 0
        self.attempts = 0  # eviction runs started (watermark ticks, PutStart, quota)
        self.successes = 0  # eviction runs that evicted at least one object

    # ---------------------------------------------------------------- pool membership

    def enter(self, obj: Obj) -> None:
        """A COMPLETE, visible, not hard-pinned object becomes evictable."""
        kind = SOFT if obj.pin_kind == SOFT else NORMAL
        obj.pool_kind = kind
        self.pools[kind].add(obj)
        own = obj.tenant.pools  # None for a tenant without a quota (cellar.master.state.tenants)
        if own is not None:
            own[kind].add(obj)
        if obj.pins:
            self._count_pinned(obj, kind, 1)

    def leave(self, obj: Obj) -> None:
        kind = obj.pool_kind
        if not kind:
            return
        obj.pool_kind = 0
        self.pools[kind].remove(obj)
        own = obj.tenant.pools
        if own is not None:
            own[kind].remove(obj)
        if obj.pins:
            self._count_pinned(obj, kind, -1)

    def on_first_pin(self, obj: Obj) -> None:
        if obj.pool_kind:
            self._count_pinned(obj, obj.pool_kind, 1)

    def on_last_unpin(self, obj: Obj) -> None:
        if obj.pool_kind:
            self._count_pinned(obj, obj.pool_kind, -1)

    def _count_pinned(self, obj: Obj, kind: int, delta: int) -> None:
        """Pinned members of the global pool of `kind` and of the tenant's own, if it has one."""
        held = delta * obj.reserved * len(obj.replicas)
        pool = self.pools[kind]
        pool.pinned += delta
        pool.pinned_bytes += held
        own = obj.tenant.pools
        if own is not None:
            own[kind].pinned += delta
            own[kind].pinned_bytes += held

    def resize(self, obj: Obj, replicas_delta: int) -> None:
        """The object is about to gain (or lose) replicas while it may sit in a pool: keep
        the pools' byte sums exact (called before `obj.replicas` changes)."""
        kind = obj.pool_kind
        if not kind or not replicas_delta:
            return
        held = replicas_delta * obj.reserved
        pinned = held if obj.pins else 0
        pools = [self.pools[kind]]
        if obj.tenant.pools is not None:
            pools.append(obj.tenant.pools[kind])
        for pool in pools:
            pool.held_bytes += held
            pool.pinned_bytes += pinned

    def evictable_bytes(self, tenant: Tenant | None = None) -> int:
        """Bytes eviction could free at most (of `tenant` only, if given); pinned ones excluded."""
        pools = self.pools if tenant is None else tenant.pools
        if pools is None:
            return 0
        return pools[NORMAL].evictable_bytes() + pools[SOFT].evictable_bytes()

    # ---------------------------------------------------------------- victims

    def _sample(self, pool: Pool, useful: Callable[[Obj], bool] | None = None) -> Obj | None:
        """The least recently accessed unpinned object among a random sample (None if none);
        with `useful`, only among those it accepts, and None when the sample holds none."""
        if pool.evictable() <= 0:
            return None
        items = pool.items
        count = len(items)
        best: Obj | None = None
        if count <= self.samples:
            for obj in items:
                if (not obj.pins and (best is None or obj.last_access < best.last_access)
                        and (useful is None or useful(obj))):
                    best = obj
            return best
        rand = self._random
        for _ in range(_SAMPLE_ROUNDS):
            for _ in range(self.samples):
                obj = items[int(rand() * count)]
                if (not obj.pins and (best is None or obj.last_access < best.last_access)
                        and (useful is None or useful(obj))):
                    best = obj
            if best is not None:
                return best
        if useful is not None:
            return None  # no scan of the whole pool for a rare victim: the put stops here
        # Almost everything sampled was pinned; the pool counts say something is not: find it.
        for obj in items:
            if not obj.pins:
                return obj
        raise AssertionError("eviction pool pinned count out of sync")

    def victim(self, tenant: Tenant | None = None,
               useful: Callable[[Obj], bool] | None = None) -> Obj | None:
        """Next object to evict: normal pool first, soft-pinned only when it has none (with
        `useful`, a sample that found no useful normal object is no proof that none is left,
        so a soft-pinned one is not taken then either)."""
        pools = self.pools if tenant is None else tenant.pools
        if pools is None:
            return None  # a tenant without a quota is never evicted on its own account
        victim = self._sample(pools[NORMAL], useful)
        if victim is None and (useful is None or pools[NORMAL].evictable() <= 0):
            victim = self._sample(pools[SOFT], useful)
        return victim

    def evict_one(self, tenant: Tenant | None = None,
                  useful: Callable[[Obj], bool] | None = None) -> int:
        """Evict one object (of `tenant` if given; one `useful` accepts, if given); bytes it
        held, or -1 if nothing evictable (or nothing useful was found)."""
        victim = self.victim(tenant, useful)
        if victim is None:
            return -1
        held = victim.reserved * len(victim.replicas)
        self._drop(victim)
        self.evicted_keys += 1
        self.evicted_bytes += held
        return held

    def evict_to_watermark(self, used_bytes: int, low_bytes: int, limit: int) -> tuple[int, bool]:
        """Evict until used <= low or `limit` objects; returns (evicted, reached_low)."""
        self.attempts += 1
        evicted = 0
        while used_bytes > low_bytes:
            if evicted >= limit:
                return evicted, False
            held = self.evict_one()
            if held < 0:
                return evicted, True  # nothing evictable: stop trying until the next crossing
            used_bytes -= held
            evicted += 1
            if evicted == 1:
                self.successes += 1
        return evicted, True
