"""master/state/read_trust.py, and the object table's use of it: a change of a key read within
the trust is acknowledged only once the trust has passed; nothing else waits."""

from __future__ import annotations

from typing import Any

import pytest
from test_master_support import FakeClock, get, make_service, mount, put

from cellar.master.state.read_trust import ReadTrust


def test_a_change_of_a_key_read_lately_waits_for_the_rest_of_the_trust() -> None:
    trust = ReadTrust(0.5)
    trust.dropped("t", "k", read_at=10.0, reader="r", now=10.2)  # removed or replaced 0.2 s after the read
    trust.changed("t", "k", now=10.2)
    assert trust.take() == pytest.approx(10.5)
    assert trust.take() == 0.0  # taken once: the next request waits for nothing
    trust.changed("t", "k", now=10.3)  # nothing remembered any more
    assert trust.take() == 0.0


def test_nothing_waits_for_a_key_never_read_or_read_long_ago() -> None:
    trust = ReadTrust(0.5)
    trust.dropped("t", "never", read_at=0.0, reader="r", now=10.0)
    trust.dropped("t", "old", read_at=9.0, reader="r", now=10.0)
    trust.changed("t", "never", now=10.0)
    trust.changed("t", "old", now=10.0)
    assert trust.take() == 0.0
    assert len(trust) == 0


def test_an_evicted_key_read_lately_makes_its_next_put_wait() -> None:
    trust = ReadTrust(0.5)
    trust.dropped("t", "k", read_at=10.0, reader="r", now=10.1)  # evicted: nothing acknowledged then
    assert trust.take() == 0.0
    trust.changed("t", "k", now=10.3)  # the next put of the key seals
    assert trust.take() == pytest.approx(10.5)
    trust.dropped("t", "j", read_at=10.0, reader="r", now=10.1)
    trust.changed("t", "j", now=10.6)  # after the trust: no wait
    assert trust.take() == 0.0


def test_keys_are_per_tenant_and_the_latest_end_wins() -> None:
    trust = ReadTrust(0.5)
    trust.dropped("a", "k", read_at=10.0, reader="r", now=10.1)
    trust.changed("b", "k", now=10.1)
    assert trust.take() == 0.0
    trust.dropped("a", "k", read_at=10.2, reader="r", now=10.3)  # a newer version read later, dropped too
    trust.changed("a", "k", now=10.3)
    assert trust.take() == pytest.approx(10.7)
    trust.dropped("a", "x", read_at=10.0, reader="r", now=10.1)
    trust.dropped("a", "y", read_at=10.3, reader="r", now=10.4)
    trust.changed("a", "y", now=10.4)
    trust.changed("a", "x", now=10.4)
    assert trust.take() == pytest.approx(10.8)  # one request changed both: the later end


def test_remembered_ends_are_pruned_once_past() -> None:
    trust = ReadTrust(0.5)
    for i in range(100):
        trust.dropped("t", f"k{i}", read_at=10.0, reader="r", now=10.1)
    assert len(trust) == 100
    trust.dropped("t", "late", read_at=11.0, reader="r", now=11.0)  # every earlier end has passed
    assert len(trust) == 1


def test_a_change_by_the_only_reader_does_not_wait_one_by_another_does() -> None:
    """The one client that read the version forgot its place before it changed the key
    (client/early_reads.py `Locations.changing`); any other reader may still reuse it."""
    trust = ReadTrust(0.5)
    trust.dropped("t", "own", read_at=10.0, reader="r", now=10.1)
    trust.changed("t", "own", now=10.1, client_id="r")
    assert trust.take() == 0.0
    trust.dropped("t", "theirs", read_at=10.0, reader="r", now=10.1)
    trust.changed("t", "theirs", now=10.1, client_id="w")
    assert trust.take() == pytest.approx(10.5)
    trust.dropped("t", "anonymous", read_at=10.0, reader="", now=10.1)
    trust.changed("t", "anonymous", now=10.1, client_id="")
    assert trust.take() == pytest.approx(10.5)  # no id: no exemption
    # two versions read by two clients within the trust (evicted, then put and read again)
    trust.dropped("t", "both", read_at=10.0, reader="r", now=10.1)
    trust.dropped("t", "both", read_at=10.2, reader="w", now=10.3)
    trust.changed("t", "both", now=10.3, client_id="w")
    assert trust.take() == pytest.approx(10.7)


