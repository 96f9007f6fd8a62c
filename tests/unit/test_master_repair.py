"""Re-replication and drain on the master's side (master/repair.py, master/state/repair.py),
driven by hand: a fake clock, node heartbeats and copy reports written by the test."""

from __future__ import annotations

from typing import Any

from test_master_support import (
    EPOCH,
    SECRET,
    FakeClock,
    MiB,
    get,
    make_service,
    mount,
    put,
    segment_info,
)

from cellar.errors import Status
from cellar.master.service import MasterService, PutItem, PutRef
from cellar.master.serving.servicer import copy_tasks
from cellar.master.state.records import TIER_DISK, on_disk_only
from cellar.master.state.repair import live_count
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE, Grant, verify
from cellar.proto.receipt import ReceiptSigner


def cluster(clock: FakeClock, nodes: int = 3, **settings: Any) -> MasterService:
    svc = make_service(clock, **settings)
    for i in range(1, nodes + 1):
        mount(svc, f"n{i}", i)
    clock.advance(10)  # past the rebuild grace: replica counts are fixed from here on
    for i in range(1, nodes + 1):
        svc.heartbeat(f"n{i}", 1, 0)
    return svc


def beat(svc: MasterService, node_id: str, copied: list[pb.CopyDone] = ()) -> list[Any]:  # type: ignore[assignment]
    incarnation = svc.membership.nodes[node_id].incarnation
    svc.heartbeat(node_id, incarnation, 0)
    return svc.repair.on_heartbeat(node_id, incarnation, copied)


def expire(svc: MasterService, clock: FakeClock, victim: str) -> None:
    for _ in range(30):
        clock.advance(0.5)
        for node_id in list(svc.membership.nodes):
            if node_id != victim:
                beat(svc, node_id)
        svc.tick()
        if victim not in svc.membership.nodes:
            return
    raise AssertionError(f"{victim} did not expire")


def done(order: Any, checksum: int | None = None, status: int = pb.OK,
         receipt: bool = True) -> pb.CopyDone:
    """The target node's report; with the receipt its seal signs (as the node would)."""
    checksum = order.checksum if checksum is None else checksum
    t = order.target
    signed = ReceiptSigner(SECRET).sign(alloc_id=t.alloc_id, segment_id=t.segment_id,
                                        offset=t.offset, length=order.length, epoch=EPOCH,
                                        key_tag=t.key_tag, checksum=checksum) if receipt else b""
    return pb.CopyDone(alloc_id=t.alloc_id, segment_id=t.segment_id, offset=t.offset,
                       length=order.length, checksum=checksum, status=status, receipt=signed)


def run_repair(svc: MasterService, clock: FakeClock, rounds: int = 50,
               handed: list[Any] = ()) -> int:  # type: ignore[assignment]
    """Heartbeat every node, answering every copy order (those `handed` out already too) with
    a good report, until idle."""
    copied = 0
    pending: dict[str, list[pb.CopyDone]] = {}
    for order in handed:
        pending.setdefault(order.target.node_id, []).append(done(order))
    for _ in range(rounds):
        clock.advance(0.25)
        svc.tick()
        for node_id in list(svc.membership.nodes):
            orders = beat(svc, node_id, pending.pop(node_id, []))
            pending[node_id] = [done(o) for o in orders]
            copied += len(orders)
        if not svc.repair.queue.tasks and not svc.repair.queue.watched and not any(pending.values()):
            break
    return copied


def nodes_of(svc: MasterService, key: str) -> list[str]:
    obj = svc.tenant("").objects[key]
    return sorted(rep.segment.node.node_id for rep in obj.replicas)


