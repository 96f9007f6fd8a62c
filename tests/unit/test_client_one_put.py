"""A one-key put under a held allocation made as one write and one PutEnd (client/one_put.py):
the logic, on fake replies and a fake transport. It is planned only with a held allocation of
the value's size and replica count and hints that may put ahead; its PutEnd carries the
receipt and the put's fields; a failed write marks the node and asks the face to fall back;
OK counts the put; AlreadyExists is raised as the general flow would raise it; anything else
(a refused allocation, a new master, an AlreadyExists near a leader change or for an upsert)
hands the call to the general flow. The real-process checks are
tests/integration/test_sdk_one_put.py."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
import xxhash

import cellar
from cellar.client import metrics, one_put
from cellar.client.flows import Session
from cellar.client.put_ahead import Ahead, PutAheadPool
from cellar.client.puts import PutHints
from cellar.client.session_state import TransportSet
from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_WRITE, Grant
from cellar.transfer.base import ST_CONNECTION_LOST, SegmentRoute, TransferResult

SIZE = 4096
VALUE = memoryview(bytes(range(256)) * (SIZE // 256))
EPOCH = 7


class FakeTransport:
    name = "tcp"
    hashes_writes = False

    def __init__(self) -> None:
        self.forgotten: list[Any] = []

    def can_reach(self, route: Any) -> bool:
        return True

    def forget(self, route: Any) -> None:
        self.forgotten.append(route)


class View:
    generation = 0
    switched_at = -1e9


def held_session(count: int = 2) -> tuple[Session, PutAheadPool]:
    pool = PutAheadPool()
    route = SegmentRoute(1, "node-a", "host", {"tcp": "127.0.0.1:1"})
    grant = Grant(GRANT_OP_WRITE, 1, 0, SIZE, 100, EPOCH, 1 << 60, 0, b"m" * 32)
    pool._held[SIZE, 1] = deque(Ahead(100 + i, ((route, grant, False),), EPOCH, 1e18)
                                for i in range(count))
    pool._epoch = EPOCH
    s = Session("t", pb.RequestHeader(tenant="t", client_id="c"), 5.0, View(),
                TransportSet([FakeTransport()]), lambda ids: None, aheads=pool)
    return s, pool


def plan(s: Session, **kw: Any) -> one_put.OnePut | None:
    how: dict[str, Any] = {"replicas": 1, "soft_pin": False, "upsert": False, "hints": None}
    return one_put.plan(s, "k", VALUE, **(how | kw))


def reply(status: Status, epoch: int = EPOCH) -> Any:
    return pb.PutEndReply(header=pb.ReplyHeader(epoch=epoch, master_time_ms=1),
                          results=[pb.KeyResult(status=int(status))])


def puts_counted() -> float:
    return metrics.REGISTRY.get_sample_value("cellar_client_requests_total", {"op": "put"}) or 0.0


def test_planned_only_under_a_held_allocation_of_the_size_and_hints_that_put_ahead() -> None:
    s, pool = held_session()
    assert plan(s, replicas=2) is None  # none held of that replica count
    assert plan(s, hints=PutHints(hard_pin=True)) is None
    one = plan(s)
    assert one is not None and pool.held() == 1
    (op,) = one.ops
    assert op.meta is not None and op.meta.key == "k"
    assert op.meta.checksum == xxhash.xxh3_64_intdigest(VALUE)  # tcp does not hash as it copies
    assert one.entry.put_id == 100


def test_the_put_end_carries_the_receipt_and_the_puts_fields() -> None:
    s, _ = held_session()
    one = plan(s, soft_pin=True)
    assert one is not None
    request = one_put.end_request(s, one, [TransferResult(receipt=b"r" * 40)])
    (item,) = request.items
    assert (item.key, item.put_id, list(item.receipts)) == ("k", 100, [b"r" * 40])
    assert item.bind.size_bytes == SIZE and item.bind.soft_pin and not item.bind.upsert
    assert item.checksum == xxhash.xxh3_64_intdigest(VALUE)


def test_a_failed_write_marks_the_node_and_falls_back() -> None:
    s, _ = held_session()
    one = plan(s)
    assert one is not None
    assert one_put.end_request(s, one, [TransferResult(ST_CONNECTION_LOST, "gone")]) is None
    assert "node-a" in s.health.unhealthy()
    assert one.transport.forgotten == [one.ops[0].route]
    method, request, _ = one_put.revoke_request(s, one)
    assert method == "PutRevoke" and [(r.key, r.put_id) for r in request.items] == [("", 100)]
    one = plan(s)  # the node is unhealthy now: its allocation is dropped, not used
    assert one is None


def test_a_write_without_a_receipt_falls_back() -> None:
    s, _ = held_session()
    one = plan(s)
    assert one is not None
    assert one_put.end_request(s, one, [TransferResult()]) is None


def finished(status: Status, epoch: int = EPOCH, pool: list[PutAheadPool] | None = None,
             **kw: Any) -> bool:
    s, held = held_session()
    if pool is not None:
        pool.append(held)
    one = plan(s, **kw)
    assert one is not None
    one_put.end_request(s, one, [TransferResult(receipt=b"r")])
    return one_put.finish(s, one, reply(status, epoch), 1e-4, 1e-4)


def test_ok_counts_the_put_and_already_exists_is_raised_as_the_flow_would() -> None:
    counted = puts_counted()
    pools: list[PutAheadPool] = []
    assert finished(Status.OK, pool=pools) is True
    assert puts_counted() == counted + 1 and pools[0].one_step == 1
    with pytest.raises(cellar.AlreadyExists):
        finished(Status.ALREADY_EXISTS)
    assert puts_counted() == counted + 2  # a request that stored nothing new, as the flow's


@pytest.mark.parametrize("status,epoch,upsert", [
    (Status.EXPIRED, EPOCH, False),          # an allocation older than the key's last version
    (Status.NOT_FOUND, EPOCH, False),        # ... unknown to the master
    (Status.ALREADY_EXISTS, EPOCH + 1, False),  # a new master: the flow settles own writes
    (Status.UNAVAILABLE, EPOCH, False),
    (Status.ALREADY_EXISTS, EPOCH, True),    # an upsert is never refused so: ask again
])
def test_anything_else_hands_the_call_to_the_general_flow(status: Status, epoch: int,
                                                          upsert: bool) -> None:
    counted = puts_counted()
    assert finished(status, epoch, upsert=upsert) is False
    assert puts_counted() == counted  # the general flow counts the call