def test_trust_zero_remembers_nothing() -> None:
    trust = ReadTrust(0.0)
    trust.dropped("t", "k", read_at=10.0, reader="r", now=10.0)
    trust.changed("t", "k", now=10.0)
    assert trust.take() == 0.0 and len(trust) == 0
    with pytest.raises(ValueError):
        ReadTrust(-1.0)


# ---- through the MasterService: which requests set the wait ------------------------------


def _service(trust_s: float = 0.5) -> tuple[Any, FakeClock]:
    clock = FakeClock()
    svc = make_service(clock, read_trust_s=trust_s)
    mount(svc, "n1", 1)
    clock.advance(1.0)  # past the new master's floor (the next test)
    return svc, clock


def test_a_new_master_holds_every_change_until_a_former_masters_trust_has_ended() -> None:
    """A client of the master before this one may reuse what it named (over shm, with no node
    to refuse the old grant) until this master's start + the trust."""
    clock = FakeClock()
    started = clock.monotonic()
    svc = make_service(clock, read_trust_s=0.5)
    mount(svc, "n1", 1)
    trust = svc.objects.read_trust
    clock.advance(0.1)
    put(svc, "new", 4096)  # a key this master never served: a former one may have
    assert trust.take() == pytest.approx(started + 0.5)
    svc.remove("", ["new"])
    assert trust.take() == pytest.approx(started + 0.5)
    clock.advance(0.5)
    put(svc, "later", 4096)
    assert trust.take() == 0.0


def test_a_remove_or_upsert_of_a_key_read_lately_waits_others_do_not() -> None:
    svc, clock = _service()
    trust = svc.objects.read_trust
    put(svc, "read", 4096)
    put(svc, "unread", 4096)
    put(svc, "upserted", 4096)
    assert trust.take() == 0.0  # a put of a new key, never read: no wait
    get(svc, "read")
    get(svc, "upserted")
    read_at = clock.monotonic()
    clock.advance(0.1)
    svc.remove("", ["unread"])
    assert trust.take() == 0.0
    svc.remove("", ["read"])
    assert trust.take() == pytest.approx(read_at + 0.5)
    put(svc, "own", 4096)
    get(svc, "own", client="reader")
    svc.remove("", ["own"], client_id="reader")  # its only reader: forgot its place first
    assert trust.take() == 0.0
    put(svc, "shared", 4096)
    get(svc, "shared", client="reader")
    get(svc, "shared", client="other")
    svc.remove("", ["shared"], client_id="reader")
    assert trust.take() == pytest.approx(clock.monotonic() + 0.5)
    put(svc, "upserted", 4096, upsert=True)
    assert trust.take() == pytest.approx(read_at + 0.5)
    get(svc, "upserted")
    clock.advance(0.6)
    svc.remove("", ["upserted"])
    assert trust.take() == 0.0  # read 0.6 s ago: every reuse has ended


def test_a_master_with_no_trust_never_waits() -> None:
    svc, _clock = _service(0.0)
    put(svc, "k", 4096)
    get(svc, "k")
    svc.remove("", ["k"])
    assert svc.objects.read_trust.take() == 0.0


def test_a_reply_waits_out_the_trust_and_a_master_deposed_meanwhile_sends_none() -> None:
    """serving/leadership.py: `take_durable` right after the request, then `make_durable`
    sleeps to the end of the trust (a loop's timer that fires early sleeps again); a master
    that stopped leading meanwhile must not acknowledge (a new leader answers for the key)."""
    import asyncio
    import time

    from test_master_support import SECRET

    from cellar.master.config import MasterConfig
    from cellar.master.serving.leadership import Leadership, LeadershipLost

    leadership = Leadership(MasterConfig(new_node_ramp_s=0.0, read_trust_s=0.2), SECRET,
                            ha=False)
    svc = leadership.service
    mount(svc, "n1", 1)
    for key in ("a", "b"):
        put(svc, key, 4096)
    leadership.take_durable()  # the new master's floor: not what this test waits for
    time.sleep(0.2)
    get(svc, "a", client="reader")
    svc.remove("", ["a"], client_id="other")
    work = leadership.take_durable()
    assert work.settle_until > time.monotonic()
    assert leadership.take_durable().settle_until == 0.0  # taken once, by its own request
    asyncio.run(leadership.make_durable(work))
    assert time.monotonic() >= work.settle_until
    get(svc, "b", client="reader")
    svc.remove("", ["b"], client_id="other")
    work = leadership.take_durable()
    leadership.serving = lambda: False  # type: ignore[method-assign]
    with pytest.raises(LeadershipLost):
        asyncio.run(leadership.make_durable(work))


