"""The object state machine (WRITING -> COMPLETE -> DROPPED), grants and per-key bad input."""

from __future__ import annotations

import pytest
from test_master_support import (
    EPOCH,
    SECRET,
    FakeClock,
    MiB,
    exists,
    get,
    make_service,
    mount,
    put,
    put_start,
)

from cellar.errors import Status
from cellar.master.grant_issuer import GrantSigner
from cellar.master.lookup import lookup
from cellar.master.service import PutEndItem, PutItem, PutRef, RequestRejected
from cellar.proto.grant import (
    GRANT_OP_READ,
    GRANT_OP_WRITE,
    GrantRejected,
    compute_mac,
    key_tag,
    verify,
)
from tests.support.receipts import receipts_for


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def svc(clock: FakeClock):  # type: ignore[no-untyped-def]
    service = make_service(clock, node_suspect_after_s=1000, node_expire_after_s=2000)
    mount(service, "n1", 1)
    mount(service, "n2", 2)
    return service


def test_writing_is_invisible_until_put_end(svc) -> None:  # type: ignore[no-untyped-def]
    started = put_start(svc, "k", 1000)
    assert started.status == Status.OK and started.put_id
    assert exists(svc, "k") == Status.NOT_READY
    assert get(svc, "k").status == Status.NOT_READY
    assert svc.prefix_len("", ["k"]) == 0
    assert svc.put_end("", "w", [PutEndItem("k", started.put_id, 99, receipts_for(SECRET, started, 99))]) == [(Status.OK, "")]
    assert exists(svc, "k") == Status.OK
    got = get(svc, "k")
    assert got.status == Status.OK
    assert (got.size_bytes, got.checksum) == (1000, 99)
    assert got.pin_id
    assert [r.offset for r in got.replicas] == [r.offset for r in started.replicas]


def test_put_end_is_idempotent_and_checks_the_writer(svc) -> None:  # type: ignore[no-untyped-def]
    started = put_start(svc, "k", 1000)
    wrong = svc.put_end("", "w", [PutEndItem("k", started.put_id + 12345, 1)])
    assert wrong[0][0] == Status.INVALID and "not the writer" in wrong[0][1]
    assert exists(svc, "k") == Status.NOT_READY  # nothing changed
    assert svc.put_end("", "w", [PutEndItem("k", started.put_id, 1, receipts_for(SECRET, started, 1))]) == [(Status.OK, "")]
    assert svc.put_end("", "w", [PutEndItem("k", started.put_id, 1, receipts_for(SECRET, started, 1))]) == [(Status.OK, "")]
    assert svc.put_end("", "w", [PutEndItem("other", started.put_id, 1, receipts_for(SECRET, started, 1))])[0][0] == Status.NOT_FOUND


def test_put_end_of_unknown_key_is_not_found(svc) -> None:  # type: ignore[no-untyped-def]
    assert svc.put_end("", "w", [PutEndItem("never", 42, 1)])[0][0] == Status.NOT_FOUND


def test_existing_key_is_already_exists_and_being_written_too(svc) -> None:  # type: ignore[no-untyped-def]
    first = put_start(svc, "k", 1000)
    second = put_start(svc, "k", 1000)
    assert second.status == Status.ALREADY_EXISTS and "being written" in second.message
    svc.put_end("", "w", [PutEndItem("k", first.put_id, 1, receipts_for(SECRET, first, 1))])
    third = put_start(svc, "k", 1000)
    assert third.status == Status.ALREADY_EXISTS and "exists" in third.message


def test_revoke_drops_a_writing_put(svc) -> None:  # type: ignore[no-untyped-def]
    started = put_start(svc, "k", 1000)
    assert svc.put_revoke("", "w", [PutRef("k", started.put_id + 1)])[0][0] == Status.INVALID
    assert svc.put_revoke("", "w", [PutRef("k", started.put_id)]) == [(Status.OK, "")]
    assert exists(svc, "k") == Status.NOT_FOUND
    assert svc.put_end("", "w", [PutEndItem("k", started.put_id, 1, receipts_for(SECRET, started, 1))])[0][0] == Status.NOT_FOUND
    assert svc.tenant("").used_bytes == 0 and svc.tenant("").object_count == 0
    assert put_start(svc, "k", 1000).status == Status.OK  # the key is free again


