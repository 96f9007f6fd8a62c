"""A deadline-bounded get counts a disk replica LATE when it cannot arrive within the budget
(client/gets.py `GetBatch.next_ops`, the estimate `DiskReadRates` in client/session_state.py).

The reply's segment table names each segment's tier; the client's estimate for a node's disk
comes from the disk reads it has seen. Negative control: without a budget (or with one the
estimate fits) the same disk replica is read; before this change every disk key was read.
"""

from __future__ import annotations

from test_client_core import fill, get_reply

from cellar.client.gets import GetBatch, into_result
from cellar.client.session_state import DiskReadRates, NodeHealth
from cellar.client.statuses import LATE
from cellar.errors import Status
from cellar.proto.tiers import TIER_DISK

MIB = 1 << 20
VALUES = {"a": b"A" * 4096, "b": b"B" * 4096, "c": b"C" * 4096}


def _on_disk(reply, node: str):  # type: ignore[no-untyped-def]
    for seg in reply.segments:
        if seg.node_id == node:
            seg.tier = TIER_DISK
    return reply


def _slow_rates(node: str = "n1") -> DiskReadRates:
    rates = DiskReadRates()
    rates.observe(node, MIB, 10.0)  # this node's disk has delivered 100 KiB/s
    return rates


def test_a_disk_read_that_cannot_fit_the_budget_is_late_and_not_started() -> None:
    batch = GetBatch(list(VALUES), None, health=NodeHealth(), budgeted=True)
    reply = get_reply(VALUES, nodes=("n1",))
    batch.on_reply(_on_disk(reply, "n1"))
    assert batch.next_ops(0.01, _slow_rates()) == []
    assert [into_result(e) for e in batch.entries] == [LATE] * 3


def test_the_same_read_goes_ahead_when_the_estimate_fits_or_without_a_budget() -> None:
    for budget, rates in ((10.0, _slow_rates()), (0.01, DiskReadRates()), (None, _slow_rates())):
        batch = GetBatch(list(VALUES), None, health=NodeHealth(), budgeted=budget is not None)
        batch.on_reply(_on_disk(get_reply(VALUES, nodes=("n1",)), "n1"))
        ops = batch.next_ops(budget, rates)
        assert len(ops) == 3, (budget, rates)
        batch.on_read_results(fill(ops, {"n1": b"A" * 4096}))
        assert batch.round_disk_bytes == {"n1": 3 * 4096}


def test_dram_replica_first_and_disk_bytes_queue_per_node() -> None:
    # two replicas each: n1 (disk, listed first by the master) and n2 (DRAM)
    batch = GetBatch(["a"], None, health=NodeHealth(), budgeted=True)
    batch.on_reply(_on_disk(get_reply({"a": VALUES["a"]}, nodes=("n1", "n2")), "n1"))
    (op,) = batch.next_ops(0.0, _slow_rates())
    assert op.route.node_id == "n2", "the DRAM replica is read first"
    # 3 keys of 4 KiB from one disk at 1 MiB/s: the third does not fit 10 ms (+0.5 ms latency)
    rates = DiskReadRates()
    rates.observe("n1", MIB, 1.0)
    batch = GetBatch(list(VALUES), None, health=NodeHealth(), budgeted=True)
    batch.on_reply(_on_disk(get_reply(VALUES, nodes=("n1",)), "n1"))
    ops = batch.next_ops(0.01, rates)
    assert len(ops) == 2 and batch.entries[2].late


def test_prefix_mode_cuts_after_a_late_disk_key() -> None:
    values = {"dram": b"D" * 4096, "disk": b"K" * 4096, "after": b"X" * 4096}
    reply = get_reply(values, nodes=("n1", "n2"))
    # "disk" has one replica, on n1's disk; the others one on n2's DRAM
    reply.results[0].replicas.pop(0)
    reply.results[1].replicas.pop(1)
    reply.results[2].replicas.pop(0)
    batch = GetBatch(list(values), None, health=NodeHealth(), budgeted=True, prefix=True)
    batch.on_reply(_on_disk(reply, "n1"))
    ops = batch.next_ops(0.01, _slow_rates())
    assert [op.route.node_id for op in ops] == ["n2"]  # only the key before the late one
    dram, disk, after = batch.entries
    assert disk.late and after.status == Status.NOT_FOUND and dram.status is None


def test_the_estimate_moves_toward_what_it_sees() -> None:
    rates = DiskReadRates()
    fresh = rates.seconds("n1", 100 * MIB)
    rates.observe("n1", 100 * MIB, 10.0)  # 10 MiB/s seen: a 100 MiB read now takes ~10 s
    assert rates.seconds("n1", 100 * MIB) > 9 > fresh
    for _ in range(30):
        rates.observe("n1", 100 * MIB, 0.1)  # then 1 GiB/s, again and again
    assert rates.seconds("n1", 100 * MIB) < 0.2
    assert rates.seconds("n2", MIB) == DiskReadRates().seconds("n2", MIB)
