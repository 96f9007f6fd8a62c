"""The flows (cellar.client.flows / api) driven by hand: each effect answered by the test, no
sockets. Pins the deadline-bounded get (LATE, prefix cut, budget 0), the put revoke on a failed
write, and the metric Record each public call yields."""

from __future__ import annotations

import time

import pytest

import cellar
from cellar.client import flows, key_flows, operations
from cellar.client.flows import Move, Record, Rpc, Session, Sleep
from cellar.client.session_state import TransportSet
from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.base import ST_CONNECT_FAILED, ST_TIMEOUT, TransferResult, Transport

SEGMENT_BYTES = 1 << 20


class Reach(Transport):
    name = "tcp"

    def read(self, ops, timeout_s):  # never called: the test answers Move itself
        raise AssertionError

    def write(self, ops, timeout_s):
        raise AssertionError


class View:
    generation = 0
    switched_at = -1e9


def session() -> tuple[Session, list[int]]:
    released: list[int] = []
    s = Session("t", pb.RequestHeader(tenant="t", client_id="c"), 5.0, View(),
                TransportSet([Reach()]), released.extend)
    return s, released


def segments() -> list[pb.SegmentInfo]:
    return [pb.SegmentInfo(segment_id=1, node_id="n1", size_bytes=SEGMENT_BYTES, host_id="h",
                           endpoints=[pb.Endpoint(transport="tcp", address="n1:1")])]


def found(size: int, pin: int) -> pb.GetResult:
    return pb.GetResult(size_bytes=size, checksum=0, pin_id=pin, replicas=[pb.Replica(
        node_id="n1", segment_id=1, offset=0, length=size,
        grant=pb.Grant(op=1, alloc_id=1, epoch=1, expiry_ms=1, key_tag=1, mac=b"m" * 16))])


def drive(flow, answer):
    """Run `flow`, answering each effect with answer(effect); (result, effects seen)."""
    seen = []
    send = None
    error = None
    while True:
        try:
            effect = flow.throw(error) if error is not None else flow.send(send)
        except StopIteration as stop:
            return stop.value, seen
        seen.append(effect)
        send, error = None, None
        if not isinstance(effect, (Record, Sleep)):
            try:
                send = answer(effect)
            except Exception as exc:  # handed to the flow, as a face does
                error = exc


def test_budgeted_get_turns_timed_out_reads_late_and_releases_pins():
    s, released = session()
    bufs = [bytearray(4), bytearray(4), bytearray(4)]

    def answer(effect):
        if isinstance(effect, Rpc):
            assert effect.method == "GetReplicas"
            return pb.GetReplicasReply(segments=segments(), results=[
                found(4, 11), pb.GetResult(status=pb.NOT_FOUND), found(4, 12)])
        assert isinstance(effect, Move)
        return [TransferResult(checksum=0), TransferResult(ST_TIMEOUT, "slow node")]

    out, seen = drive(operations.get_many_into(s, ["a", "b", "c"], bufs, timeout_s=5.0), answer)
    assert out == [4, cellar.MISS, cellar.LATE]
    assert released == [11, 12]
    (rec,) = [e for e in seen if isinstance(e, Record)]
    assert (rec.keys, rec.hits, rec.late) == (3, 1, 1)


def test_prefix_mode_reads_nothing_after_a_miss():
    s, _ = session()
    moved = []

    def answer(effect):
        if isinstance(effect, Rpc):
            return pb.GetReplicasReply(segments=segments(), results=[
                found(4, 1), pb.GetResult(status=pb.NOT_FOUND), found(4, 2)])
        moved.append(len(effect.round.ops))
        return [TransferResult(checksum=0)] * len(effect.round.ops)

    out, _ = drive(operations.get_many_into(s, ["a", "b", "c"], [bytearray(4)] * 3, prefix=True,
                                     timeout_s=5.0), answer)
    assert out == [4] and moved == [1]


