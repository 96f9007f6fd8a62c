"""Findings: metadata alone could take the whole store.

- One PutStart of 600 x 1 MiB with no data evicted everything and held the space WRITING for
  the write-grant TTL. Now a tenant's WRITING bytes are capped (quota_writing_bytes, and
  max_tenant_writing_fraction of the capacity whatever its quotas), the cap is checked before
  anything is evicted, and WRITING bytes count against quota_bytes.
- `hard_pin` plus a PutEnd with no data pinned the space for good. Now hard-pinning is a right
  an admin grants per tenant (`hard_pin`) with its own byte quota (`quota_hard_pin_bytes`).

Driven through the real MasterService (what both the gRPC and the fast line call).
"""

from __future__ import annotations

import random
from typing import Any

from cellar.errors import Status
from cellar.master.config import MasterConfig, TenantQuota
from cellar.master.service import MasterService, PutEndItem, PutItem
from cellar.proto import cellar_pb2 as pb
from tests.support.receipts import receipts_for

SECRET = bytes(range(32))
MiB = 1 << 20
SEGMENT_BYTES = 256 * MiB  # 2 nodes: 512 MiB in all, less than 600 x 1 MiB


def _service(**settings: Any) -> MasterService:
    config = MasterConfig(new_node_ramp_s=0.0, **settings)
    config.validate()
    svc = MasterService(config, SECRET, rng=random.Random(0))
    for n in (1, 2):
        info = pb.SegmentInfo(segment_id=n, size_bytes=SEGMENT_BYTES, host_id=f"h{n}",
                              node_id=f"n{n}",
                              endpoints=[pb.Endpoint(transport="tcp", address="127.0.0.1:1")])
        assert svc.mount_segment(f"n{n}", 1, [info]).results == [(Status.OK, "")]
    return svc


def _fill(svc: MasterService, tenant: str, count: int) -> None:
    for i in range(count):
        r = svc.put_start(tenant, "w", [PutItem(f"v{i}", MiB)]).results[0]
        assert r.status == Status.OK, r.message
        assert svc.put_end(tenant, "w", [PutEndItem(f"v{i}", r.put_id, 1, receipts_for(SECRET, r, 1))]) == [(Status.OK, "")]


def _snapshot(svc: MasterService, tenant: str) -> tuple[int, int, int]:
    t = svc.tenant(tenant)
    return t.used_bytes, t.object_count, svc.evictor.evicted_keys


def test_metadata_only_reservation_cannot_take_the_store() -> None:
    svc = _service(tenants={"victim": {}, "attacker": {}})
    _fill(svc, "victim", 200)  # 200 MiB of another tenant's cache
    capacity = 2 * SEGMENT_BYTES
    # 600 x 1 MiB PutStarts, never written: at most half the store is reserved, the rest refused
    items = [PutItem(f"a{i}", MiB) for i in range(600)]
    results: list[Any] = []
    for start in range(0, 600, 100):
        results += svc.put_start("attacker", "w", items[start:start + 100]).results
    ok = [r for r in results if r.status == Status.OK]
    refused = [r for r in results if r.status != Status.OK]
    attacker = svc.tenant("attacker")
    print(f"\nreserved {len(ok)} MiB WRITING of {capacity // MiB} MiB; refused {len(refused)} "
          f"(first: {refused[0].message!r})")
    assert attacker.writing_bytes == len(ok) * MiB <= capacity // 2
    assert refused and all(r.status == Status.QUOTA_EXCEEDED for r in refused)
    assert "WRITING" in refused[0].message
    # the victim's objects all survive: the capped reservation fitted beside them
    assert len(svc.tenant("victim").objects) == 200 and svc.evictor.evicted_keys == 0
    # once the writer timeout revokes them, the space comes back
    assert svc.objects.sweep_writers(svc.clock.monotonic() + svc.config.write_grant_ttl_s + 1) == len(ok)
    assert attacker.writing_bytes == 0 and attacker.used_bytes == 0


