"""Put-ahead allocations (master/put_ahead.py): granted where the puts they stand for would be
placed (evicting for room as they would, never for want of nodes), bound to a key at PutEnd only when the node's receipt names the key and the allocation is newer
than the key's last version and removal, and than a version of it the master evicted or lost
while the allocation was held (state/ahead_drops.py, bounded); everything refused is dropped,
nothing stored."""

from __future__ import annotations

from typing import Any

from test_master_support import SECRET, Entry, FakeClock, make_service, mount, segment_info

from cellar.errors import Status
from cellar.master.config import TenantQuota
from cellar.master.requests import PutAheadAsk
from cellar.master.service import MasterService, PutEndItem, PutItem, PutRef
from cellar.master.state.ahead_drops import AheadDrops
from cellar.proto.grant import any_key_tag, key_tag
from tests.support.receipts import receipts_for

KiB = 1024
MiB = 1024 * KiB
T = "default"
OK = Status.OK


def service(**settings) -> MasterService:  # type: ignore[no-untyped-def]
    svc = make_service(FakeClock(), seed=3, **settings)
    mount(svc, "n1", 1, size=8 * MiB)
    return svc


def ahead(svc: MasterService, count: int, size: int = 64 * KiB, replicas: int = 0) -> list:  # type: ignore[type-arg]
    return svc.put_ahead(T, PutAheadAsk(count, size, replicas)).ahead


def bind(svc: MasterService, started, key: str, *, size: int = 64 * KiB,  # type: ignore[no-untyped-def]
         checksum: int = 7, stored_key: str | None = None, **flags) -> tuple[int, str]:
    tag = key_tag(T, key if stored_key is None else stored_key)
    item = PutEndItem(key, started.put_id, checksum, receipts_for(SECRET, started, checksum, tag),
                      bind=PutItem(key="", size_bytes=size, **flags))
    return svc.put_end(T, "c", [item])[0]


def used(svc: MasterService) -> int:
    return sum(s.allocator.used_bytes for s in svc.membership.segments.values())


def test_granted_allocations_name_no_key_and_a_put_end_binds_one() -> None:
    svc = service()
    granted = ahead(svc, 3)
    assert len(granted) == 3 and all(r.status == Status.OK for r in granted)
    assert {g.key_tag for r in granted for g in r.replicas} == {any_key_tag(T)}
    tenant = svc.tenant(T)
    assert not tenant.objects and len(tenant.writing) == 3  # placeholders, invisible to probes
    assert svc.exists(T, ["k"]) == [Status.NOT_FOUND]
    assert bind(svc, granted[0], "k") == (Status.OK, "")
    assert svc.exists(T, ["k"]) == [Status.OK]
    got = svc.get_replicas(T, "c", ["k"]).results[0]
    assert got.status == Status.OK and got.checksum == 7
    assert got.replicas[0].alloc_id == granted[0].replicas[0].alloc_id
    assert got.replicas[0].key_tag == key_tag(T, "k")  # reads name the real key
    assert svc.aheads.bound == 1 and len(tenant.writing) == 2


def test_a_receipt_for_another_key_is_refused_and_stores_nothing() -> None:
    svc = service()
    started = ahead(svc, 1)[0]
    status, message = bind(svc, started, "k", stored_key="other")
    assert status == Status.PERMISSION_DENIED and "receipt" in message
    assert svc.exists(T, ["k", "other"]) == [Status.NOT_FOUND, Status.NOT_FOUND]
    assert not svc.tenant(T).writing and svc.aheads.refused == 1


def test_the_placeholder_key_cannot_be_completed_under_its_own_name() -> None:
    """A writer that names the allocation's placeholder key (and the tenant's any-key "\\0" on
    its write, so the receipt's tag is the grant's) still goes through binding: refused."""
    svc = service()
    started = ahead(svc, 1)[0]
    placeholder = next(iter(svc.tenant(T).writing))
    assert placeholder.startswith("\0")
    status, message = bind(svc, started, placeholder, stored_key="\0")
    assert status == Status.INVALID and "NUL" in message
    assert not svc.tenant(T).objects and not svc.tenant(T).writing