def test_budget_zero_sends_nothing_and_a_negative_one_is_refused():
    s, _ = session()
    out, seen = drive(operations.get_many_into(s, ["a"], [bytearray(1)], timeout_s=0),
                      lambda e: pytest.fail(f"nothing may be sent: {e}"))
    assert out == [cellar.LATE] and all(isinstance(e, Record) for e in seen)
    with pytest.raises(cellar.InvalidArgument, match="timeout_s"):
        drive(operations.get_many_into(s, ["a"], [bytearray(1)], timeout_s=-1), lambda e: None)


def test_a_budget_that_ends_while_the_master_answers_makes_every_key_late():
    s, released = session()

    def answer(effect):
        time.sleep(0.06)  # the budget ends during the lookup
        raise cellar.Timeout("GetReplicas: timed out")

    out, _ = drive(operations.get_many_into(s, ["a", "b"], [bytearray(1)] * 2, timeout_s=0.05), answer)
    assert out == [cellar.LATE, cellar.LATE] and released == []


def test_a_failed_write_is_revoked_and_reported_per_key():
    s, _ = session()
    calls = []

    def answer(effect):
        if isinstance(effect, Rpc):
            calls.append(effect.method)
            if effect.method == "PutStart":
                return pb.PutStartReply(segments=segments(), results=[pb.PutStartResult(
                    put_id=5, replicas=[pb.Replica(node_id="n1", segment_id=1, offset=0, length=3,
                                                   grant=pb.Grant(op=2, mac=b"m" * 16))])])
            return pb.PutRevokeReply()
        return [TransferResult(ST_CONNECT_FAILED, "refused")]

    s.health.mark_failed("other")  # unrelated node: the one retry still goes to n1
    out, _ = drive(operations.put_many(s, {"k": b"abc"}), answer)
    assert out == [Status.UNAVAILABLE]
    assert calls.count("PutRevoke") == calls.count("PutStart") >= 1
    assert "PutEnd" not in calls


def test_a_put_whose_master_restarted_mid_put_recognises_its_own_write():
    """The single master restarts (same address: no leader change for the link) after our
    bytes were sealed and before PutEnd was answered; the new master adopted our write from
    the nodes. PutEnd there answers NOT_FOUND under a new epoch, the key is placed again and
    finds itself taken: by our own bytes (size and checksum), so the put is OK, not
    AlreadyExists. Negative control: the same exchange with other bytes stored raises."""
    from cellar.client.checks import checksum

    def run(stored_checksum: int) -> tuple[list[Status], list[str]]:
        s, _ = session()
        calls: list[str] = []
        value = b"abc"

        def answer(effect):
            if isinstance(effect, Rpc):
                calls.append(effect.method)
                starts = calls.count("PutStart")
                if effect.method == "PutStart" and starts == 1:
                    return pb.PutStartReply(header=pb.ReplyHeader(epoch=1), segments=segments(),
                                            results=[pb.PutStartResult(put_id=5, replicas=[
                                                pb.Replica(node_id="n1", segment_id=1, offset=0,
                                                           length=3, grant=pb.Grant(op=2, mac=b"m" * 16))])])
                if effect.method == "PutStart":
                    return pb.PutStartReply(header=pb.ReplyHeader(epoch=2), results=[
                        pb.PutStartResult(status=pb.ALREADY_EXISTS, message="exists")])
                if effect.method == "PutEnd":
                    return pb.PutEndReply(header=pb.ReplyHeader(epoch=2), results=[
                        pb.KeyResult(status=pb.NOT_FOUND, message="key is not being written")])
                assert effect.method == "GetReplicas"
                return pb.GetReplicasReply(header=pb.ReplyHeader(epoch=2), results=[
                    pb.GetResult(size_bytes=len(value), checksum=stored_checksum, pin_id=0)])
            return [TransferResult(receipt=b"r" * 8)]

        try:
            out, _ = drive(operations.put_many(s, {"k": value}), answer)
        except cellar.AlreadyExists:
            out = [Status.ALREADY_EXISTS]
        return out, calls

    out, calls = run(checksum(memoryview(b"abc")))
    assert out == [Status.OK] and calls == ["PutStart", "PutEnd", "PutStart", "GetReplicas"]
    out, _ = run(checksum(memoryview(b"abd")))
    assert out == [Status.ALREADY_EXISTS]