def test_writer_timeout_revokes_and_put_end_says_expired(svc, clock) -> None:  # type: ignore[no-untyped-def]
    started = put_start(svc, "k", 1000)
    clock.advance(svc.config.write_grant_ttl_s - 0.5)
    svc.tick()
    assert exists(svc, "k") == Status.NOT_READY
    clock.advance(1.0)
    svc.tick()
    assert exists(svc, "k") == Status.NOT_FOUND
    assert svc.nodes.puts_timed_out == 1
    late = svc.put_end("", "w", [PutEndItem("k", started.put_id, 1, receipts_for(SECRET, started, 1))])
    assert late[0][0] == Status.EXPIRED


def test_upsert_keeps_old_version_visible_until_put_end(svc) -> None:  # type: ignore[no-untyped-def]
    put(svc, "k", 1000, checksum=1)
    assert put_start(svc, "k", 2000).status == Status.ALREADY_EXISTS
    started = put_start(svc, "k", 2000, upsert=True)
    assert started.status == Status.OK
    old = get(svc, "k")
    assert (old.size_bytes, old.checksum) == (1000, 1)
    assert svc.tenant("").object_count == 2  # both versions hold memory meanwhile
    svc.put_end("", "w", [PutEndItem("k", started.put_id, 2, receipts_for(SECRET, started, 2))])
    new = get(svc, "k")
    assert (new.size_bytes, new.checksum) == (2000, 2)
    # the old version is pinned by the first get: its range is freed only on unpin
    used_before = svc.capacity()[1]
    svc.unpin("", "reader", [old.pin_id])
    assert svc.capacity()[1] == used_before - 1024
    assert svc.tenant("").object_count == 1


def test_remove_while_pinned_hides_at_once_and_frees_on_unpin(svc) -> None:  # type: ignore[no-untyped-def]
    put(svc, "k", 4096)
    pinned = get(svc, "k")
    used = svc.capacity()[1]
    assert svc.remove("", ["k"]) == [(Status.OK, "")]
    assert exists(svc, "k") == Status.NOT_FOUND
    assert get(svc, "k").status == Status.NOT_FOUND
    assert svc.capacity()[1] == used  # bytes still held for the reader
    assert svc.tenant("").used_bytes == 0  # but no longer charged to the tenant
    assert svc.unpin("", "reader", [pinned.pin_id]) == 1
    assert svc.capacity()[1] == 0
    assert svc.remove("", ["k"])[0][0] == Status.NOT_FOUND


def test_remove_prefix_and_remove_all(svc) -> None:  # type: ignore[no-untyped-def]
    for key in ("a/1", "a/2", "b/1"):
        put(svc, key, 100)
    put_start(svc, "a/3", 100)  # WRITING: not removed
    assert svc.remove_prefix("", "a/") == 2
    assert svc.exists("", ["a/1", "a/2", "b/1", "a/3"]) == [
        Status.NOT_FOUND, Status.NOT_FOUND, Status.OK, Status.NOT_READY,
    ]
    assert svc.remove_all("") == 1
    with pytest.raises(RequestRejected):
        svc.remove_prefix("", "")


def test_prefix_len_counts_leading_complete_keys(svc) -> None:  # type: ignore[no-untyped-def]
    for key in ("p/0", "p/1", "p/3"):
        put(svc, key, 100)
    assert svc.prefix_len("", ["p/0", "p/1", "p/2", "p/3"]) == 2
    assert svc.prefix_len("", []) == 0
    with pytest.raises(RequestRejected, match="empty key"):
        svc.prefix_len("", ["p/0", "p/2", ""])


def test_exists_and_prefix_len_do_not_pin_or_touch_lru(svc, clock) -> None:  # type: ignore[no-untyped-def]
    put(svc, "k", 100)
    obj = svc.tenant("").objects["k"]
    stamp = obj.last_access
    clock.advance(5)
    svc.exists("", ["k"])
    svc.prefix_len("", ["k"])
    assert obj.last_access == stamp and obj.pins == 0 and len(svc.pins) == 0
    get(svc, "k")
    assert obj.last_access == clock.now_s and obj.pins == 1


