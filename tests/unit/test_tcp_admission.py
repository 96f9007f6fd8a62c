"""transfer/tcp_admission.py: who holds a slot on the data port (issue #19, finding 5)."""

from __future__ import annotations

import pytest

from cellar.transfer.tcp_admission import (
    EVICTED_MAX_CONNECTIONS,
    EVICTED_PER_PEER,
    REFUSED_MAX_CONNECTIONS,
    REFUSED_PER_PEER,
    Admission,
)


def test_a_stranger_address_at_its_limit_is_refused_a_proven_one_pushes_out_its_oldest() -> None:
    adm = Admission(max_connections=16, max_connections_per_peer=2, strict=True)
    a, _, _ = adm.admit("a", "stranger")
    b, _, _ = adm.admit("b", "stranger")
    assert a is not None and b is not None
    slot, why, victims = adm.admit("c", "stranger")
    assert slot is None and why == REFUSED_PER_PEER and victims == []
    adm.authenticated(a)  # someone there showed a grant: the address is proven
    c, _, _ = adm.admit("c", "stranger")
    assert c is not None
    d, _, victims = adm.admit("d", "stranger")
    assert d is not None and victims == [(b, EVICTED_PER_PEER)]
    adm.release(a)  # still proven for a while after its last authenticated connection closed
    adm.release(b)
    e, _, victims = adm.admit("e", "stranger")
    assert e is not None and victims == [(c, EVICTED_PER_PEER)]


def test_strangers_push_out_their_own_oldest_never_an_authenticated_slot() -> None:
    adm = Admission(max_connections=4, max_connections_per_peer=2, strict=True)
    client, _, _ = adm.admit("c", "10.0.0.1")
    assert client is not None
    adm.authenticated(client)
    a, _, _ = adm.admit("a", "10.0.0.1")
    b, _, _ = adm.admit("b", "10.0.0.1")
    assert a is not None and b is not None
    c, why, victims = adm.admit("c2", "10.0.0.1")  # third stranger from the client's address
    assert c is not None and why == ""
    assert victims == [(a, EVICTED_PER_PEER)] and a.evicted and not client.evicted
    adm.release(a)
    d, _, victims = adm.admit("d", "10.0.0.2")  # four slots: client, b, c2, d
    assert d is not None and victims == []
    e, _, victims = adm.admit("e", "10.0.0.3")  # full: the oldest stranger of any address goes
    assert e is not None and victims == [(b, EVICTED_MAX_CONNECTIONS)]
    adm.release(b)
    for slot in (c, d, e):
        assert slot is not None
        adm.authenticated(slot)
    f, why, victims = adm.admit("f", "10.0.0.4")  # every slot proved itself: refused
    assert f is None and why == REFUSED_MAX_CONNECTIONS and victims == []


def test_an_evicted_slot_cannot_authenticate_and_releases_once() -> None:
    adm = Admission(max_connections=8, max_connections_per_peer=1, strict=True)
    client, _, _ = adm.admit("client", "h")
    assert client is not None
    adm.authenticated(client)  # "h" is proven
    a, _, _ = adm.admit("a", "h")
    b, _, victims = adm.admit("b", "h")
    assert a is not None and b is not None and victims == [(a, EVICTED_PER_PEER)]
    adm.authenticated(a)  # too late: it is on its way out
    assert not a.authenticated
    adm.release(a)
    adm.release(a)
    assert len(adm.slots()) == 2


def test_without_the_auth_rule_every_connection_counts_and_the_excess_is_refused() -> None:
    adm = Admission(max_connections=3, max_connections_per_peer=2, strict=False)
    a, _, _ = adm.admit("a", "h")
    assert a is not None
    adm.authenticated(a)  # no effect: the old rule
    assert adm.admit("b", "h")[0] is not None
    slot, why, victims = adm.admit("c", "h")
    assert slot is None and why == REFUSED_PER_PEER and victims == []
    adm.release(a)
    assert adm.admit("c", "h")[0] is not None


def test_a_stranger_gains_nothing_by_renewing(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("cellar.transfer.tcp_admission.time.monotonic", lambda: now[0])
    adm = Admission(max_connections=16, max_connections_per_peer=2, strict=True,
                    unauthenticated_backoff_s=10)
    first = [adm.admit(str(i), "stranger")[0] for i in range(2)]
    for slot in first:  # both end without a grant (timed out, or closed by the stranger)
        assert slot is not None
        adm.release(slot)
    slot, why, _ = adm.admit("again", "stranger")
    assert slot is None and why == REFUSED_PER_PEER  # still charged
    assert adm.admit("other", "someone else")[0] is not None
    now[0] += 10
    assert adm.admit("later", "stranger")[0] is not None  # the charges expired