def test_bind_fields_must_fit_the_allocation() -> None:
    svc = service()
    for flags, expect in ((dict(size=32 * KiB), "size_bytes"),
                          (dict(hard_pin=True), "hard-pinned"),
                          (dict(replicas=2), "replicas")):
        started = ahead(svc, 1)[0]
        status, message = bind(svc, started, "k", **flags)
        assert status == Status.INVALID and expect in message, (flags, message)
    started = ahead(svc, 1)[0]
    item = PutEndItem("k", started.put_id, 7, receipts_for(SECRET, started, 7, key_tag(T, "k")))
    assert svc.put_end(T, "c", [item])[0][0] == Status.INVALID  # no bind fields at all
    assert svc.exists(T, ["k"]) == [Status.NOT_FOUND] and not svc.tenant(T).writing


def test_existing_key_without_upsert_is_already_exists() -> None:
    svc = service()
    first, second = ahead(svc, 2)
    assert bind(svc, first, "k", checksum=1)[0] == Status.OK
    assert bind(svc, second, "k", checksum=2)[0] == Status.ALREADY_EXISTS
    assert svc.get_replicas(T, "c", ["k"]).results[0].checksum == 1


def test_an_allocation_older_than_the_keys_version_or_removal_is_refused() -> None:
    svc = service()
    old_for_upsert, old_for_remove, fresh = ahead(svc, 3)
    # The key written after the allocations were granted: binding the older allocation as an
    # upsert would let a rebuild from the nodes bring the replaced value back.
    started = svc.put_start(T, "c", [PutItem("k", 64 * KiB)]).results[0]
    assert svc.put_end(T, "c", [PutEndItem("k", started.put_id, 5,
                                           receipts_for(SECRET, started, 5))])[0][0] == Status.OK
    status, message = bind(svc, old_for_upsert, "k", checksum=6, upsert=True)
    assert status == Status.EXPIRED and "older" in message
    assert svc.get_replicas(T, "c", ["k"]).results[0].checksum == 5
    # A removal acknowledged after the grant kills every older allocation of the key.
    assert svc.remove(T, ["k"]) == [(Status.OK, "")]
    assert bind(svc, old_for_remove, "k", checksum=6)[0] == Status.EXPIRED
    assert svc.exists(T, ["k"]) == [Status.NOT_FOUND]
    # A fresh allocation, granted after both: it binds, and its upsert kills older versions.
    newer = ahead(svc, 1)[0]
    assert bind(svc, newer, "k", checksum=8)[0] == Status.OK
    assert bind(svc, ahead(svc, 1)[0], "k", checksum=9, upsert=True)[0] == Status.OK
    assert svc.get_replicas(T, "c", ["k"]).results[0].checksum == 9
    assert svc.tombstones.removed_alloc_id(T, "k") >= newer.replicas[0].alloc_id
    assert fresh.put_id in svc.objects.puts  # untouched


def test_grants_leave_half_the_writing_cap_and_respect_quotas() -> None:
    capped = service(max_tenant_writing_fraction=0.25)  # cap 2 MiB: half is 1 MiB
    assert len(ahead(capped, 64, size=512 * KiB)) == 2
    svc = service()
    svc.set_tenant_quota(T, TenantQuota(quota_bytes=2 * MiB))
    started = svc.put_start(T, "c", [PutItem("s", MiB)]).results[0]
    svc.put_end(T, "c", [PutEndItem("s", started.put_id, 1, receipts_for(SECRET, started, 1))])
    # Placed as puts would be: within the quota, evicting the tenant's own object for room.
    granted = ahead(svc, 64, size=MiB)
    assert len(granted) == 2 and svc.exists(T, ["s"]) == [Status.NOT_FOUND]
    assert svc.tenant(T).used_bytes <= 2 * MiB


