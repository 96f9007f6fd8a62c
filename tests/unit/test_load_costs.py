"""The load estimate's rules (client/load_costs.py): prior, transport rounds, whole loads."""

from __future__ import annotations

import pytest

from cellar.client.load_costs import PRIOR_BYTES_PER_S, PRIOR_RTT_S, LoadCosts


def test_before_anything_the_prior_says_so() -> None:
    est = LoadCosts().estimate(1 << 30)
    assert est.basis == "prior" and est.rtt_s == PRIOR_RTT_S
    assert est.load_s == pytest.approx(PRIOR_RTT_S + 1.0)
    assert LoadCosts().estimate(0).load_s == 0.0


def test_transport_rounds_give_rtt_plus_bytes_over_their_rate() -> None:
    costs = LoadCosts()
    costs.rpc("GetReplicas", 0.001)
    costs.rpc("Put", 5.0)  # not a load's round trip: ignored
    costs.read("tcp", 1_000_000, 0.01)
    est = costs.estimate(2_000_000)
    assert (est.basis, est.transport) == ("measured", "tcp")
    assert est.load_s == pytest.approx(0.001 + 0.02)
    assert est.bytes_per_s != PRIOR_BYTES_PER_S


def test_whole_loads_win_and_take_the_median_so_one_stall_does_not_skew_it() -> None:
    costs = LoadCosts()
    costs.rpc("GetReplicas", 0.001)
    costs.read("tcp", 1_000_000, 0.001)       # the wire alone: 1 GB/s
    for seconds in (0.004, 0.005, 0.006, 0.5):  # whole calls of 1 MB, one of them stalled
        costs.load(1_000_000, seconds)
    est = costs.estimate(3_000_000)
    assert est.load_s == pytest.approx(3 * 0.006)  # upper median of 4: the stall is ignored
    costs.load(0, 1.0)  # an empty get teaches nothing
    assert costs.estimate(3_000_000).load_s == pytest.approx(est.load_s)


def test_reads_made_beside_a_lookup_teach_the_throughput_too() -> None:
    """A get whose keys were all read early (client/early_reads.py: the reads ran beside
    GetReplicas, one `RpcAndMove`) still records its read: a client whose every get reads
    early would otherwise estimate from the prior forever."""
    from cellar.client.flow_run import FlowRun
    from cellar.client.flows import Move, Rpc, RpcAndMove
    from cellar.client.session_state import TransferRound
    from cellar.transfer.base import SegmentRoute, TransferOp, TransferResult

    class Shm:
        name = "shm"

    route = SegmentRoute(1, "n1", "h", {"shm": "/dev/shm/x"})
    op = TransferOp(route, None, 0, memoryview(bytearray(1 << 20)))  # type: ignore[arg-type]
    rnd = TransferRound("read", [op], 0.0, [(Shm(), [0])], [TransferResult()])

    def flow():  # type: ignore[no-untyped-def]
        yield RpcAndMove(Rpc("GetReplicas", None, 0.0), Move(rnd))

    costs = LoadCosts()
    run = FlowRun(flow(), None, costs)
    assert isinstance(run.next(), RpcAndMove)
    run.answer((None, rnd.results), 0.0)  # started at 0: a long time ago, a slow read
    est = costs.estimate(1 << 20)
    assert (est.basis, est.transport) == ("measured", "shm")
    assert est.bytes_per_s < PRIOR_BYTES_PER_S