def test_a_value_on_disk_tiers_is_copied_to_another_nodes_disk_tier() -> None:
    """A value whose replicas all sit on disk tiers (it spilled: every node's DRAM holds a
    hard-pinned page) loses one with its node: the copy goes to a third node's disk tier, as
    the value was. Before, repair placed copies in DRAM only, where there was no room and
    nothing it may evict: the value stayed a replica short (and a cold value that found DRAM
    room would have taken it from hot ones)."""
    clock = FakeClock()
    svc = make_service(clock)
    for i in range(1, 4):
        disk = segment_info(10 + i, 64 * MiB)
        disk.tier = TIER_DISK
        outcome = svc.mount_segment(f"n{i}", 1, [segment_info(i, MiB), disk])
        assert outcome.results == [(Status.OK, "")] * 2, outcome.results
    clock.advance(10)  # past the rebuild grace
    for i in range(1, 4):
        svc.heartbeat(f"n{i}", 1, 0)
    for i in range(3):
        put(svc, f"pinned/{i}", MiB, hard_pin=True)
    assert sorted(nodes_of(svc, f"pinned/{i}")[0] for i in range(3)) == ["n1", "n2", "n3"]
    put(svc, "cold", MiB, replicas=2)
    obj = svc.tenant("").objects["cold"]
    assert on_disk_only(obj) and len(obj.replicas) == 2
    victim = obj.replicas[0].segment.node.node_id
    expire(svc, clock, victim)
    run_repair(svc, clock)
    assert len(obj.replicas) == 2 and on_disk_only(obj), [r.segment.tier for r in obj.replicas]
    assert victim not in nodes_of(svc, "cold") and svc.repair.queue.copies_done == 1
    svc.check_invariants()


def test_a_lost_replica_is_copied_node_to_node_with_signed_grants() -> None:
    clock = FakeClock()
    svc = cluster(clock)
    keys = [f"k{i}" for i in range(30)]
    for key in keys:
        put(svc, key, 64 * 1024, replicas=2, checksum=0xABC)
    on_n1 = [k for k in keys if "n1" in nodes_of(svc, k)]
    assert on_n1
    expire(svc, clock, "n1")
    assert all(len(nodes_of(svc, k)) == 1 for k in on_n1)
    svc.tick()
    orders = [o for n in ("n2", "n3") for o in beat(svc, n)]
    assert len(orders) == len(on_n1)
    versions = {k: svc.tenant("").objects[k].version for k in keys}
    sent = {task.key: task.value_alloc_id for task in copy_tasks(orders)}
    for order in orders:  # a read grant on the survivor, a write grant on the new range
        assert order.checksum == 0xABC and order.length == 64 * 1024
        # the copy's range is newer than its value; the node keeps the value's put id beside it
        assert sent[order.key] == versions[order.key] < order.target.alloc_id
        assert order.source.node_id != order.target.node_id
        for granted, op in ((order.source, GRANT_OP_READ), (order.target, GRANT_OP_WRITE)):
            grant = Grant(granted.op, granted.segment_id, granted.offset, granted.length,
                          granted.alloc_id, granted.epoch, granted.expiry_ms, granted.key_tag,
                          granted.mac)
            verify(SECRET, grant, op=op, segment_id=granted.segment_id, offset=granted.offset,
                   length=granted.length, now_ms=clock.wall_ms(), min_epoch=svc.epoch)
    # Not replicas before the node reports: readers see the one survivor only.
    assert all(len(get(svc, k).replicas) == 1 for k in on_n1)
    run_repair(svc, clock, handed=orders)
    for key in keys:
        where = nodes_of(svc, key)
        assert len(where) == 2 and len(set(where)) == 2 and "n1" not in where
    assert svc.repair.queue.copies_done == len(on_n1) and svc.repair.queue.copy_failures == 0
    assert svc.repair.queue.bytes_copied == len(on_n1) * 64 * 1024
    assert svc.repair.queue.under_replicated() == 0
    assert {k: svc.tenant("").objects[k].version for k in keys} == versions
    svc.check_invariants()