def test_write_and_read_grants_verify(svc, clock) -> None:  # type: ignore[no-untyped-def]
    started = svc.put_start("", "w", [PutItem("k", 5000, replicas=2)]).results[0]
    assert len(started.replicas) == 2
    assert len({r.node_id for r in started.replicas}) == 2
    now_ms = clock.wall_ms()
    alloc_ids = set()
    for replica in started.replicas:
        grant = replica.grant()
        verify(SECRET, grant, op=GRANT_OP_WRITE, segment_id=replica.segment_id, offset=replica.offset,
               length=5000, now_ms=now_ms, min_epoch=EPOCH)
        assert grant.key_tag == key_tag("default", "k")
        assert grant.expiry_ms == now_ms + 30_000
        assert grant.length == 5000 and replica.length == 5000
        alloc_ids.add(grant.alloc_id)
        with pytest.raises(GrantRejected):  # a write grant does not read
            verify(SECRET, grant, op=GRANT_OP_READ, segment_id=replica.segment_id,
                   offset=replica.offset, length=5000, now_ms=now_ms)
        with pytest.raises(GrantRejected):  # nor does it stretch past the object
            verify(SECRET, grant, op=GRANT_OP_WRITE, segment_id=replica.segment_id,
                   offset=replica.offset, length=5001, now_ms=now_ms)
    assert len(alloc_ids) == 2
    svc.put_end("", "w", [PutEndItem("k", started.put_id, 1, receipts_for(SECRET, started, 1))])
    got = get(svc, "k")
    for replica in got.replicas:
        grant = replica.grant()
        verify(SECRET, grant, op=GRANT_OP_READ, segment_id=replica.segment_id, offset=replica.offset,
               length=5000, now_ms=clock.wall_ms())
        assert grant.expiry_ms == clock.wall_ms() + 10_000  # the pin TTL
        assert grant.alloc_id in alloc_ids
        with pytest.raises(GrantRejected, match="expired"):
            verify(SECRET, grant, op=GRANT_OP_READ, segment_id=replica.segment_id,
                   offset=replica.offset, length=5000, now_ms=clock.wall_ms() + 10_001)
        with pytest.raises(GrantRejected, match="bad_mac"):
            verify(b"another secret of 32 bytes......", grant, op=GRANT_OP_READ,
                   segment_id=replica.segment_id, offset=replica.offset, length=5000,
                   now_ms=clock.wall_ms())


def test_fast_signer_matches_the_contract() -> None:
    signer = GrantSigner(SECRET)
    for fields in [(1, 2, 3, 4, 5, 6, 7, 8), (2, 2**64 - 1, 2**40, 2**20, 2**63, EPOCH, 2**50, 2**64 - 1)]:
        assert signer.mac(*fields) == compute_mac(SECRET, *fields)


def test_put_ids_and_alloc_ids_are_unique_across_restarts(clock) -> None:  # type: ignore[no-untyped-def]
    first = make_service(clock)
    mount(first, "n1", 1)
    a = put_start(first, "k", 100)
    later = make_service(clock, epoch=EPOCH + 1)  # a restarted master: a later epoch
    mount(later, "n1", 1)
    b = put_start(later, "k", 100)
    assert b.put_id != a.put_id  # random (cellar.master.state.ids): unique, deliberately not ordered
    assert b.replicas[0].alloc_id > a.replicas[0].alloc_id


BAD_KEYS = [
    ("", "empty key"),
    ("x" * 1025, "max_key_bytes"),
    ("é" * 513, "max_key_bytes"),  # 1026 bytes in UTF-8, 513 characters
    ("bad\udc80", "UTF-8"),
    ("nul\x00key", "NUL"),
]


@pytest.mark.parametrize(("key", "reason"), BAD_KEYS)
def test_bad_keys_are_invalid_per_key_and_change_nothing(svc, clock, key, reason) -> None:  # type: ignore[no-untyped-def]
    put(svc, "good", 100)
    before = (svc.capacity(), svc.tenant("").used_bytes, len(svc.objects.puts), len(svc.pins))
    result = svc.put_start("", "w", [PutItem(key, 100), PutItem("fine", 100)]).results
    assert result[0].status == Status.INVALID and reason in result[0].message
    assert result[1].status == Status.OK
    svc.put_revoke("", "w", [PutRef("fine", result[1].put_id)])  # quarantined for a while
    assert svc.get_replicas("", "r", [key]).results[0].status == Status.INVALID
    assert svc.exists("", [key]) == [Status.INVALID]
    assert svc.remove("", [key])[0][0] == Status.INVALID
    assert svc.put_end("", "w", [PutEndItem(key, 1, 1)])[0][0] == Status.INVALID
    assert svc.put_revoke("", "w", [PutRef(key, 1)])[0][0] == Status.INVALID
    clock.advance(svc.config.write_grant_ttl_s + svc.config.grant_skew_s)
    svc.tick()
    after = (svc.capacity(), svc.tenant("").used_bytes, len(svc.objects.puts), len(svc.pins))
    assert after == before


