"""A soft pin with a TTL (PutItem.soft_pin_ttl_ms, what Mooncake's SoftPinAction.ENABLE asks
for): evicted only in the second pass until the TTL lapses, then ordinary cache; reads do not
extend it; a TTL above the limit is refused, one without a soft pin means nothing."""

from __future__ import annotations

from test_master_support import FakeClock, MiB, get, make_service, mount, put, put_start

from cellar.errors import Status
from cellar.master.requests import MAX_SOFT_PIN_TTL_MS

LONG_LIVED = {"node_suspect_after_s": 1000, "node_expire_after_s": 2000}


def _keys(svc) -> set[str]:  # type: ignore[no-untyped-def]
    return set(svc.tenant("").objects)


def _service(clock: FakeClock):  # type: ignore[no-untyped-def]
    """A 4 MiB segment: "lapsing" (soft pin, 10 s TTL), "lasting" (soft pin, no TTL) and two
    plain objects written after them."""
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=4 * MiB)
    put(svc, "lapsing", MiB, soft_pin=True, soft_pin_ttl_ms=10_000)
    clock.advance(1)
    put(svc, "lasting", MiB, soft_pin=True)
    clock.advance(1)
    put(svc, "plain1", MiB)
    clock.advance(1)
    put(svc, "plain2", MiB)
    clock.advance(1)
    return svc


def test_soft_pin_holds_until_its_ttl_lapses() -> None:
    clock = FakeClock()
    svc = _service(clock)
    svc.tick()  # within the TTL: still soft-pinned
    put(svc, "new0", MiB, hard_pin=True)
    assert _keys(svc) == {"lapsing", "lasting", "plain2", "new0"}  # plain1 went first
    clock.advance(10)
    svc.tick()  # the TTL lapsed: "lapsing" is ordinary cache now, and the oldest
    put(svc, "new1", MiB, hard_pin=True)
    assert "lapsing" not in _keys(svc) and "lasting" in _keys(svc)
    assert svc.tenant("").objects["lasting"].pin_kind == 2  # no TTL: still soft-pinned


def test_reads_do_not_extend_a_soft_pin() -> None:
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=4 * MiB)
    put(svc, "k", MiB, soft_pin=True, soft_pin_ttl_ms=2000)
    for _ in range(3):
        clock.advance(1)
        svc.unpin("", "reader", [get(svc, "k").pin_id])
        svc.tick()
    obj = svc.tenant("").objects["k"]
    assert (obj.pin_kind, obj.pool_kind) == (0, 1)  # lapsed at 2 s: the ordinary pool


def test_ttl_needs_a_soft_pin_and_is_bounded() -> None:
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=4 * MiB)
    put(svc, "a", MiB, soft_pin_ttl_ms=1000)  # no soft pin: an ordinary object
    assert svc.tenant("").objects["a"].pin_kind == 0
    too_long = put_start(svc, "b", MiB, soft_pin=True, soft_pin_ttl_ms=MAX_SOFT_PIN_TTL_MS + 1)
    assert too_long.status == Status.INVALID
    assert put_start(svc, "c", MiB, soft_pin=True, soft_pin_ttl_ms=MAX_SOFT_PIN_TTL_MS).status \
        == Status.OK


def test_a_dropped_or_replaced_object_is_left_alone_at_lapse() -> None:
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=4 * MiB)
    put(svc, "k", MiB, soft_pin=True, soft_pin_ttl_ms=1000)
    put(svc, "k", MiB, soft_pin=True, upsert=True)  # the new version's pin does not lapse
    assert svc.remove("", ["missing"])  # unrelated work in between
    clock.advance(2)
    svc.tick()
    obj = svc.tenant("").objects["k"]
    assert obj.pin_kind == 2 and obj.pool_kind == 2  # still soft-pinned, in the soft pool