def test_a_report_that_is_not_the_granted_allocation_is_refused_and_the_range_freed() -> None:
    clock = FakeClock()
    svc = cluster(clock)
    put(svc, "k", MiB, replicas=2, checksum=5)
    victim = nodes_of(svc, "k")[0]
    expire(svc, clock, victim)
    svc.tick()
    (target,) = [n for n in svc.membership.nodes if n not in nodes_of(svc, "k")]
    (order,) = beat(svc, target)
    used_before = svc.membership.usage()[1]
    # Wrong checksum, then another offset: neither makes a replica.
    beat(svc, target, [done(order, checksum=6)])
    assert nodes_of(svc, "k") == sorted(set(nodes_of(svc, "k")))
    assert len(nodes_of(svc, "k")) == 1
    assert svc.repair.queue.copy_failures == 1
    node = svc.membership.nodes[target]
    assert any(entry[2] == order.target.alloc_id for entry in node.outbox)  # the node drops it
    assert svc.quarantine.held_bytes == MiB  # until the write grant can no longer be used
    assert svc.membership.usage()[1] == used_before
    # The same report again (or a forged one for the freed alloc id) is ignored.
    beat(svc, target, [done(order)])
    assert len(nodes_of(svc, "k")) == 1
    svc.check_invariants()
    run_repair(svc, clock)  # planned again, and this time it lands
    assert len(nodes_of(svc, "k")) == 2


def test_a_copy_report_without_the_node_s_receipt_does_not_count() -> None:
    clock = FakeClock()
    svc = cluster(clock)
    put(svc, "k", MiB, replicas=2, checksum=5)
    expire(svc, clock, nodes_of(svc, "k")[0])
    svc.tick()
    (target,) = [n for n in svc.membership.nodes if n not in nodes_of(svc, "k")]
    (order,) = beat(svc, target)
    beat(svc, target, [done(order, receipt=False)])  # every field right, no proof of the seal
    assert len(nodes_of(svc, "k")) == 1 and svc.repair.queue.copy_failures == 1
    svc.check_invariants()
    run_repair(svc, clock)
    assert len(nodes_of(svc, "k")) == 2


def test_a_copy_reported_by_another_node_or_never_reported_does_not_count() -> None:
    clock = FakeClock()
    svc = cluster(clock, write_grant_ttl_s=3)
    put(svc, "k", MiB, replicas=2)
    expire(svc, clock, nodes_of(svc, "k")[0])
    svc.tick()
    (survivor,) = nodes_of(svc, "k")
    (target,) = [n for n in svc.membership.nodes if n != survivor]
    (order,) = beat(svc, target)
    beat(svc, survivor, [done(order)])  # not the node that was handed the copy
    assert nodes_of(svc, "k") == [survivor]
    clock.advance(3.5)
    svc.tick()  # the grant expired without a report: given up
    assert svc.repair.queue.copy_failures == 1
    beat(svc, target, [done(order)])  # too late
    assert nodes_of(svc, "k") == [survivor]
    svc.check_invariants()


def test_a_returning_node_s_surplus_replicas_are_dropped() -> None:
    clock = FakeClock()
    svc = cluster(clock)
    keys = [f"k{i}" for i in range(12)]
    for key in keys:
        put(svc, key, 64 * 1024, replicas=2, checksum=9)
    old = {k: [(r.segment.segment_id, r.offset, r.alloc_id) for r in svc.tenant("").objects[k].replicas
               if r.segment.node.node_id == "n1"] for k in keys}
    expire(svc, clock, "n1")
    run_repair(svc, clock)
    assert all(len(nodes_of(svc, k)) == 2 for k in keys)
    # n1 comes back (a new incarnation) with its old replicas and reports them.
    outcome = svc.mount_segment("n1", 2, [mount_info(1)], report_follows=True, previous_epoch=svc.epoch)
    assert outcome.results == [(Status.OK, "")]
    entries = [pb.ReportedObject(tenant="default", key=k, alloc_id=a, offset=o, length=64 * 1024,
                                 checksum=9, epoch=svc.epoch)
               for k, spots in old.items() for (_s, o, a) in spots]
    assert svc.report_objects("n1", 2, 1, entries, True).accepted == len(entries)
    assert max(len(nodes_of(svc, k)) for k in keys) == 3
    run_repair(svc, clock)
    assert all(len(nodes_of(svc, k)) == 2 and len(set(nodes_of(svc, k))) == 2 for k in keys)
    assert svc.repair.queue.replicas_trimmed == len(entries)
    svc.check_invariants()


