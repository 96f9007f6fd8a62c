"""Pins: one per GetReplicas result, released by Unpin, by riding unpins, or by their TTL."""

from __future__ import annotations

from test_master_support import FakeClock, MiB, get, make_service, mount, put, put_start

from cellar.errors import Status

LONG_LIVED = {"node_suspect_after_s": 1000, "node_expire_after_s": 2000}


def test_pin_accounting_and_unpin() -> None:
    svc = make_service(**LONG_LIVED)
    mount(svc, "n1", 1)
    put(svc, "k", 100)
    obj = svc.tenant("").objects["k"]
    first, second = get(svc, "k"), get(svc, "k")
    assert first.pin_id != second.pin_id
    assert obj.pins == 2 and len(svc.pins) == 2
    assert svc.unpin("", "reader", [first.pin_id, first.pin_id, 12345]) == 1
    assert obj.pins == 1
    # unpins ride on the next GetReplicas
    third = svc.get_replicas("", "reader", ["k"], [second.pin_id]).results[0]
    assert obj.pins == 1 and third.pin_id


def test_pins_are_per_tenant() -> None:
    svc = make_service(tenants={"t": {}}, **LONG_LIVED)
    mount(svc, "n1", 1)
    put(svc, "k", 100)
    pin = get(svc, "k").pin_id
    assert svc.unpin("t", "reader", [pin]) == 0  # another tenant cannot release it
    assert svc.unpin("", "reader", [pin]) == 1


def test_pin_ttl_releases_pins_of_crashed_readers() -> None:
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1, size=4 * MiB)
    for i in range(4):
        put(svc, f"k{i}", MiB)
    pins = [get(svc, f"k{i}").pin_id for i in range(4)]
    assert put_start(svc, "new", MiB).status == Status.NO_SPACE  # everything pinned
    clock.advance(9.9)
    svc.tick()
    assert len(svc.pins) == 4
    clock.advance(0.2)
    svc.tick()
    assert len(svc.pins) == 0 and svc.pins.expired_total == 4
    assert put_start(svc, "new", MiB).status == Status.OK
    assert svc.unpin("", "reader", pins) == 0  # already gone


def test_removed_object_is_freed_when_its_pin_expires() -> None:
    clock = FakeClock()
    svc = make_service(clock, **LONG_LIVED)
    mount(svc, "n1", 1)
    put(svc, "k", MiB)
    get(svc, "k")
    svc.remove("", ["k"])
    assert svc.capacity()[1] == MiB
    clock.advance(10.1)
    svc.tick()
    assert svc.capacity()[1] == 0


def test_max_pins_per_client() -> None:
    svc = make_service(max_pins_per_client=3, **LONG_LIVED)
    mount(svc, "n1", 1)
    put(svc, "k", 100)
    results = svc.get_replicas("", "greedy", ["k"] * 4).results
    assert [r.status for r in results] == [Status.OK] * 3 + [Status.QUOTA_EXCEEDED]
    assert "max_pins_per_client" in results[3].message
    assert get(svc, "k", client="someone-else").status == Status.OK
    svc.unpin("", "greedy", [results[0].pin_id])
    assert get(svc, "k", client="greedy").status == Status.OK
