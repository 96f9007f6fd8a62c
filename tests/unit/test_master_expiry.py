"""ExpiryRuns: the FIFO behind the pin TTL and writer timeout sweeps keeps runs of ids."""

from __future__ import annotations

from cellar.master.state.expiry import ExpiryRuns


def test_a_batch_is_one_run_and_ids_come_back_oldest_first() -> None:
    runs = ExpiryRuns()
    for pin_id in range(100, 228):  # one request: consecutive ids, one expiry
        runs.add(10.0, pin_id)
    assert len(runs) == 1
    runs.add(10.0, 300)  # a gap (ids drawn elsewhere meanwhile): a new run
    runs.add(11.0, 301)  # a later request: a new run
    runs.add(11.0, 302)
    assert len(runs) == 3
    assert list(runs.pop_due(9.9)) == []
    assert list(runs.pop_due(10.0)) == [*range(100, 228), 300]
    assert len(runs) == 1
    assert list(runs.pop_due(100.0)) == [301, 302]
    assert len(runs) == 0 and list(runs.pop_due(100.0)) == []


def test_pin_sweep_still_expires_each_pin_once() -> None:
    from test_master_support import FakeClock, get, make_service, mount, put

    clock = FakeClock()
    svc = make_service(clock, pin_ttl_s=5.0, node_suspect_after_s=1000, node_expire_after_s=2000)
    mount(svc, "n1", 1)
    for i in range(3):
        put(svc, f"k{i}", 100)
    first = svc.get_replicas("", "r", ["k0", "k1"]).results
    clock.advance(1)
    late = get(svc, "k2")
    svc.unpin("", "r", [first[0].pin_id])  # released early: the sweep skips it
    clock.advance(4)
    assert svc.pins.sweep(clock.monotonic()) == 1  # k1's pin; k2's has 1 s left
    assert late.pin_id in svc.pins.pins and len(svc.pins) == 1
    clock.advance(1)
    assert svc.pins.sweep(clock.monotonic()) == 1 and len(svc.pins) == 0