def test_an_ask_for_more_replicas_than_live_nodes_grants_and_evicts_nothing() -> None:
    svc = service(allow_unknown_tenants=True)
    svc.set_tenant_quota(T, TenantQuota(quota_bytes=2 * MiB))  # quota room would evict too
    for i in range(8):  # n1 full: 2 MiB under the quota, the rest of another tenant
        tenant = T if i < 2 else "other"
        started = svc.put_start(tenant, "c", [PutItem(f"s{i}", MiB)]).results[0]
        svc.put_end(tenant, "c", [PutEndItem(f"s{i}", started.put_id, 1,
                                             receipts_for(SECRET, started, 1))])
    stored = {name: set(svc.tenant(name).objects) for name in (T, "other")}
    evicted = svc.evictor.evicted_keys
    assert ahead(svc, 4, size=MiB, replicas=2) == []  # one live node: no second replica
    assert svc.evictor.evicted_keys == evicted
    assert {name: set(svc.tenant(name).objects) for name in (T, "other")} == stored
    assert len(stored[T]) == 2 and stored["other"]


def test_limits_quota_tenants_and_zero() -> None:
    assert len(ahead(service(max_put_ahead_keys=5), 64)) == 5
    assert ahead(service(max_put_ahead_keys=0), 64) == []
    svc = service()
    assert ahead(svc, 4, size=0) == [] and ahead(svc, 4, size=64 * MiB) == []
    assert ahead(svc, 4, replicas=9) == []


def test_unused_allocations_expire_and_can_be_revoked_by_empty_key() -> None:
    svc = service()
    before = used(svc)
    a, b = ahead(svc, 2)
    assert used(svc) > before
    assert svc.put_revoke(T, "c", [PutRef("", a.put_id)]) == [(Status.OK, "")]
    assert a.put_id not in svc.objects.puts
    svc.clock.advance(svc.config.write_grant_ttl_s + svc.config.grant_skew_s + 1)  # type: ignore[attr-defined]
    svc.tick()
    assert b.put_id not in svc.objects.puts and not svc.tenant(T).writing
    assert bind(svc, b, "k")[0] in (Status.EXPIRED, Status.NOT_FOUND)  # its PutEnd, too late


def test_put_start_and_put_end_carry_asks() -> None:
    svc = service()
    outcome = svc.put_start(T, "c", [PutItem("k", 64 * KiB)], ahead=PutAheadAsk(2, 64 * KiB))
    assert len(outcome.results) == 1 and len(outcome.ahead) == 2
    seg_ids = {s.segment_id for s in outcome.segments}
    assert {g.segment_id for r in outcome.ahead for g in r.replicas} <= seg_ids


def put_now(svc: MasterService, key: str, size: int, checksum: int, **flags) -> Any:  # type: ignore[no-untyped-def]
    """PutStart + PutEnd of `key`, then a second on the clock (LRU order is put order)."""
    started = svc.put_start(T, "c", [PutItem(key, size, **flags)]).results[0]
    assert started.status == Status.OK, started.message
    assert svc.put_end(T, "c", [PutEndItem(key, started.put_id, checksum,
                                           receipts_for(SECRET, started, checksum))]) == [(OK, "")]
    svc.clock.advance(1)  # type: ignore[attr-defined]
    return started


def test_a_bind_behind_an_evicted_newer_version_is_refused() -> None:
    """Reserved ahead, then the key put newer through PutStart and evicted: the key is absent,
    but its node may still report the evicted version to a rebuild, which prefers it (newer)
    over a put bound to the older allocation. Refused, nothing stored; an allocation newer
    than the evicted version binds (docs/security.md, put-ahead writes)."""
    svc = service()  # one 8 MiB node
    older = ahead(svc, 1)[0]
    evicted = [put_now(svc, key, 64 * KiB, 5) for key in ("k", "j")]
    assert all(e.replicas[0].alloc_id > older.replicas[0].alloc_id for e in evicted)
    middle = ahead(svc, 1)[0]  # newer than both versions
    for i in range(8):  # fill the node: the last put evicts k and j, the least recently used
        put_now(svc, f"f{i}", MiB, 1)
    assert svc.exists(T, ["k", "j"]) == [Status.NOT_FOUND] * 2
    drops = svc.aheads.drops
    assert drops.dropped[(T, "j")] == evicted[1].replicas[0].alloc_id
    assert bind(svc, middle, "k", checksum=6) == (OK, "")
    status, message = bind(svc, older, "j", checksum=6)
    assert status == Status.EXPIRED and "older" in message
    assert svc.exists(T, ["j"]) == [Status.NOT_FOUND] and not svc.tenant(T).writing
    assert older.put_id not in svc.objects.puts
    assert not drops.dropped and not drops.outstanding  # nothing left to refuse: forgotten
    assert bind(svc, ahead(svc, 1)[0], "j", checksum=8) == (OK, "")  # granted after: binds
    assert svc.get_replicas(T, "c", ["k", "j"]).results[1].checksum == 8
    svc.check_invariants()


