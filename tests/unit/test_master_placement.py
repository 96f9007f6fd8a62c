"""Placement: distinct nodes, freest first, avoid list, preferred host, newcomer ramp."""

from __future__ import annotations

from collections import Counter

from test_master_support import FakeClock, MiB, make_service, mount, put, put_start, segment_info

from cellar.errors import Status
from cellar.master.service import PutItem

LONG_LIVED = {"node_suspect_after_s": 1000, "node_expire_after_s": 2000}


def test_replicas_go_to_distinct_nodes() -> None:
    svc = make_service(**LONG_LIVED)
    for n in range(4):
        mount(svc, f"n{n}", 10 + n)
    svc.mount_segment("n0", 1, [segment_info(99, 64 * MiB)])  # a second segment on n0
    for i in range(50):
        result = svc.put_start("", "w", [PutItem(f"k{i}", 4096, replicas=4)]).results[0]
        assert result.status == Status.OK
        assert len({r.node_id for r in result.replicas}) == 4


def test_freest_segment_is_preferred() -> None:
    svc = make_service(**LONG_LIVED)
    mount(svc, "full", 1)
    mount(svc, "empty", 2)
    # fill segment 1 to about half by placing with the other node avoided
    for i in range(32):
        assert svc.put_start("", "w", [PutItem(f"f{i}", MiB, avoid_node_ids=["empty"])]).results[0].status == 0
    placed = Counter(put_start(svc, f"k{i}", 64 * 1024).replicas[0].node_id for i in range(20))
    assert placed == {"empty": 20}


def test_placement_evens_out_between_equal_segments() -> None:
    svc = make_service(**LONG_LIVED)
    for n in range(3):
        mount(svc, f"n{n}", 1 + n)
    placed = Counter(put_start(svc, f"k{i}", MiB).replicas[0].node_id for i in range(60))
    assert placed == {"n0": 20, "n1": 20, "n2": 20}


def test_sampling_with_many_segments_still_prefers_free_ones() -> None:
    svc = make_service(placement_choices=2, **LONG_LIVED)
    for n in range(20):
        mount(svc, f"n{n}", 1 + n, size=16 * MiB)
    # make n0..n9 nearly full
    for n in range(10):
        others = [f"n{m}" for m in range(20) if m != n]
        for i in range(15):
            assert svc.put_start("", "w", [PutItem(f"fill{n}.{i}", MiB, avoid_node_ids=others)]).results[0].status == 0
    placed = Counter(put_start(svc, f"k{i}", 4096).replicas[0].node_id for i in range(200))
    on_full = sum(count for node, count in placed.items() if int(node[1:]) < 10)
    assert on_full < 200 * 0.25  # power of two choices: full segments rarely win


def test_full_sampled_segments_fall_back_to_any_with_room() -> None:
    svc = make_service(placement_choices=1, **LONG_LIVED)
    for n in range(10):
        mount(svc, f"n{n}", 1 + n, size=4 * MiB)
    # 10 segments of 4 MiB hold exactly 40 objects of 1 MiB, whatever the sampling picks
    for i in range(40):
        assert put_start(svc, f"k{i}", MiB, hard_pin=True).status == Status.OK
    assert put_start(svc, "one-more", MiB).status == Status.NO_SPACE


def test_avoid_list_is_respected() -> None:
    svc = make_service(**LONG_LIVED)
    for n in range(3):
        mount(svc, f"n{n}", 1 + n)
    for i in range(20):
        result = svc.put_start("", "w", [PutItem(f"k{i}", 4096, replicas=2, avoid_node_ids=["n1"])]).results[0]
        assert {r.node_id for r in result.replicas} == {"n0", "n2"}
    result = svc.put_start("", "w", [PutItem("x", 4096, avoid_node_ids=["n0", "n1", "n2"])]).results[0]
    assert result.status == Status.UNAVAILABLE


def test_preferred_host_gets_the_first_replica() -> None:
    svc = make_service(**LONG_LIVED)
    mount(svc, "n0", 1, host="gpu-box-0")
    mount(svc, "n1", 2, host="gpu-box-1", size=256 * MiB)  # emptier: would win otherwise
    for i in range(10):
        result = svc.put_start("", "w", [PutItem(f"k{i}", MiB, replicas=2, preferred_host_id="gpu-box-0")]).results[0]
        assert result.replicas[0].node_id == "n0"
        assert result.replicas[1].node_id == "n1"
    # no room on the preferred host: placed elsewhere rather than refused
    big = svc.put_start("", "w", [PutItem("big", 60 * MiB, preferred_host_id="gpu-box-0")]).results[0]
    assert big.status == Status.OK and big.replicas[0].node_id == "n1"
    unknown = svc.put_start("", "w", [PutItem("u", MiB, preferred_host_id="nowhere")]).results[0]
    assert unknown.status == Status.OK


def test_a_new_node_ramps_up_instead_of_taking_the_burst() -> None:
    clock = FakeClock()
    svc = make_service(clock, new_node_ramp_s=10.0, **LONG_LIVED)
    mount(svc, "old", 1, size=64 * MiB)
    clock.advance(60)
    for i in range(16):  # old is now 25% used
        put(svc, f"fill{i}", MiB)
    mount(svc, "new", 2, size=64 * MiB)
    burst = Counter(put_start(svc, f"b{i}", 64 * 1024).replicas[0].node_id for i in range(50))
    assert burst["old"] == 50  # a fresh node's weight is ~0: the old one (75% free) wins
    clock.advance(5)  # weight 0.5 x 100% free < 75% free: still old
    assert put_start(svc, "half", 64 * 1024).replicas[0].node_id == "old"
    clock.advance(5)  # ramp over: the empty node wins
    after = Counter(put_start(svc, f"a{i}", 64 * 1024).replicas[0].node_id for i in range(20))
    assert after["new"] == 20
    # a full old node still lets a ramping node take writes (no refusals)
    svc2 = make_service(clock, new_node_ramp_s=10.0, **LONG_LIVED)
    mount(svc2, "old", 1, size=4 * MiB)
    clock.advance(60)
    for i in range(4):
        put(svc2, f"fill{i}", MiB, hard_pin=True)
    mount(svc2, "new", 2, size=4 * MiB)
    assert put_start(svc2, "k", MiB).replicas[0].node_id == "new"


def test_suspect_nodes_get_no_placements() -> None:
    clock = FakeClock()
    svc = make_service(clock)
    mount(svc, "quiet", 1)
    mount(svc, "alive", 2)
    clock.advance(2.0)
    assert svc.heartbeat("alive", 1, 0).remount is False
    clock.advance(1.5)  # quiet: 3.5 s silent -> SUSPECT
    svc.tick()
    placed = {put_start(svc, f"k{i}", 4096).replicas[0].node_id for i in range(10)}
    assert placed == {"alive"}
    assert put_start(svc, "two", 4096, replicas=2).status == Status.UNAVAILABLE
