"""Finding: a put too large to fit still evicted 64 objects on every failed attempt.

A PutStart now evicts only when eviction could succeed (the free bytes plus every evictable
byte cover what it needs; the eviction pools keep those sums), and stops as soon as the put is
placed: a put that will fail anyway is NO_SPACE (or QUOTA_EXCEEDED) and evicts nothing.
"""

from __future__ import annotations

import random
from typing import Any

from cellar.errors import Status
from cellar.master.config import MasterConfig
from cellar.master.service import MasterService, PutEndItem, PutItem
from cellar.proto import cellar_pb2 as pb
from tests.support.receipts import receipts_for

SECRET = bytes(range(32))
KiB = 1 << 10
MiB = 1 << 20


def _service(segment_bytes: int, **settings: Any) -> MasterService:
    settings.setdefault("tenants", {"default": {"hard_pin": True}})
    config = MasterConfig(new_node_ramp_s=0.0, max_tenant_writing_fraction=1.0, **settings)
    config.validate()
    svc = MasterService(config, SECRET, rng=random.Random(0))
    info = pb.SegmentInfo(segment_id=1, size_bytes=segment_bytes, host_id="h", node_id="n1",
                          endpoints=[pb.Endpoint(transport="tcp", address="127.0.0.1:1")])
    assert svc.mount_segment("n1", 1, [info]).results == [(Status.OK, "")]
    return svc


def _put(svc: MasterService, key: str, size: int, tenant: str = "", **kw: Any) -> None:
    r = svc.put_start(tenant, "w", [PutItem(key, size, **kw)]).results[0]
    assert r.status == Status.OK, r.message
    assert svc.put_end(tenant, "w", [PutEndItem(key, r.put_id, 1, receipts_for(SECRET, r, 1))]) == [(Status.OK, "")]


def test_a_put_that_cannot_fit_evicts_nothing() -> None:
    svc = _service(8 * MiB)
    _put(svc, "pinned-forever", 6 * MiB, hard_pin=True)  # never evictable
    for i in range(128):
        _put(svc, f"small{i}", 8 * KiB)  # 1 MiB of evictable objects
    objects = set(svc.tenant("").objects)
    for attempt in range(5):  # 4 MiB cannot fit even if every small object went
        r = svc.put_start("", "w", [PutItem(f"big{attempt}", 4 * MiB)]).results[0]
        assert r.status == Status.NO_SPACE
    assert svc.evictor.evicted_keys == 0, "a doomed put evicted objects"
    assert set(svc.tenant("").objects) == objects
    assert svc.space.refused_before_evicting == 5


def test_a_put_that_fits_evicts_only_until_it_is_placed() -> None:
    svc = _service(8 * MiB)
    for i in range(8):
        _put(svc, f"m{i}", MiB)  # full: 8 x 1 MiB
    r = svc.put_start("", "w", [PutItem("new", MiB)]).results[0]
    assert r.status == Status.OK
    assert svc.evictor.evicted_keys == 1  # one 1 MiB victim made room for one 1 MiB put


def test_over_quota_put_that_cannot_fit_the_quota_evicts_nothing() -> None:
    svc = _service(64 * MiB, tenants={"t": {"quota_bytes": "4MiB", "hard_pin": True}})
    _put(svc, "pinned", 3 * MiB, tenant="t", hard_pin=True)
    for i in range(8):
        _put(svc, f"s{i}", 64 * KiB, tenant="t")  # 512 KiB evictable
    r = svc.put_start("t", "w", [PutItem("big", 2 * MiB)]).results[0]
    assert r.status == Status.QUOTA_EXCEEDED
    assert svc.evictor.evicted_keys == 0 and len(svc.tenant("t").objects) == 9


def test_pool_byte_sums_follow_pins_and_removals() -> None:
    svc = _service(64 * MiB)
    for i in range(4):
        _put(svc, f"k{i}", MiB)
    assert svc.evictor.evictable_bytes() == 4 * MiB
    pin = svc.get_replicas("", "r", ["k0"]).results[0].pin_id
    assert svc.evictor.evictable_bytes() == 3 * MiB
    svc.unpin("", "r", [pin])
    svc.remove("", ["k1"])
    assert svc.evictor.evictable_bytes() == 3 * MiB