def test_a_bind_behind_a_version_lost_with_its_node_is_refused() -> None:
    """As above, the newer version lost with its node, which then comes back with it: the key
    holds the value acknowledged last (put again through PutStart), not the returning one."""
    svc = service(rebuild_grace_s=0)  # a returning node's report ends its rebuild
    mount(svc, "n2", 2, size=8 * MiB)
    older = ahead(svc, 1)[0]
    away = "n2" if older.replicas[0].segment_id == 1 else "n1"  # E lives where older does not
    lost = put_now(svc, "k", 64 * KiB, 5, avoid_node_ids=["n1" if away == "n2" else "n2"])
    rep = lost.replicas[0]
    svc.expire_node(svc.membership.nodes[away])
    assert svc.exists(T, ["k"]) == [Status.NOT_FOUND]
    assert bind(svc, older, "k", checksum=6)[0] == Status.EXPIRED
    assert svc.exists(T, ["k"]) == [Status.NOT_FOUND]
    put_now(svc, "k", 64 * KiB, 6)  # the client puts again: a version newer than the lost one
    back = svc.mount_segment(away, 2, [segment_info(rep.segment_id, 8 * MiB)], report_follows=True)
    assert back.results == [(OK, "")]
    out = svc.report_objects(away, 2, rep.segment_id,
                             [Entry("k", rep.alloc_id, rep.offset, 64 * KiB, checksum=5)], last=True)
    assert out.refused == [rep.alloc_id]
    assert svc.get_replicas(T, "c", ["k"]).results[0].checksum == 6
    svc.check_invariants()


def test_dropped_versions_are_kept_only_behind_an_outstanding_allocation_and_bounded() -> None:
    svc = service(max_put_ahead_dropped_keys=3)
    for i in range(4):  # nothing outstanding: an eviction is remembered nowhere
        put_now(svc, f"a{i}", MiB, 1)
    assert svc.evictor.evict_one() > 0 and not svc.aheads.drops.dropped
    held = ahead(svc, 1)[0]
    for i in range(8):  # behind `held`: each remembered, at most 3, the lowest into the floor
        put_now(svc, f"k{i}", 512 * KiB, 1)
    while svc.evictor.evict_one() > 0:
        pass
    drops = svc.aheads.drops
    assert len(drops.dropped) == 3 and drops.forgotten >= 5
    assert drops.floor > held.replicas[0].alloc_id  # forgetting fails safe: any key refused
    assert drops.refused_at_or_below(T, "never-stored") == drops.floor
    svc.check_invariants()
    assert svc.put_revoke(T, "c", [PutRef("", held.put_id)]) == [(OK, "")]
    assert not drops.dropped and not drops.floor and len(drops) == 0  # all forgotten


def test_ahead_drops_forget_what_no_outstanding_allocation_is_older_than() -> None:
    drops = AheadDrops(max_keys=2)
    drops.dropped_version(T, "a", 20)  # none outstanding: not kept
    drops.granted(1, 10)
    drops.dropped_version(T, "b", 5)  # older than every outstanding allocation: not kept
    drops.dropped_version(T, "a", 20)
    drops.granted(2, 30)
    drops.dropped_version(T, "c", 25)
    drops.dropped_version(T, "d", 40)  # a third: the lowest (a, 20) goes into the floor
    assert drops.dropped == {(T, "c"): 25, (T, "d"): 40} and drops.floor == 20
    assert [drops.refused_at_or_below(T, key) for key in "acdx"] == [20, 25, 40, 20]
    drops.ended(1)  # the oldest is now 30: c and the floor matter to nothing outstanding
    assert drops.dropped == {(T, "d"): 40} and drops.floor == 0
    drops.ended(2)
    assert not drops.dropped and len(drops) == 0 and drops.oldest() == 0
