"""Put ahead in the SDK (client/put_ahead.py, `PutBatch.plan_ahead`/`ahead_ask`): the logic, on
fake replies. A client asks only for a size an earlier batch put, bounded per size and in
bytes; a batch writes under held allocations without a PutStart and names the key and the
put's fields in its PutEnd; an allocation the master will not bind sends the key through
PutStart; held allocations of an older master, past their margin or on an unhealthy node are
not used. The real-process checks are tests/integration/test_sdk_put_ahead.py."""

from __future__ import annotations

import pytest
from test_client_core import HEADER, OK, REFUSED, replica, seg

import cellar
from cellar.client.put_ahead import (
    ASK_CHUNK,
    MARGIN_S,
    MAX_HELD_BYTES,
    MAX_OBJECT_BYTES,
    MAX_SIZES_SEEN,
    PutAheadPool,
    put_ahead_from_env,
)
from cellar.client.puts import PutBatch, PutEntry, PutHints
from cellar.client.session_state import NodeHealth
from cellar.errors import Status
from cellar.proto import cellar_pb2 as pb

SIZE = 4096
MASTER_MS = 1_000_000
EPOCH = 3


def granted(count: int, size: int = SIZE, first_id: int = 100) -> list[pb.PutStartResult]:
    out = []
    for i in range(count):
        rep = replica(1, "n1", i * size, size)
        rep.grant.op = 2  # write
        rep.grant.expiry_ms = MASTER_MS + 30_000
        out.append(pb.PutStartResult(status=Status.OK, put_id=first_id + i, replicas=[rep]))
    return out


def held_pool(count: int, epoch: int = EPOCH, now: float | None = None) -> PutAheadPool:
    pool = PutAheadPool()
    pool.add(granted(count), [seg(1, "n1")], (SIZE, 1), epoch, MASTER_MS, now=now)
    return pool


def test_a_size_is_asked_for_only_once_an_earlier_batch_put_it() -> None:
    pool = PutAheadPool()
    assert not pool.repeats((SIZE, 1)), "the first batch of a size may be the only one"
    assert pool.repeats((SIZE, 1))
    assert not pool.repeats((SIZE, 2)), "another replica count is another shape"
    big = (MAX_OBJECT_BYTES + 1, 1)
    assert not pool.repeats(big) and not pool.repeats(big), "large puts never ask"
    for size in range(1, MAX_SIZES_SEEN + 1):  # the oldest size seen is forgotten
        pool.repeats((size, 9))
    assert not pool.repeats((SIZE, 1))


def test_an_ask_covers_two_batches_within_the_per_size_and_byte_bounds() -> None:
    pool = PutAheadPool(max_held=64)
    assert pool.ask((SIZE, 1), 1).count == ASK_CHUNK
    assert pool.ask((SIZE, 1), 20).count == 40
    assert pool.ask((SIZE, 1), 50).count == 64
    big = MAX_HELD_BYTES // 4
    assert pool.ask((big, 2), 2).count == 2, "two replicas of a quarter of the byte budget"
    assert pool.ask((big, 2), 3) is None, "the budget could never cover such a batch"
    assert PutAheadPool(max_held=4).ask((SIZE, 1), 5) is None
    held = held_pool(10)
    assert held.ask((SIZE, 1), 10) is None, "what is held covers a batch like it"
    assert held.ask((SIZE, 1), 11).count == 12, "two batches held in all"
    assert PutAheadPool(max_held=10).ask((SIZE, 1), 4) is not None
    assert held_pool(10).ask((SIZE, 1), 4) is None


def test_take_skips_expired_other_epoch_and_unhealthy_allocations() -> None:
    pool = held_pool(3, now=0.0)
    good_until = 30 - MARGIN_S  # the grants expire 30 s after the master's time
    assert [a.put_id for a in pool.take((SIZE, 1), 1, set(), now=1.0)] == [100]
    assert pool.take((SIZE, 1), 5, {"n1"}, now=1.0) == [], "on a node lately unhealthy"
    assert pool.dropped == 2 and pool.held() == 0
    pool = held_pool(3, now=0.0)
    assert pool.take((SIZE, 1), 3, set(), now=good_until + 0.01) == []
    pool = held_pool(3)
    pool.add(granted(1, first_id=500), [seg(1, "n1")], (SIZE, 1), EPOCH + 1, MASTER_MS, now=0.0)
    assert [a.put_id for a in pool.take((SIZE, 1), 5, set(), now=1.0)] == [500], \
        "a new master epoch drops what the old one granted"
    assert pool.take((SIZE, 2), 1, set(), now=1.0) == [], "held per (size, replicas)"


def test_a_grant_for_another_size_or_an_unknown_segment_is_not_kept() -> None:
    pool = PutAheadPool()
    pool.add(granted(2, size=SIZE * 2), [seg(1, "n1")], (SIZE, 1), EPOCH, MASTER_MS, now=0.0)
    pool.add(granted(2), [seg(9, "n9")], (SIZE, 1), EPOCH, MASTER_MS, now=0.0)
    assert pool.held() == 0 and pool.granted == 0