def test_each_public_call_records_what_it_did():
    s, _ = session()
    out, seen = drive(operations.prefix_len(s, ["a", "b", "c"]),
                      lambda e: pb.PrefixLenReply(prefix_len=2))
    assert out == 2 and [(r.keys, r.hits) for r in seen if isinstance(r, Record)] == [(3, 2)]
    out, seen = drive(operations.exists_many(s, ["a", "b"]),
                      lambda e: pb.ExistsReply(statuses=[pb.OK, pb.NOT_FOUND]))
    assert out == [True, False] and [(r.keys, r.hits) for r in seen if isinstance(r, Record)] \
        == [(2, 1)]


def test_flows_never_block_on_their_own():
    """A put flow that must back off yields Sleep instead of sleeping (the face waits)."""
    assert flows.FAILOVER_BACKOFF_FIRST_S > 0
    s, _ = session()
    s.master.switched_at = time.monotonic()  # a leader change just happened

    def answer(effect):
        if effect.method == "PutStart":
            return pb.PutStartReply(results=[pb.PutStartResult(status=pb.UNAVAILABLE)])
        raise AssertionError(effect.method)

    out, seen = drive(operations.put_many(s, {"k": b"v"}), answer)
    assert any(isinstance(e, Sleep) for e in seen) and out == [Status.UNAVAILABLE]


# ---- key listing --------------------------------------------------------------------------

def pages(store: list[str]):
    """An answer that serves ListKeys pages of `store` (sorted) as the master would."""
    asked: list[pb.ListKeysRequest] = []

    def answer(effect):
        assert isinstance(effect, Rpc) and effect.method == "ListKeys"
        req = effect.request
        asked.append(req)
        match = [k for k in sorted(store) if k.startswith(req.prefix) and k > req.start_after]
        return pb.ListKeysReply(keys=match[:req.limit], more=len(match) > req.limit)

    return answer, asked


def test_list_all_keys_walks_pages_from_the_last_key():
    s, _ = session()
    store = [f"p/{i:02}" for i in range(7)] + ["q/0"]
    answer, asked = pages(store)
    keys, _ = drive(operations.list_all_keys(s, "p/", 3), answer)
    assert keys == store[:7]
    assert [(r.start_after, r.limit) for r in asked] == [("", 3), ("p/02", 3), ("p/05", 3)]
    one, _ = drive(operations.list_keys(s, "p/", "p/03", 2), pages(store)[0])
    assert one == ["p/04", "p/05"]


def test_list_all_keys_stops_past_its_cap():
    s, _ = session()
    answer, asked = pages([f"k{i}" for i in range(10)])
    with pytest.raises(cellar.InvalidArgument, match="more than 4 keys"):
        drive(key_flows.list_all_keys(s, "", 3, 4), answer)
    assert len(asked) == 2  # stopped as soon as the walk passed the cap


@pytest.mark.parametrize(("prefix", "reply"), [
    ("", pb.ListKeysReply(keys=[], more=True)),           # no progress
    ("", pb.ListKeysReply(keys=["b", "a"])),              # out of order
    ("", pb.ListKeysReply(keys=["a", "b", "c", "d"])),    # over the limit
    ("p/", pb.ListKeysReply(keys=["x/1"])),               # off the prefix
])
def test_a_page_that_breaks_the_contract_is_an_error(prefix, reply):
    s, _ = session()
    with pytest.raises(cellar.CellarError, match="ListKeys"):
        drive(key_flows.list_keys(s, prefix, "", 3), lambda effect: reply)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"prefix": 7}, "prefix must be a str"),
    ({"prefix": b"p/"}, "prefix must be a str"),
    ({"start_after": None}, "start_after must be a str"),
    ({"limit": 0}, "limit must be between 1 and 1000"),
    ({"limit": 1001}, "limit must be between 1 and 1000"),
    ({"limit": True}, "limit must be an int"),
    ({"prefix": "x" * 1025}, "prefix is 1025 bytes"),
])
def test_bad_list_arguments_send_nothing(kwargs, says):
    s, _ = session()
    with pytest.raises(cellar.InvalidArgument, match=says):
        drive(operations.list_keys(s, **kwargs), lambda effect: pytest.fail("sent a request"))
