"""The master's full table check (cellar.master.state.audit) and the cheap checks in the
transitions: random sequences of every operation keep the tables consistent, and each kind of
corruption is caught (negative controls)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from test_master_support import (
    EPOCH,
    SECRET,
    Entry,
    FakeClock,
    MiB,
    make_service,
    mount,
    put,
    segment_info,
)

from cellar.errors import Status
from cellar.master.service import MasterService, PutEndItem, PutItem, PutRef
from cellar.master.state.audit import InvariantBroken
from cellar.master.state.ids import ID_EPOCH_SHIFT
from cellar.master.state.objects import charge
from tests.support.receipts import receipts_for


@dataclass
class Lost:
    segment_id: int
    alloc_id: int


def busy_service(seed: int) -> tuple[MasterService, FakeClock]:
    """A service after a random run of puts, upserts, revokes, gets, removes, node loss and
    expiry, lost replicas and writer timeouts; check_invariants after every step."""
    clock = FakeClock()
    svc = make_service(clock, seed=seed, node_suspect_after_s=5, node_expire_after_s=10,
                       default_replicas=1, max_replicas=2)
    for index in range(4):
        mount(svc, f"n{index}", index + 1, 8 * MiB)
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(40)]
    for _ in range(400):
        op = rng.random()
        key = rng.choice(keys)
        if op < 0.35:
            result = svc.put_start("", "c", [PutItem(key, rng.randint(1, 300_000), replicas=rng.choice((1, 2)),
                                                     upsert=rng.random() < 0.3, hard_pin=rng.random() < 0.1)])
            first = result.results[0]
            if first.status == Status.OK and rng.random() < 0.8:
                svc.put_end("", "c", [PutEndItem(key, first.put_id, 7, receipts_for(SECRET, first, 7))])
            elif first.status == Status.OK and rng.random() < 0.5:
                svc.put_revoke("", "c", [PutRef(key, first.put_id)])
        elif op < 0.6:
            got = svc.get_replicas("", "r", [key]).results[0]
            if got.pin_id and rng.random() < 0.7:
                svc.unpin("", "r", [got.pin_id])
        elif op < 0.75:
            svc.remove("", [key])
        elif op < 0.8:
            obj = svc.tenant("default").objects.get(key)
            if obj is not None:
                rep = obj.replicas[0]
                svc.heartbeat(rep.segment.node.node_id, 1, 0, [Lost(rep.segment.segment_id, rep.alloc_id)])
        elif op < 0.82 and len(svc.membership.nodes) > 2:
            node = rng.choice(sorted(svc.membership.nodes))
            svc.unmount_segment(node, list(svc.membership.nodes[node].segments))
        else:
            clock.advance(rng.choice((0.1, 1.0, 4.0)))
            for node_id in list(svc.membership.nodes):
                if rng.random() < 0.95:
                    svc.heartbeat(node_id, 1, 0)
            svc.tick()
        svc.check_invariants()
    return svc, clock


@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_keep_every_table_consistent(seed: int) -> None:
    svc, _ = busy_service(seed)
    assert svc.check_invariants() == len(svc.tenant("default").objects) + len(svc.tenant("default").writing)


def test_rebuild_keeps_every_table_consistent() -> None:
    svc = make_service(FakeClock(), rebuild_grace_s=0)
    svc.mount_segment("n1", 1, [segment_info(1, 64 * MiB)], report_follows=True)
    svc.mount_segment("n2", 1, [segment_info(2, 64 * MiB)], report_follows=True)
    old = (EPOCH - 60_000) << ID_EPOCH_SHIFT
    same = [Entry(f"k{i}", old + i, i * MiB, 1000 + i) for i in range(6)]
    svc.report_objects("n1", 1, 1, same, last=True)
    newer = [Entry("k0", old + 100, 0, 999, checksum=8), *same[1:3],
             Entry("k1", old + 1, 2 * MiB, 1001)]  # k1 twice on one node: refused
    svc.report_objects("n2", 1, 2, newer, last=True)
    assert svc.check_invariants() == 6
    assert len(svc.tenant("default").objects["k1"].replicas) == 2


def test_a_broken_table_is_caught() -> None:
    """Negative controls: each kind of drift the check exists for."""
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "a", 1000)
    put(svc, "b", 300_000)
    svc.check_invariants()
    tenant = svc.tenant("default")

    tenant.used_bytes += 64  # a charge without a version
    with pytest.raises(InvariantBroken, match="charged"):
        svc.check_invariants()
    tenant.used_bytes -= 64

    svc.objects.complete_count += 1  # a second writer of the counter
    with pytest.raises(InvariantBroken, match="complete_count"):
        svc.check_invariants()
    svc.objects.complete_count -= 1

    rep = tenant.objects["a"].replicas[0]
    rep.segment.allocator.free(rep.offset)  # a range freed behind the table's back
    with pytest.raises(InvariantBroken, match="live allocation"):
        svc.check_invariants()


def test_the_cheap_checks_run_in_the_transitions() -> None:
    svc = make_service(FakeClock())
    mount(svc, "n1", 1)
    put(svc, "a", 1000)
    obj = svc.tenant("default").objects["a"]
    with pytest.raises(AssertionError, match="negative"):
        charge(obj, -obj.reserved * 2)  # more credit than the tenant was ever charged
    obj = svc.tenant("default").objects["a"]
    with pytest.raises(AssertionError, match="complete"):
        svc.objects.complete(obj, 7, 0.0)  # COMPLETE twice