def test_drain_excludes_the_node_from_placement_and_copies_its_objects_away() -> None:
    clock = FakeClock()
    svc = cluster(clock)
    keys = [f"k{i}" for i in range(20)]
    for key in keys:
        put(svc, key, 64 * 1024, replicas=1 if key < "k1" else 2)
    on_n2 = [k for k in keys if "n2" in nodes_of(svc, k)]
    status = svc.repair.drain("n2")
    assert status.draining and status.remaining_objects == len(on_n2) and not status.done
    for i in range(10):  # no new placement on a draining node
        put(svc, f"new{i}", 4096, replicas=2)
        assert "n2" not in nodes_of(svc, f"new{i}")
    run_repair(svc, clock)
    assert svc.repair.drain_status("n2").done
    for key in on_n2:  # the drained node still serves its replica until it stops
        wanted = svc.tenant("").objects[key].wanted
        assert live_count(svc.tenant("").objects[key]) == wanted
        assert len(nodes_of(svc, key)) == wanted + 1
    svc.unmount_segment("n2", [2])  # the node stops: nothing is left short
    assert all(len(nodes_of(svc, k)) == svc.tenant("").objects[k].wanted for k in keys)
    svc.check_invariants()


def test_copies_are_paced_per_node() -> None:
    clock = FakeClock()
    svc = cluster(clock, repair_bytes_per_s=MiB)
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        put(svc, key, MiB, replicas=2)
    lost = [k for k in keys if "n1" in nodes_of(svc, k)]
    assert len(lost) >= 3
    expire(svc, clock, "n1")
    svc.tick()
    # At 1 MiB/s per node and a one-second bucket, each source and each target may take one
    # 1 MiB copy now: at most 2 copies (n2 -> n3 and n3 -> n2), never all of them.
    assert 1 <= len(svc.repair.queue.tasks) <= 2 < len(lost)


def mount_info(segment_id: int) -> pb.SegmentInfo:
    return segment_info(segment_id, 64 * MiB)


def test_no_copy_of_a_value_starts_while_its_upsert_is_written() -> None:
    """A copy gets an alloc id above the upsert in flight; a master that died before the
    upsert's PutEnd left nobody to kill that range, and the next rebuild (newest id wins)
    served the old value over the upsert (master/state/records.py `being_replaced`). The copy
    waits for the upsert to end; revoked, the old value is copied as before."""
    clock = FakeClock()
    svc = cluster(clock)
    put(svc, "k", 64 * 1024, replicas=2, checksum=1)
    victim = nodes_of(svc, "k")[0]
    upsert = svc.put_start("", "writer", [PutItem("k", 64 * 1024, replicas=2, upsert=True)]).results[0]
    assert upsert.status == Status.OK
    expire(svc, clock, victim)
    assert len(nodes_of(svc, "k")) == 1
    for _ in range(8):
        clock.advance(0.25)
        svc.tick()
        assert [o for n in svc.membership.nodes for o in beat(svc, n)] == []
    assert svc.put_revoke("", "writer", [PutRef("k", upsert.put_id)]) == [(Status.OK, "")]
    assert run_repair(svc, clock) == 1
    assert len(nodes_of(svc, "k")) == 2 and victim not in nodes_of(svc, "k")
    svc.check_invariants()
