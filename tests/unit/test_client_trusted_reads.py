"""Trusted reads (client/gets.py `start_trusted`/`on_trusted`, client/early_reads.py): the
logic, on fake replies. A key whose last GetReplicas reply granted read trust is read again
from that DRAM replica without asking, until the trust (counted from when the request was
sent, less TRUST_MARGIN_S) ends; its bytes are kept only if they hash to the reply's checksum,
else the caller's buffer is cleared and the key is asked for. A change this process begins
ends its trust in every client of the process. The real-process checks are
tests/integration/test_sdk_trusted_reads.py."""

from __future__ import annotations

import time

import pytest
from test_client_core import fill
from test_client_early_reads import OTHER, VALUE, early_fill, reply_for

import cellar
from cellar.client.early_reads import Locations, trusted_reads_from_env
from cellar.client.gets import TRUST_MARGIN_S, GetBatch, into_result, take_value
from cellar.client.session_state import NodeHealth
from cellar.errors import Status
from cellar.proto.tiers import TIER_DISK
from cellar.transfer.base import TransferResult

TRUST_MS = 500


def trusted_read(locations: Locations, keys: tuple[str, ...] = ("k",), trust_ms: int = TRUST_MS,
                 disk: bool = False) -> GetBatch:
    """A get of `keys` that asks (the reply grants `trust_ms`) and remembers them."""
    batch = GetBatch(list(keys), None, health=NodeHealth(), locations=locations)
    batch.request(None)
    reply = reply_for({key: VALUE for key in keys})
    reply.read_trust_ms = trust_ms
    if disk:
        reply.segments[0].tier = TIER_DISK
    batch.on_reply(reply)
    batch.on_read_results(fill(batch.next_ops(), {"n1": VALUE}))
    assert all(e.status == Status.OK for e in batch.entries)
    return batch


def test_a_key_within_its_trust_is_read_without_asking() -> None:
    locations = Locations()
    first = trusted_read(locations)
    found = locations.find("k", 0.0)
    assert found is not None
    assert found.trusted_until == pytest.approx(first.asked_at + TRUST_MS / 1000 - TRUST_MARGIN_S)
    batch = GetBatch(["k"], None, health=NodeHealth(), locations=locations)
    (op,) = batch.start_trusted()
    batch.on_trusted(early_fill([op], VALUE))
    assert not batch.unsettled()  # nothing left to ask for
    assert take_value(batch.entries[0]) == VALUE
    assert (locations.trusted, locations.untrusted) == (1, 0)


def test_trusted_reads_are_counted_in_the_client_metrics() -> None:
    from cellar.client import metrics

    def count(outcome: str) -> float:
        value = metrics.REGISTRY.get_sample_value("cellar_client_early_reads_total",
                                                  {"outcome": outcome})
        return value or 0.0

    before = count("trusted"), count("trusted_failed"), count("kept")
    locations = Locations()
    trusted_read(locations, keys=("a", "b"))
    batch = GetBatch(["a", "b"], None, health=NodeHealth(), locations=locations)
    ops = batch.start_trusted()
    batch.on_trusted([early_fill([ops[0]], VALUE)[0], TransferResult(6, "refused")])
    assert (count("trusted"), count("trusted_failed"), count("kept")) == \
        (before[0] + 1, before[1] + 1, before[2])


def test_no_trust_past_its_end_for_disk_replicas_or_without_a_grant_of_it() -> None:
    locations = Locations()
    trusted_read(locations)
    end = locations.find("k", 0.0).trusted_until  # type: ignore[union-attr]
    assert GetBatch(["k"], None, health=NodeHealth(),
                    locations=locations).start_trusted(now=end) == []
    trusted_read(locations, disk=True)
    assert GetBatch(["k"], None, health=NodeHealth(), locations=locations).start_trusted() == []
    trusted_read(locations, trust_ms=0)
    assert GetBatch(["k"], None, health=NodeHealth(), locations=locations).start_trusted() == []
    off = Locations(trust=False)
    trusted_read(off)
    assert GetBatch(["k"], None, health=NodeHealth(), locations=off).start_trusted() == []


