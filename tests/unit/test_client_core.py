"""The SDK's protocol core (cellar.client.session_state), driven with hand-built replies: no I/O."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import xxhash

import cellar
from cellar.client import checks, gets, puts, session_state, statuses
from cellar.client.checks import Limits
from cellar.client.gets import GetBatch
from cellar.client.puts import PutBatch
from cellar.client.session_state import NodeHealth, TransportSet, UnpinQueue
from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.base import (
    ST_CONNECT_FAILED,
    SegmentRoute,
    TransferResult,
    Transport,
)
from cellar.transfer.frame import ST_BAD_GRANT, ST_OK

HEADER = pb.RequestHeader(tenant="t", client_id="c")
SEGMENT_BYTES = 1 << 20


def seg(segment_id: int, node: str) -> pb.SegmentInfo:
    return pb.SegmentInfo(segment_id=segment_id, node_id=node, size_bytes=SEGMENT_BYTES,
                          host_id="h", endpoints=[pb.Endpoint(transport="tcp", address=f"{node}:1")])


def replica(segment_id: int, node: str, offset: int, length: int) -> pb.Replica:
    return pb.Replica(node_id=node, segment_id=segment_id, offset=offset, length=length,
                      grant=pb.Grant(op=1, alloc_id=7, epoch=1, expiry_ms=99, key_tag=5,
                                     mac=b"m" * 16))


OK = TransferResult(receipt=b"r" * 68)  # a node receipt (the master checks it, not the SDK)
REFUSED = TransferResult(ST_CONNECT_FAILED, "refused")


# ---- validation and batching --------------------------------------------------------------

@pytest.mark.parametrize("key, why", [
    ("", "empty"), (b"k", "str"), (5, "str"), (None, "str"), ("é" * 513, "1026 bytes"),
    ("\udc80", "Unicode"),
])
def test_bad_keys(key, why):
    with pytest.raises(cellar.InvalidArgument, match=why):
        checks.validate_key(key, 1024)


def test_key_limit_counts_utf8_bytes():
    assert checks.validate_key("é" * 512, 1024) == "é" * 512
    assert checks.validate_key("k" * 1024, 1024)


def test_validate_keys_refuses_a_lone_string_and_names_the_index():
    with pytest.raises(cellar.InvalidArgument, match="sequence of str"):
        checks.validate_keys("abc", 1024)
    with pytest.raises(cellar.InvalidArgument, match=r"keys\[1\]"):
        checks.validate_keys(["a", ""], 1024)
    assert checks.validate_keys(iter(["a", "b"]), 1024) == ["a", "b"]


def test_normalize_items():
    assert [k for k, _ in checks.normalize_items({"a": b"1", "b": b"22"}, 1024)] == ["a", "b"]
    pairs = checks.normalize_items([("a", b"1"), ("b", bytearray(b"22"))], 1024)
    assert [(k, v.tobytes()) for k, v in pairs] == [("a", b"1"), ("b", b"22")]
    with pytest.raises(cellar.InvalidArgument, match="twice"):
        checks.normalize_items([("a", b"1"), ("a", b"2")], 1024)
    with pytest.raises(cellar.InvalidArgument, match="pair"):
        checks.normalize_items([("a", b"1", 3)], 1024)
    with pytest.raises(cellar.InvalidArgument, match="empty"):
        checks.normalize_items({"a": b""}, 1024)
    with pytest.raises(cellar.InvalidArgument):
        checks.normalize_items(b"ab", 1024)


@pytest.mark.parametrize("replicas", [0, -1, 17, "2", 1.0, True, None])
def test_bad_replicas(replicas):
    with pytest.raises(cellar.InvalidArgument):
        checks.validate_replicas(replicas)


def test_transport_names():
    assert checks.transport_names("auto") == ("shm", "rdma", "tcp")
    assert checks.transport_names("tcp") == ("tcp",)
    for bad in ("udp", "", None, 3):
        with pytest.raises(cellar.InvalidArgument):
            checks.transport_names(bad)


def test_batch_ranges_split_in_order():
    assert [list(r) for r in checks.batch_ranges(5, 2)] == [[0, 1], [2, 3], [4]]
    assert list(checks.batch_ranges(0, 3)) == []
    assert [len(r) for r in checks.batch_ranges(2048, 1024)] == [1024, 1024]
    with pytest.raises(ValueError):
        list(checks.batch_ranges(3, 0))


def test_limits_fall_back_to_defaults():
    assert Limits.from_status(pb.ClusterStatusReply()) == Limits(1024, 1024, 0)
    reply = pb.ClusterStatusReply(max_key_bytes=64, max_batch_keys=8, max_object_bytes=99)
    assert Limits.from_status(reply) == Limits(64, 8, 99)
    assert Limits.from_status(pb.ClusterStatusReply(max_list_keys=7)).max_list_keys == 7
    assert Limits.from_status(pb.ClusterStatusReply()).max_list_keys == 1000


# ---- error mapping ------------------------------------------------------------------------

@pytest.mark.parametrize("status, cls", [
    (Status.NOT_FOUND, cellar.NotFound), (Status.ALREADY_EXISTS, cellar.AlreadyExists),
    (Status.NO_SPACE, cellar.NoSpace), (Status.QUOTA_EXCEEDED, cellar.QuotaExceeded),
    (Status.NOT_READY, cellar.NotReady), (Status.INVALID, cellar.InvalidArgument),
    (Status.UNAVAILABLE, cellar.Unavailable), (Status.EXPIRED, cellar.Unavailable),
    (Status.PERMISSION_DENIED, cellar.PermissionDenied), (Status.INTERNAL, cellar.CellarError),
    (999, cellar.CellarError),
])
def test_status_to_exception(status, cls):
    exc = statuses.status_error(status, "", "k1")
    assert type(exc) is cls
    assert "'k1'" in str(exc)


def test_not_found_is_also_a_key_error():
    exc = statuses.status_error(Status.NOT_FOUND, "no such key", "k")
    assert isinstance(exc, KeyError) and str(exc) == "'k': no such key"


@pytest.mark.parametrize("code, cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, cellar.InvalidArgument),
    (grpc.StatusCode.UNAVAILABLE, cellar.Unavailable),
    (grpc.StatusCode.DEADLINE_EXCEEDED, cellar.Timeout),
    (grpc.StatusCode.PERMISSION_DENIED, cellar.PermissionDenied),
    (grpc.StatusCode.UNAUTHENTICATED, cellar.Unauthenticated),
    (grpc.StatusCode.FAILED_PRECONDITION, cellar.NotReady),
    (grpc.StatusCode.INTERNAL, cellar.CellarError),
    (None, cellar.CellarError),
])
def test_grpc_code_to_exception(code, cls):
    exc = statuses.grpc_error("PutStart", "m:1", code, "batch of 2000 keys over the limit 1024")
    assert type(exc) is cls
    assert "over the limit" in str(exc)
    assert isinstance(cellar.Timeout("x"), TimeoutError)


def test_invalid_argument_keeps_the_servers_message_verbatim():
    exc = statuses.grpc_error("GetReplicas", "m:1", grpc.StatusCode.INVALID_ARGUMENT, "bad tenant")
    assert str(exc) == "bad tenant"


# ---- put ----------------------------------------------------------------------------------

def make_put(keys, health=None, max_attempts=3):
    pairs = [(k, memoryview(k.encode() * 10)) for k in keys]
    return PutBatch(puts.put_entries(pairs), tenant="t", replicas=2, soft_pin=False,
                    upsert=False, health=health or NodeHealth(), max_attempts=max_attempts)


def placed(batch, start_req, placement):
    """A PutStart reply placing each key on the listed nodes (node name -> segment id)."""
    results = []
    nodes = sorted({n for nodes in placement for n in nodes or ()})
    sids = {n: i + 1 for i, n in enumerate(nodes)}
    for item, node_list in zip(start_req.items, placement, strict=True):
        if node_list is None:
            results.append(pb.PutStartResult(status=Status.ALREADY_EXISTS, message="exists"))
            continue
        reps = [replica(sids[n], n, 4096 * j, item.size_bytes) for j, n in enumerate(node_list)]
        results.append(pb.PutStartResult(status=Status.OK, put_id=len(results) + 100, replicas=reps))
    return pb.PutStartReply(results=results, segments=[seg(sids[n], n) for n in nodes])


def test_put_values_hashed_late_carry_the_same_checksums():
    """Values left unhashed (the SDK hashes them while PutStart is in flight) get their
    checksum by hash_values, or at the latest when their writes are planned."""
    pairs = [(k, memoryview(k.encode() * 10)) for k in "ab"]
    entries = puts.put_entries(pairs)
    assert [e.checksum for e in entries] == [None, None]
    assert puts.unhashed_bytes(entries) == 20
    puts.hash_values(entries[:1])
    assert entries[0].checksum == xxhash.xxh3_64_intdigest(b"a" * 10)
    assert puts.unhashed_bytes(entries) == 10
    batch = PutBatch(entries, tenant="t", replicas=1, soft_pin=False, upsert=False,
                     health=NodeHealth())
    req = batch.start_request(HEADER)
    ops = batch.on_start_reply(placed(batch, req, [["n1"], ["n1"]]))
    assert [op.meta.checksum for op in ops] == [xxhash.xxh3_64_intdigest(k.encode() * 10)
                                                for k in "ab"]
    end, _ = batch.on_write_results([OK, OK], may_retry=True)
    assert [i.checksum for i in end] == [op.meta.checksum for op in ops]


def test_put_plans_one_write_per_replica_with_checksum_meta():
    batch = make_put(["a", "b"])
    req = batch.start_request(HEADER)
    assert [i.key for i in req.items] == ["a", "b"] and req.items[0].replicas == 2
    assert req.items[0].size_bytes == 10
    ops = batch.on_start_reply(placed(batch, req, [["n1", "n2"], None]))
    assert len(ops) == 2
    assert {op.route.node_id for op in ops} == {"n1", "n2"}
    assert ops[0].meta.checksum == xxhash.xxh3_64_intdigest(b"a" * 10)
    assert ops[0].meta.key == "a" and ops[0].meta.tenant == "t" and ops[0].meta.object_size == 10
    assert ops[0].grant.op == 1 and ops[0].grant.length == 10 and ops[0].grant.segment_id == 1
    end, revoke = batch.on_write_results([OK, OK], may_retry=True)
    assert revoke is None and [i.key for i in end] == ["a"]
    assert end[0].checksum == xxhash.xxh3_64_intdigest(b"a" * 10)
    batch.on_end_reply(pb.PutEndReply(results=[pb.KeyResult(status=Status.OK)]))
    assert batch.done
    assert [e.status for e in batch.entries] == [Status.OK, Status.ALREADY_EXISTS]
    assert batch.start_request(HEADER) is None


def test_failed_replica_revokes_and_retries_elsewhere():
    health = NodeHealth()
    batch = make_put(["a"], health)
    req = batch.start_request(HEADER)
    assert list(req.items[0].avoid_node_ids) == []
    batch.on_start_reply(placed(batch, req, [["dead", "n2"]]))
    end, revoke = batch.on_write_results([REFUSED, OK], may_retry=True)
    assert end is None and [r.key for r in revoke] == ["a"] and revoke[0].put_id == 100
    assert not batch.done and "dead" in health.unhealthy()
    req = batch.start_request(HEADER)
    assert list(req.items[0].avoid_node_ids) == ["dead"]
    batch.on_start_reply(placed(batch, req, [["n2", "n3"]]))
    end, revoke = batch.on_write_results([OK, OK], may_retry=True)
    assert revoke is None and len(end) == 1
    batch.on_end_reply(pb.PutEndReply(results=[pb.KeyResult(status=Status.OK)]))
    assert batch.entries[0].status == Status.OK


def test_put_lost_by_a_restarted_master_is_written_again():
    batch = make_put(["a"])
    req = batch.start_request(HEADER)
    reply = placed(batch, req, [["n1", "n2"]])
    reply.header.epoch = 5
    batch.on_start_reply(reply)
    end, _ = batch.on_write_results([OK, OK], may_retry=True)
    # the master restarted (epoch 6) and never heard of put 100
    lost = pb.PutEndReply(results=[pb.KeyResult(status=Status.NOT_FOUND)])
    lost.header.epoch = 6
    batch.on_end_reply(lost)
    assert not batch.done  # not settled as NOT_FOUND: placed again
    req = batch.start_request(HEADER)
    assert [i.key for i in req.items] == ["a"]
    reply = placed(batch, req, [["n1", "n2"]])
    reply.header.epoch = 6
    batch.on_start_reply(reply)
    batch.on_write_results([OK, OK], may_retry=True)
    done = pb.PutEndReply(results=[pb.KeyResult(status=Status.OK)])
    done.header.epoch = 6
    batch.on_end_reply(done)
    assert batch.entries[0].status == Status.OK


def test_same_master_not_found_at_put_end_is_final():
    batch = make_put(["a"])
    req = batch.start_request(HEADER)
    batch.on_start_reply(placed(batch, req, [["n1", "n2"]]))
    batch.on_write_results([OK, OK], may_retry=True)
    batch.on_end_reply(pb.PutEndReply(results=[pb.KeyResult(status=Status.NOT_FOUND)]))
    assert batch.entries[0].status == Status.NOT_FOUND


def test_retries_are_bounded():
    batch = make_put(["a"], max_attempts=2)
    for _ in range(2):
        req = batch.start_request(HEADER)
        batch.on_start_reply(placed(batch, req, [["n1"]]))
        batch.on_write_results([TransferResult(ST_BAD_GRANT, "mac")], may_retry=True)
    assert batch.done and batch.entries[0].status == Status.UNAVAILABLE
    assert "bad grant" in batch.entries[0].message
    assert isinstance(batch.entries[0].error(), cellar.Unavailable)


def test_no_retry_without_time_left():
    batch = make_put(["a"])
    req = batch.start_request(HEADER)
    batch.on_start_reply(placed(batch, req, [["n1"]]))
    _, revoke = batch.on_write_results([REFUSED], may_retry=False)
    assert revoke and batch.done and batch.entries[0].status == Status.UNAVAILABLE


def test_health_avoidance_is_dropped_when_it_leaves_no_room():
    health = NodeHealth()
    health.mark_failed("n9")
    batch = make_put(["a"], health)
    req = batch.start_request(HEADER)
    assert list(req.items[0].avoid_node_ids) == ["n9"]
    batch.on_start_reply(pb.PutStartReply(results=[pb.PutStartResult(status=Status.UNAVAILABLE)]))
    assert not batch.done
    req = batch.start_request(HEADER)
    assert list(req.items[0].avoid_node_ids) == []


def test_bad_placement_is_revoked_not_written():
    batch = make_put(["a"])
    req = batch.start_request(HEADER)
    reply = placed(batch, req, [["n1"]])
    reply.results[0].replicas[0].offset = SEGMENT_BYTES - 4  # runs past the segment
    assert batch.on_start_reply(reply) == []
    end, revoke = batch.on_write_results([], may_retry=True)
    assert end is None and len(revoke) == 1
    assert batch.entries[0].status == Status.INTERNAL


def test_result_count_mismatch_is_an_error():
    batch = make_put(["a", "b"])
    batch.start_request(HEADER)
    with pytest.raises(cellar.CellarError, match="1 results for 2 keys"):
        batch.on_start_reply(pb.PutStartReply(results=[pb.PutStartResult()]))


def test_abandon_settles_everything():
    batch = make_put(["a", "b"])
    req = batch.start_request(HEADER)
    batch.on_start_reply(placed(batch, req, [["n1"], ["n1"]]))
    refs = batch.abandon("master went away")
    assert [r.key for r in refs] == ["a", "b"]
    assert all(e.status == Status.UNAVAILABLE for e in batch.entries)


# ---- get ----------------------------------------------------------------------------------

def get_reply(values, nodes=("n1", "n2"), missing=()):
    results = []
    for i, (key, value) in enumerate(values.items()):
        if key in missing:
            results.append(pb.GetResult(status=Status.NOT_FOUND))
            continue
        reps = [replica(j + 1, n, 4096 * i, len(value)) for j, n in enumerate(nodes)]
        results.append(pb.GetResult(status=Status.OK, size_bytes=len(value), pin_id=i + 1,
                                    checksum=xxhash.xxh3_64_intdigest(value), replicas=reps))
    return pb.GetReplicasReply(results=results,
                               segments=[seg(j + 1, n) for j, n in enumerate(nodes)])


def fill(ops, values_by_node):
    """A fake read: copy each op's bytes from a node's idea of the value."""
    out = []
    for op in ops:
        data = values_by_node.get(op.route.node_id)
        if data is None:
            out.append(REFUSED)
            continue
        op.buffer[:] = data[:len(op.buffer)]
        out.append(OK)
    return out


def test_get_reads_one_replica_and_verifies():
    batch = GetBatch(["a", "b"], None, health=NodeHealth())
    req = batch.request(HEADER, [9, 10])
    assert list(req.keys) == ["a", "b"] and list(req.unpin_ids) == [9, 10]
    batch.on_reply(get_reply({"a": b"AAAA", "b": b"BB"}, missing={"b"}))
    assert batch.pin_ids == [1]
    ops = batch.next_ops()
    assert len(ops) == 1 and ops[0].route.node_id == "n1" and ops[0].grant.op == 1
    batch.on_read_results(fill(ops, {"n1": b"AAAA"}))
    assert batch.next_ops() == []
    a, b = batch.entries
    assert a.status == Status.OK and a.view.tobytes() == b"AAAA"
    assert b.is_miss and isinstance(b.error(), cellar.NotFound)


def test_get_falls_back_on_checksum_mismatch_and_transfer_error():
    health = NodeHealth()
    batch = GetBatch(["a"], None, health=health)
    batch.on_reply(get_reply({"a": b"good"}, nodes=("bad", "gone", "ok")))
    batch.on_read_results(fill(batch.next_ops(), {"bad": b"evil"}))
    assert batch.entries[0].status is None and batch.entries[0].corrupt == 1
    batch.on_read_results(fill(batch.next_ops(), {}))           # "gone" refuses
    assert "gone" in health.unhealthy()
    batch.on_read_results(fill(batch.next_ops(), {"ok": b"good"}))
    assert batch.entries[0].status == Status.OK and batch.entries[0].view.tobytes() == b"good"


def test_all_replicas_corrupt_is_integrity_error():
    batch = GetBatch(["a"], None, health=NodeHealth())
    batch.on_reply(get_reply({"a": b"good"}))
    while ops := batch.next_ops():
        batch.on_read_results(fill(ops, {"n1": b"bad1", "n2": b"bad2"}))
    entry = batch.entries[0]
    assert not entry.is_miss
    with pytest.raises(cellar.IntegrityError, match="checksum"):
        gets.miss_or_raise(entry)


def test_no_reachable_replica_is_unavailable_or_a_batch_miss():
    batch = GetBatch(["a"], None, health=NodeHealth())
    batch.on_reply(get_reply({"a": b"good"}))
    while ops := batch.next_ops():
        batch.on_read_results(fill(ops, {}))
    entry = batch.entries[0]
    assert isinstance(entry.error(), cellar.Unavailable) and entry.is_miss
    gets.miss_or_raise(entry)  # a miss in get_many, no exception


def test_unhealthy_nodes_are_tried_last():
    health = NodeHealth()
    health.mark_failed("n1")
    batch = GetBatch(["a"], None, health=health)
    batch.on_reply(get_reply({"a": b"x"}))
    assert batch.next_ops()[0].route.node_id == "n2"


def test_buffer_too_small_is_raised_before_any_transfer():
    small, big = bytearray(2), bytearray(10)
    batch = GetBatch(["a", "b"], [memoryview(big), memoryview(small)], health=NodeHealth())
    with pytest.raises(cellar.BufferTooSmall) as info:
        batch.on_reply(get_reply({"a": b"AAAA", "b": b"BBBB"}))
    assert info.value.needed_bytes == 4 and "'b'" in str(info.value)
    assert isinstance(info.value, cellar.InvalidArgument)
    assert batch.pin_ids == [1, 2]  # still released by the caller
    assert small == bytearray(2) and big == bytearray(10)


def test_get_into_writes_only_the_object_bytes():
    dest = bytearray(b"\xee" * 8)
    batch = GetBatch(["a"], [memoryview(dest)], health=NodeHealth())
    batch.on_reply(get_reply({"a": b"AAAA"}))
    batch.on_read_results(fill(batch.next_ops(), {"n1": b"AAAA"}))
    assert batch.entries[0].size == 4 and dest == bytearray(b"AAAA\xee\xee\xee\xee")


def test_reply_sizes_are_checked_against_the_segment():
    reply = get_reply({"a": b"AAAA"})
    for r in reply.results[0].replicas:
        r.length = SEGMENT_BYTES * 4
    reply.results[0].size_bytes = SEGMENT_BYTES * 4
    batch = GetBatch(["a"], None, health=NodeHealth())
    batch.on_reply(reply)  # never allocates 4 MiB for a range outside the segment
    assert batch.entries[0].status == Status.UNAVAILABLE and batch.entries[0].view is None


# ---- shared state -------------------------------------------------------------------------

def test_node_health_expires():
    health = NodeHealth(unhealthy_s=1.0)
    health.mark_failed("n", now=100.0)
    assert health.unhealthy(now=100.5) == {"n"}
    assert health.unhealthy(now=101.5) == set()


def test_unpin_queue_is_bounded_and_ordered():
    q = UnpinQueue(capacity=4)
    assert q.add([1, 2]) is False
    assert q.add([0]) is False            # pin id 0 means "no pin"
    assert q.add([3, 4]) is True          # full: flush now
    assert q.drain(3) == [1, 2, 3]
    q.requeue([1, 2])
    assert q.drain() == [1, 2, 4]
    q.add(range(1, 20))
    assert len(q) == 8 and q.dropped == 11


def test_unpin_queue_wait_due_and_close():
    q = UnpinQueue()
    queued_at = time.monotonic()
    q.add([1])
    assert q.wait_due(0.05) is True
    # the contract, not a speed: it returned only once the oldest pin was 0.05 s old
    assert time.monotonic() - queued_at >= 0.05
    results = []
    thread = threading.Thread(target=lambda: results.append(q.wait_due(0.05)))
    q.drain()
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and results == []  # an empty queue is never due: still waiting
    q.close()
    thread.join(5)
    assert not thread.is_alive() and results == [False]  # close wakes it, with False


def test_unpin_queue_does_not_wake_the_flusher_for_every_single_get():
    """A stream of single gets (each rides the last pin, then queues its own): the flusher is
    not handed the GIL for every add (once per get cost a tenth of a get's client time), and
    what is queued still comes due."""
    q = UnpinQueue()
    wakes = []
    notify_all = q._cond.notify_all
    q._cond.notify_all = lambda: (wakes.append(1), notify_all())[1]
    flushed: list[int] = []

    def flusher() -> None:  # as the sync face's _UnpinFlusher, with a short delay
        while q.wait_due(0.02):
            flushed.extend(q.drain())

    thread = threading.Thread(target=flusher, daemon=True)
    thread.start()
    for pin in range(1, 201):      # many delays long: the flusher cycles through every state
        q.drain()                  # the get's GetReplicas carries the queued pin
        time.sleep(0.001)          # its reads (the GIL is free: the flusher may run)
        q.add([pin])               # and its own pin is queued
    assert len(wakes) <= 100       # was one per add
    for _ in range(1000):          # the last pin still comes due and is flushed
        if 200 in flushed:
            break
        time.sleep(0.01)
    assert 200 in flushed
    q.close()
    thread.join(10)
    assert not thread.is_alive()


def test_unpin_queue_wakes_a_flusher_asleep_on_a_quiet_queue():
    q = UnpinQueue()
    results = []
    thread = threading.Thread(target=lambda: results.append(q.wait_due(0.05)), daemon=True)
    thread.start()
    while True:  # until it has waited a whole delay on the empty queue and sleeps untimed
        with q._cond:
            if q._idle_waiters:
                break
        time.sleep(0.001)
    q.add([7])
    thread.join(10)
    assert results == [True] and q.drain() == [7]


class FakeTransport(Transport):
    def __init__(self, name, reach):
        self.name = name
        self._reach = reach

    def can_reach(self, route):
        return route.node_id in self._reach

    def write(self, ops, timeout_s):
        return [TransferResult(ST_OK)] * len(ops)

    read = write


def test_transport_set_picks_first_that_reaches():
    from cellar.transfer.base import TransferOp

    shm, tcp = FakeTransport("shm", {"local"}), FakeTransport("tcp", {"local", "remote"})
    tset = TransportSet([shm, tcp])
    routes = [SegmentRoute(1, n, "h") for n in ("remote", "local", "nowhere", "remote")]
    ops = [TransferOp(r, None, 0, memoryview(b"")) for r in routes]
    groups, unreachable = tset.assign(ops)
    assert [(t.name, idx) for t, idx in groups] == [("tcp", [0, 3]), ("shm", [1])]
    assert unreachable == [2]


def test_status_to_dict_aggregates_nodes():
    reply = pb.ClusterStatusReply(
        header=pb.ReplyHeader(epoch=3), role="single", capacity_bytes=3 << 20, used_bytes=1 << 20,
        object_count=5, max_key_bytes=1024, max_batch_keys=1024, max_object_bytes=1 << 20,
        segments=[pb.SegmentStatus(info=seg(1, "n1"), state=pb.NODE_STATE_ACTIVE,
                                   used_bytes=100, object_count=2),
                  pb.SegmentStatus(info=seg(2, "n1"), state=pb.NODE_STATE_ACTIVE,
                                   used_bytes=50, object_count=1),
                  pb.SegmentStatus(info=seg(3, "n2"), state=pb.NODE_STATE_SUSPECT)],
        tenants=[pb.TenantStatus(name="default", used_bytes=150, object_count=3)])
    status = session_state.status_to_dict(reply)
    assert status["epoch"] == 3 and status["object_count"] == 5
    assert [(n["node_id"], n["segments"], n["used_bytes"], n["state"]) for n in status["nodes"]] == [
        ("n1", 2, 150, "ACTIVE"), ("n2", 1, 0, "SUSPECT")]
    assert status["segments"][0]["endpoints"] == {"tcp": "n1:1"}
    assert status["tenants"][0]["name"] == "default"


def test_attempt_budget_leaves_time_for_a_fallback():
    assert checks.attempt_budget_s(30.0, False) == 30.0
    assert checks.attempt_budget_s(30.0, True) == 15.0
    assert checks.attempt_budget_s(1.5, True) == 1.0   # at least MIN_ATTEMPT_S ...
    assert checks.attempt_budget_s(0.4, True) == 0.4   # ... but never past the deadline


def test_can_fall_back_and_can_retry():
    batch = GetBatch(["a"], None, health=NodeHealth())
    batch.on_reply(get_reply({"a": b"x"}))
    batch.next_ops()
    assert batch.can_fall_back()
    batch.on_read_results([REFUSED])
    batch.next_ops()
    assert not batch.can_fall_back()  # the second replica is the last one
    put = make_put(["a"], max_attempts=1)
    req = put.start_request(HEADER)
    put.on_start_reply(placed(put, req, [["n1"]]))
    assert not put.can_retry()


def test_epoch_fence():
    fence = session_state.EpochFence()
    fence.check(5, "m:1")
    fence.check(5, "m:1")
    fence.check(7, "m:1")
    with pytest.raises(cellar.Unavailable, match="no longer the leader"):
        fence.check(6, "m:1")


def test_a_newer_epoch_counts_as_a_master_change_for_the_puts_it_voided():
    """A reply with a newer epoch than one heard before (a single master restarted: its epoch
    is its start time) sets the link's `switched_at`, so puts it refused UNAVAILABLE are placed
    again (flows.near_failover); the first epoch heard, the same one again, and an older one
    refused do not."""
    from cellar.coord.link import LinkState

    now = [100.0]
    link = LinkState("m:1", clock=lambda: now[0])
    link.fence.check(5, "m:1")
    link.fence.check(5, "m:1")
    assert link.switched_at == float("-inf") and link.generation == 0
    now[0] = 200.0
    link.fence.check(9, "m:1")
    assert link.switched_at == 200.0
    now[0] = 300.0
    with pytest.raises(cellar.Unavailable):
        link.fence.check(8, "m:1")
    assert link.switched_at == 200.0


def test_a_busy_range_revokes_and_retries_without_marking_the_node_failed():
    """ST_BUSY (a node's range still has transfers in flight: storage_node/inflight.py) puts
    the key again on a new allocation; the node stays healthy."""
    from cellar.transfer.frame import ST_BUSY

    health = NodeHealth()
    batch = make_put(["a"], health)
    req = batch.start_request(HEADER)
    batch.on_start_reply(placed(batch, req, [["n1", "n2"]]))
    end, revoke = batch.on_write_results([TransferResult(ST_BUSY, "range busy"), OK],
                                         may_retry=True)
    assert end is None and [r.key for r in revoke] == ["a"]
    assert not batch.done and not health.unhealthy()
    req = batch.start_request(HEADER)
    assert list(req.items[0].avoid_node_ids) == []
    batch.on_start_reply(placed(batch, req, [["n1", "n2"]]))
    end, revoke = batch.on_write_results([OK, OK], may_retry=True)
    assert revoke is None and len(end) == 1