@pytest.mark.parametrize(("key", "reason"), BAD_KEYS)
def test_batch_probes_find_one_bad_key_among_plain_ones(svc, key, reason) -> None:  # type: ignore[no-untyped-def]
    """Exists, PrefixLen and Lookup settle a batch of plain ASCII keys in C loops
    (proto/keys.py); a batch with one bad key must still be judged key by key."""
    put(svc, "p/0", 100)
    keys = ["p/0"] + [f"p/{i}" for i in range(1, 40)] + [key, "p/last"]
    statuses = svc.exists("", keys)
    assert statuses[0] == Status.OK and statuses[40] == Status.INVALID
    assert set(statuses[1:40]) == {Status.NOT_FOUND} and statuses[41] == Status.NOT_FOUND
    with pytest.raises(RequestRejected, match=f"key 40: .*{reason}"):
        svc.prefix_len("", keys)
    with pytest.raises(RequestRejected, match=f"key 40: .*{reason}"):
        lookup(svc, "", keys)
    assert svc.prefix_len("", keys[:40]) == 1  # the same batch without it: one stored key


def test_batch_probes_accept_valid_keys_the_fast_check_cannot_vouch_for(svc) -> None:  # type: ignore[no-untyped-def]
    put(svc, "p/0", 100)
    put(svc, "é/1", 100)
    assert put_start(svc, "w/1", 100).status == Status.OK  # being written
    keys = ["p/0", "é/1", "w/1", "ü/2"]
    assert svc.exists("", keys) == [Status.OK, Status.OK, Status.NOT_READY, Status.NOT_FOUND]
    assert svc.prefix_len("", keys) == 2 and lookup(svc, "", keys).prefix_len == 2
    plain = ["p/0", "w/1", "p/2"]  # the fast path: a key being written is still NOT_READY
    assert svc.exists("", plain) == [Status.OK, Status.NOT_READY, Status.NOT_FOUND]
    assert svc.exists("", ["p/0"] * 3) == [Status.OK] * 3 and svc.exists("", []) == []


def test_max_key_bytes_is_inclusive(svc) -> None:  # type: ignore[no-untyped-def]
    assert put_start(svc, "x" * 1024, 100).status == Status.OK
    assert put_start(svc, "é" * 512, 100).status == Status.OK


@pytest.mark.parametrize(
    ("item", "status", "reason"),
    [
        (PutItem("k", 0), Status.INVALID, "size_bytes must be > 0"),
        (PutItem("k", 64 * MiB + 1), Status.INVALID, "largest segment"),
        (PutItem("k", 100, replicas=9), Status.INVALID, "max_replicas"),
        (PutItem("k", 100, replicas=3), Status.UNAVAILABLE, "only 2 live node"),
        (PutItem("k", 100, replicas=2, avoid_node_ids=["n1"]), Status.UNAVAILABLE, "only 1 live node"),
        (PutItem("k", 100, soft_pin=True, hard_pin=True), Status.INVALID, "exclusive"),
    ],
)
def test_bad_put_items(svc, item, status, reason) -> None:  # type: ignore[no-untyped-def]
    result = svc.put_start("", "w", [item]).results[0]
    assert result.status == status and reason in result.message
    assert svc.capacity()[1] == 0 and not svc.objects.puts


def test_batch_over_limit_and_unknown_tenant_reject_the_whole_request(svc) -> None:  # type: ignore[no-untyped-def]
    items = [PutItem(f"k{i}", 10) for i in range(1025)]
    with pytest.raises(RequestRejected, match="max_batch_keys"):
        svc.put_start("", "w", items)
    with pytest.raises(RequestRejected, match="max_batch_keys"):
        svc.get_replicas("", "r", [f"k{i}" for i in range(1025)])
    with pytest.raises(RequestRejected, match="unknown tenant"):
        svc.put_start("nobody", "w", [PutItem("k", 10)])
    with pytest.raises(RequestRejected, match="unknown tenant"):
        svc.exists("nobody", ["k"])
    assert svc.capacity()[1] == 0 and not svc.objects.puts
    assert len(svc.put_start("", "w", items[:1024]).results) == 1024


def test_no_segments_is_unavailable(clock) -> None:  # type: ignore[no-untyped-def]
    svc = make_service(clock)
    result = put_start(svc, "k", 100)
    assert result.status == Status.UNAVAILABLE and "no storage segments" in result.message