def test_bytes_that_do_not_hash_to_the_checksum_are_cleared_and_asked_for() -> None:
    locations = Locations()
    trusted_read(locations)
    dest = memoryview(bytearray(len(VALUE)))
    batch = GetBatch(["k"], [dest], health=NodeHealth(), locations=locations)
    batch.on_trusted(early_fill(batch.start_trusted(), OTHER))  # the range holds other bytes
    assert bytes(dest) == bytes(len(VALUE)), "the caller's buffer holds none of them"
    assert batch.unsettled()
    request = batch.request(None)
    assert list(request.keys) == ["k"]
    batch.on_reply(reply_for({"k": VALUE}, missing={"k"}))  # it was removed meanwhile
    assert batch.next_ops() == []
    assert into_result(batch.entries[0]) < 0  # MISS
    assert (locations.trusted, locations.untrusted) == (0, 1)


def test_only_the_keys_not_read_are_asked_for() -> None:
    locations = Locations()
    trusted_read(locations, keys=("a", "b"))
    batch = GetBatch(["a", "new", "b"], None, health=NodeHealth(), locations=locations)
    ops = batch.start_trusted()
    assert len(ops) == 2
    batch.on_trusted([early_fill([ops[0]], VALUE)[0], TransferResult(6, "refused")])
    assert [e.status for e in batch.entries] == [Status.OK, None, None]
    assert list(batch.request(None).keys) == ["new", "b"]
    batch.on_reply(reply_for({"new": VALUE, "b": VALUE}))
    batch.on_read_results(fill(batch.next_ops(), {"n1": VALUE}))
    assert [take_value(e) for e in batch.entries] == [VALUE] * 3


def test_prefix_mode_trusts_only_the_leading_keys_and_cuts_after_a_failure() -> None:
    locations = Locations()
    trusted_read(locations, keys=("a", "c", "d"))
    batch = GetBatch(["a", "b", "c"], None, health=NodeHealth(), locations=locations,
                     prefix=True)
    ops = batch.start_trusted()
    assert len(ops) == 1  # "b" has no trust: "c" waits for the answer
    batch.on_trusted(early_fill(ops, VALUE))
    trusted_read(locations, keys=("a", "c", "d"))
    batch = GetBatch(["a", "c", "d"], None, health=NodeHealth(), locations=locations,
                     prefix=True)
    ops = batch.start_trusted()
    assert len(ops) == 3
    results = early_fill(ops, VALUE)
    results[1] = TransferResult(6, "refused")
    batch.on_trusted(results)
    # "d" read fine but follows a key that must be asked for: it is asked for too
    assert [e.status for e in batch.entries] == [Status.OK, None, None]
    assert (locations.trusted, locations.untrusted) == (1 + 1, 1)  # "a" in both batches


def test_a_change_this_process_begins_ends_its_trust_in_every_client() -> None:
    one, two = Locations(), Locations()
    trusted_read(one, keys=("k", "j"))
    trusted_read(two, keys=("k",))
    one.changing(["k"])
    assert one.find("k", 0.0).trusted_until == 0.0  # type: ignore[union-attr]
    assert two.find("k", 0.0).trusted_until == 0.0  # type: ignore[union-attr]
    assert one.find("j", 0.0).trusted_until > 0.0  # type: ignore[union-attr]
    assert one.find("k", 0.0) is not None, "still read early: the reply checks that"
    two.changing(None)
    assert one.find("j", 0.0).trusted_until == 0.0  # type: ignore[union-attr]


def test_a_reply_to_a_request_sent_before_a_change_grants_no_trust() -> None:
    locations = Locations()
    batch = GetBatch(["k"], None, health=NodeHealth(), locations=locations)
    batch.request(None)  # sent ...
    time.sleep(0.001)
    Locations().changing(["other"])  # ... then this process began a change (any key)
    reply = reply_for({"k": VALUE})
    reply.read_trust_ms = TRUST_MS
    batch.on_reply(reply)
    batch.on_read_results(fill(batch.next_ops(), {"n1": VALUE}))
    assert locations.find("k", 0.0).trusted_until == 0.0  # type: ignore[union-attr]


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, on in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv("CELLAR_TRUSTED_READS", text)
        assert trusted_reads_from_env() is on
    monkeypatch.setenv("CELLAR_TRUSTED_READS", "no")
    with pytest.raises(cellar.InvalidArgument, match="CELLAR_TRUSTED_READS"):
        trusted_reads_from_env()