def test_a_refused_reservation_changes_nothing() -> None:
    svc = _service(tenants={"t": {"quota_writing_bytes": "8MiB"}})
    ok = svc.put_start("t", "w", [PutItem(f"k{i}", MiB) for i in range(8)]).results
    assert all(r.status == Status.OK for r in ok)
    before = _snapshot(svc, "t"), svc.tenant("t").writing_bytes, len(svc.objects.puts)
    refused = svc.put_start("t", "w", [PutItem("k8", MiB)]).results[0]
    assert refused.status == Status.QUOTA_EXCEEDED
    assert (_snapshot(svc, "t"), svc.tenant("t").writing_bytes, len(svc.objects.puts)) == before
    # ending a put frees its WRITING bytes (they are now plain used bytes)
    assert svc.put_end("t", "w", [PutEndItem("k0", ok[0].put_id, 1, receipts_for(SECRET, ok[0], 1))]) == [(Status.OK, "")]
    assert svc.put_start("t", "w", [PutItem("k8", MiB)]).results[0].status == Status.OK


def test_writing_bytes_count_against_the_byte_quota() -> None:
    svc = _service(tenants={"t": {"quota_bytes": "4MiB"}})
    results = svc.put_start("t", "w", [PutItem(f"k{i}", MiB) for i in range(6)]).results
    assert [r.status for r in results] == [Status.OK] * 4 + [Status.QUOTA_EXCEEDED] * 2
    assert svc.tenant("t").used_bytes == svc.tenant("t").writing_bytes == 4 * MiB


def test_hard_pin_needs_the_right() -> None:
    svc = _service(tenants={"plain": {}})
    before = _snapshot(svc, "plain")
    refused = svc.put_start("plain", "w", [PutItem("k", MiB, hard_pin=True)]).results[0]
    assert refused.status == Status.PERMISSION_DENIED and "hard_pin" in refused.message
    assert _snapshot(svc, "plain") == before and not svc.objects.puts
    # an admin grants the right (the admin API's body fields go through parse_tenant_quota)
    svc.set_tenant_quota("plain", TenantQuota(hard_pin=True))
    assert svc.put_start("plain", "w", [PutItem("k", MiB, hard_pin=True)]).results[0].status == Status.OK


def test_hard_pinned_bytes_have_their_own_quota() -> None:
    svc = _service(tenants={"t": {"hard_pin": True, "quota_hard_pin_bytes": "4MiB"}})
    for i in range(4):
        r = svc.put_start("t", "w", [PutItem(f"h{i}", MiB, hard_pin=True)]).results[0]
        assert r.status == Status.OK
        assert svc.put_end("t", "w", [PutEndItem(f"h{i}", r.put_id, 1, receipts_for(SECRET, r, 1))]) == [(Status.OK, "")]
    tenant = svc.tenant("t")
    assert tenant.hard_pinned_bytes == 4 * MiB
    refused = svc.put_start("t", "w", [PutItem("h4", MiB, hard_pin=True)]).results[0]
    assert refused.status == Status.QUOTA_EXCEEDED and "quota_hard_pin_bytes" in refused.message
    # unpinned puts are still fine, and removing a hard-pinned object gives its quota back
    assert svc.put_start("t", "w", [PutItem("plain", MiB)]).results[0].status == Status.OK
    assert svc.remove("t", ["h0"]) == [(Status.OK, "")]
    assert tenant.hard_pinned_bytes == 3 * MiB
    assert svc.put_start("t", "w", [PutItem("h4", MiB, hard_pin=True)]).results[0].status == Status.OK


def test_the_default_tenant_has_no_hard_pin_right() -> None:
    svc = _service()
    r = svc.put_start("", "w", [PutItem("k", MiB, hard_pin=True)]).results[0]
    assert r.status == Status.PERMISSION_DENIED
