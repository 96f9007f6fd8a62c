"""master/serving/request_memory.py: a repeat gets the first reply; the bounds hold."""

from __future__ import annotations

import pytest

from cellar.master.requests import RequestRejected
from cellar.master.serving.request_memory import REPLY_BYTES, RESULT_BYTES, RequestMemory
from cellar.proto import cellar_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _req(request_id: int, client: str = "c", tenant: str = "t") -> pb.KeysRequest:
    return pb.KeysRequest(header=pb.RequestHeader(tenant=tenant, client_id=client,
                                                  request_id=request_id), keys=["k"])


def _runs(memory: RequestMemory, method: str, request: object, token: str = "tok") -> int:
    ran = []

    def run() -> pb.RemoveReply:
        ran.append(1)
        return pb.RemoveReply(results=[pb.KeyResult()])

    memory.once(method, request, token, run)
    return len(ran)


def test_a_repeat_gets_the_first_reply_and_runs_nothing() -> None:
    memory = RequestMemory(10, 60.0, 1 << 20, clock=Clock())
    first = memory.once("Remove", _req(7), "tok", lambda: pb.RemoveReply(results=[pb.KeyResult()]))
    assert memory.once("Remove", _req(7), "tok", lambda: pytest.fail("ran twice")) is first
    assert memory.repeats == 1
    # another token, client, tenant or id is another call; id 0 and probes are never kept
    for method, request, token in (("Remove", _req(7), "other"), ("Remove", _req(7, "d"), "tok"),
                                   ("Remove", _req(7, tenant="u"), "tok"),
                                   ("Remove", _req(8), "tok"), ("Remove", _req(0), "tok"),
                                   ("Exists", _req(9), "tok"), ("Exists", _req(9), "tok")):
        assert _runs(memory, method, request, token) == 1


def test_the_same_id_for_another_method_is_refused() -> None:
    memory = RequestMemory(10, 60.0, 1 << 20, clock=Clock())
    _runs(memory, "Remove", _req(1))
    with pytest.raises(RequestRejected):
        _runs(memory, "PutRevoke", _req(1))


def test_count_age_and_bytes_are_bounded() -> None:
    clock = Clock()
    memory = RequestMemory(3, 60.0, 1 << 20, clock=clock)
    for i in range(1, 6):
        _runs(memory, "Remove", _req(i))
    assert len(memory) == 3 and memory.forgotten == 2
    assert _runs(memory, "Remove", _req(1)) == 1  # forgotten: runs again
    assert _runs(memory, "Remove", _req(5)) == 0
    clock.now = 61.0
    assert _runs(memory, "Remove", _req(5)) == 1  # too old: runs again
    assert len(memory) == 1
    small = RequestMemory(100, 60.0, 2 * (REPLY_BYTES + RESULT_BYTES), clock=clock)
    for i in range(1, 5):
        _runs(small, "Remove", _req(i))
    assert len(small) == 2 and small.bytes == 2 * (REPLY_BYTES + RESULT_BYTES)


def test_a_new_term_forgets_everything() -> None:
    memory = RequestMemory(10, 60.0, 1 << 20, clock=Clock())
    memory.serve("term 1")
    _runs(memory, "Remove", _req(1))
    memory.serve("term 1")
    assert _runs(memory, "Remove", _req(1)) == 0
    memory.serve("term 2")
    assert _runs(memory, "Remove", _req(1)) == 1


def test_a_repeated_put_start_finds_its_own_put_after_the_memory_forgot_it() -> None:
    """The reply memory is bounded; the WRITING object keeps the request that began it, so a
    repeat still gets its put (same put id, grants for the same ranges), never ALREADY_EXISTS;
    another request (or none) still does."""
    from test_master_support import make_service, mount

    from cellar.errors import Status
    from cellar.master.service import PutItem

    svc = make_service()
    mount(svc, "n1", 1)
    mine = ("tok", "client", 41)
    first = svc.put_start("", "client", [PutItem("k", 4096), PutItem("big", 1 << 20)],
                          request=mine).results
    again = svc.put_start("", "client", [PutItem("k", 4096), PutItem("big", 1 << 20)],
                          request=mine).results
    for a, b in zip(first, again, strict=True):
        assert a.status == b.status == Status.OK
        assert a.put_id == b.put_id
        assert [(r.segment_id, r.offset, r.alloc_id) for r in a.replicas] == \
            [(r.segment_id, r.offset, r.alloc_id) for r in b.replicas]
    for other in (("tok", "client", 42), ("tok2", "client", 41), None):
        result = svc.put_start("", "client", [PutItem("k", 4096)], request=other).results[0]
        assert result.status == Status.ALREADY_EXISTS
    svc.check_invariants()


def test_a_repeat_waits_as_long_as_the_first_call() -> None:
    """A Remove that changed a key read lately waits out the read trust (read_trust.py); its
    repeat, answered from memory while the first may still wait, waits as long."""
    from cellar.master.state.read_trust import ReadTrust

    memory = RequestMemory(10, 60.0, 1 << 20, clock=Clock())
    trust = ReadTrust(0.5)

    def first() -> pb.RemoveReply:
        trust.settle_until = 12.5  # what the remove's change set
        return pb.RemoveReply(results=[pb.KeyResult()])

    memory.once("Remove", _req(9), "tok", first, trust)
    assert trust.take() == 12.5
    memory.once("Remove", _req(9), "tok", lambda: pytest.fail("ran twice"), trust)
    assert trust.take() == 12.5
    memory.once("Remove", _req(10), "tok", lambda: pb.RemoveReply(results=[pb.KeyResult()]),
                trust)
    assert trust.take() == 0.0  # another call changed nothing read lately