def test_a_prefix_or_tenant_removal_waits_for_keys_evicted_under_it() -> None:
    """RemovePrefix and RemoveAll drop the objects they find; a key under the prefix evicted
    moments before is not among them, yet may still be read where it was."""
    trust = ReadTrust(0.5)
    trust.dropped("t", "p/evicted", read_at=10.0, reader="r", now=10.1)
    trust.dropped("t", "q/evicted", read_at=10.0, reader="r", now=10.1)
    trust.dropped("u", "p/evicted", read_at=10.0, reader="r", now=10.1)
    trust.changed_prefix("t", "p/", now=10.2, client_id="w")
    assert trust.take() == pytest.approx(10.5)
    assert len(trust) == 2  # the other prefix and the other tenant are kept
    trust.changed_prefix("t", "", now=10.2, client_id="w")  # RemoveAll
    assert trust.take() == pytest.approx(10.5)
    assert len(trust) == 1


def test_remove_prefix_through_the_service_waits_for_an_evicted_key() -> None:
    svc, clock = _service()
    trust = svc.objects.read_trust
    put(svc, "p/k", 4096)
    get(svc, "p/k")
    obj = svc.tenant("").objects["p/k"]
    svc.objects.drop(obj, clock.monotonic())  # as eviction does: nothing acknowledged
    assert trust.take() == 0.0
    assert svc.remove_prefix("", "p/", client_id="other") == 0
    assert trust.take() == pytest.approx(clock.monotonic() + 0.5)


def test_a_putends_read_back_grants_the_stored_values_and_counts_as_their_writers_read() -> None:
    """MasterService.read_back (a PutEnd's `read_back`, client/read_backs.py): read grants for
    the values the PutEnd stored, none for an item it did not store (revoked, another put id); the writer becomes the
    version's reader, so another client's change within the trust waits and its own does not."""
    from test_master_support import SECRET, PutEndItem, put_start, receipts_for  # type: ignore[attr-defined]

    from cellar.errors import Status
    from cellar.proto.grant import GRANT_OP_READ

    svc, clock = _service()
    trust = svc.objects.read_trust
    started = [put_start(svc, key, 4096) for key in ("a", "b")]
    items = [PutEndItem("a", started[0].put_id, 7, receipts_for(SECRET, started[0], 7)),
             PutEndItem("b", started[1].put_id, 7, [])]  # no receipt: the put is revoked
    results = svc.put_end("", "writer", items)
    assert [status for status, _ in results] == [Status.OK, Status.PERMISSION_DENIED]
    outcome = svc.read_back("", "writer", items, results)
    a, b = outcome.results
    assert (a.status, a.size_bytes, a.checksum, a.pin_id) == (Status.OK, 4096, 7, 0)
    assert [r.op for r in a.replicas] == [GRANT_OP_READ]
    assert [s.segment_id for s in outcome.segments] == [a.replicas[0].segment_id]
    assert (b.status, b.replicas) == (Status.NOT_FOUND, [])
    assert len(svc.pins) == 0 and svc.tenant("").objects["a"].pins == 0  # no pin taken
    read_at = clock.monotonic()
    clock.advance(0.1)
    assert trust.take() == 0.0
    svc.remove("", ["a"], client_id="other")  # within the writer's trust: waits for its end
    assert trust.take() == pytest.approx(read_at + 0.5)
    put(svc, "c", 4096)
    other_put = svc.read_back("", "writer", [PutEndItem("c", 1, 7, [])], [(Status.OK, "")])
    assert other_put.results[0].status == Status.NOT_FOUND  # not the put id that stored it
    ours = PutEndItem("c", svc.tenant("").objects["c"].put_id, 7, [])
    assert svc.read_back("", "writer", [ours], [(Status.OK, "")]).results[0].status == Status.OK
    svc.remove("", ["c"], client_id="writer")  # its own change: no wait
    assert trust.take() == 0.0