def batch_with(pool: PutAheadPool, keys: list[str], **flags) -> PutBatch:  # type: ignore[no-untyped-def]
    entries = [PutEntry(k, memoryview(b"x" * SIZE), None) for k in keys]
    return PutBatch(entries, tenant="t", replicas=1, soft_pin=flags.pop("soft_pin", False),
                    upsert=flags.pop("upsert", False), health=NodeHealth(), ahead=pool, **flags)


def test_held_allocations_write_without_put_start_and_bind_the_key_in_put_end() -> None:
    pool = held_pool(2)
    batch = batch_with(pool, ["a", "b"], upsert=True)
    assert batch.ahead_ask() is None, "no earlier batch put this size: nothing more asked"
    batch.plan_ahead()
    assert batch.start_request(HEADER) is None, "every key writes under a held allocation"
    ops = batch.ahead_round()
    assert {op.meta.key for op in ops} == {"a", "b"}
    ends, revokes = batch.on_write_results([OK] * 2, may_retry=True)
    assert revokes is None
    by_key = {item.key: item for item in ends}
    assert by_key["a"].put_id == 100 and by_key["b"].put_id == 101
    assert by_key["a"].bind.size_bytes == SIZE and by_key["a"].bind.upsert


def test_a_batch_they_do_not_cover_goes_through_put_start_and_leaves_them_held() -> None:
    pool = held_pool(2)
    batch = batch_with(pool, ["a", "b", "c"])
    batch.plan_ahead()
    request = batch.start_request(HEADER)
    assert [item.key for item in request.items] == ["a", "b", "c"]
    reply = pb.PutStartReply(results=granted(3, first_id=7), segments=[seg(1, "n1")])
    reply.header.epoch = EPOCH
    batch.on_start_reply(reply)
    ends, _ = batch.on_write_results([OK] * 3, may_retry=True)
    assert not any(item.HasField("bind") for item in ends), "placed by PutStart: no bind"
    assert pool.held() == 2 and pool.used == 0


def test_only_a_batch_of_one_size_that_came_before_asks() -> None:
    pool = PutAheadPool()
    assert batch_with(pool, ["a", "b"]).ahead_ask() is None, "the first batch of the size"
    assert batch_with(pool, ["a", "b"]).ahead_ask().count == ASK_CHUNK
    mixed = batch_with(pool, ["a", "b"])
    mixed.entries[1] = PutEntry("b", memoryview(b"y" * (SIZE + 1)), None)
    assert mixed.ahead_ask() is None, "held ones could never cover a batch of mixed sizes"


def test_a_refused_allocation_puts_the_key_again_through_put_start() -> None:
    pool = held_pool(1)
    batch = batch_with(pool, ["a"])
    batch.plan_ahead()
    assert batch.start_request(HEADER) is None, "every key writes under a held allocation"
    assert len(batch.ahead_round()) == 1
    ends, _ = batch.on_write_results([OK], may_retry=True)
    reply = pb.PutEndReply(results=[pb.KeyResult(status=Status.EXPIRED, message="older")])
    reply.header.epoch = EPOCH
    batch.on_end_reply(reply)
    assert not batch.done
    request = batch.start_request(HEADER)
    assert [item.key for item in request.items] == ["a"]
    assert pool.used == 1


def test_a_failed_write_revokes_the_allocation_by_its_put_id_alone() -> None:
    pool = held_pool(1)
    batch = batch_with(pool, ["a"])
    batch.plan_ahead()
    batch.ahead_round()
    ends, revokes = batch.on_write_results([REFUSED], may_retry=False)
    assert ends is None and [(r.key, r.put_id) for r in revokes] == [("", 100)]


def test_hard_pinned_and_host_preferring_puts_never_use_held_allocations() -> None:
    for hints in (PutHints(hard_pin=True), PutHints(preferred_host_id="h")):
        pool = held_pool(1)
        batch = batch_with(pool, ["a"], hints=hints)
        batch.plan_ahead()
        assert batch.ahead_ask() is None
        assert [item.key for item in batch.start_request(HEADER).items] == ["a"]
        assert pool.used == 0


@pytest.mark.parametrize("text, value", [("", 64), ("0", 0), ("4096", 4096), (" 8 ", 8)])
def test_put_ahead_env(monkeypatch: pytest.MonkeyPatch, text: str, value: int) -> None:
    monkeypatch.setenv("CELLAR_PUT_AHEAD", text)
    assert put_ahead_from_env() == value


@pytest.mark.parametrize("text", ["-1", "4097", "many", "1.5"])
def test_put_ahead_env_refuses_garbage(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("CELLAR_PUT_AHEAD", text)
    with pytest.raises(cellar.InvalidArgument, match="CELLAR_PUT_AHEAD"):
        put_ahead_from_env()
