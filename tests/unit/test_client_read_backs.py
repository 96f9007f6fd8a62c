"""client/read_backs.py on fake replies: when a PutEnd asks for read backs, and what of its
reply's `reads` the client keeps (trusted until the reply's trust counted from when the
PutEnd left, never a disk replica's, nothing from a reply that does not match its items). The
real-process checks are in tests/integration/test_sdk_trusted_reads.py."""

from __future__ import annotations

import time

import pytest
from test_client_early_reads import VALUE, reply_for

import cellar
from cellar.client import read_backs
from cellar.client.early_reads import Locations
from cellar.client.gets import TRUST_MARGIN_S
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import GRANT_OP_READ
from cellar.proto.tiers import TIER_DISK


def put_end_reply(keys: list[str], stored: set[str], trust_ms: int = 500) -> pb.PutEndReply:
    """A PutEnd reply reading back `stored` of `keys` (NOT_FOUND for the others)."""
    got = reply_for({key: VALUE for key in keys})
    reply = pb.PutEndReply(header=got.header, segments=got.segments, read_trust_ms=trust_ms)
    for key, result in zip(keys, got.results, strict=True):
        reply.results.add()
        if key in stored:
            reply.reads.add().CopyFrom(result)
        else:
            reply.reads.add(status=pb.NOT_FOUND)
    return reply


def test_what_a_putend_asks_for() -> None:
    locations = Locations()
    assert read_backs.wanted(locations, 16, 1) and read_backs.wanted(locations, 16, 16)
    assert not read_backs.wanted(locations, 16, 17)
    assert not read_backs.wanted(locations, 0, 1)   # the default: never
    assert not read_backs.wanted(None, 16, 1)        # no early reads at all
    assert not read_backs.wanted(Locations(trust=False), 16, 1)  # CELLAR_TRUSTED_READS=0


def test_the_stored_keys_are_kept_trusted_from_when_the_putend_left() -> None:
    locations = Locations()
    sent = time.monotonic()
    reply = put_end_reply(["a", "b", "c"], stored={"a", "c"})
    assert read_backs.remember(locations, ["a", "b", "c"], reply, sent) == 2
    now = time.monotonic()
    a = locations.find("a", now)
    assert a is not None and locations.find("b", now) is None
    assert a.trusted_until == pytest.approx(sent + 0.5 - TRUST_MARGIN_S)
    assert (a.size, a.disk, a.grant.op) == (len(VALUE), False, GRANT_OP_READ)


def test_nothing_is_kept_from_a_reply_that_does_not_match_or_grants_no_trust() -> None:
    locations = Locations()
    reply = put_end_reply(["a"], stored={"a"})
    assert read_backs.remember(locations, ["a", "b"], reply, time.monotonic()) == 0
    del reply.reads[:]  # a master that does not know read_back
    assert read_backs.remember(locations, ["a"], reply, time.monotonic()) == 0
    assert len(locations) == 0
    untrusted = put_end_reply(["a"], stored={"a"}, trust_ms=0)
    assert read_backs.remember(locations, ["a"], untrusted, time.monotonic()) == 1
    found = locations.find("a", time.monotonic())
    assert found is not None and found.trusted_until == 0.0  # an early read only


def test_a_disk_replica_is_kept_for_early_reads_only() -> None:
    locations = Locations()
    reply = put_end_reply(["a"], stored={"a"})
    reply.segments[0].tier = TIER_DISK
    assert read_backs.remember(locations, ["a"], reply, time.monotonic()) == 1
    found = locations.find("a", time.monotonic())
    assert found is not None and found.disk and found.trusted_until == 0.0


def test_a_replica_outside_its_segment_is_not_kept() -> None:
    locations = Locations()
    reply = put_end_reply(["a"], stored={"a"})
    reply.reads[0].replicas[0].offset = reply.segments[0].size_bytes  # past the segment's end
    assert read_backs.remember(locations, ["a"], reply, time.monotonic()) == 0


@pytest.mark.parametrize("text, value", [("", 0), ("0", 0), ("16", 16), (" 4096 ", 4096)])
def test_the_setting(monkeypatch: pytest.MonkeyPatch, text: str, value: int) -> None:
    monkeypatch.setenv(read_backs.READ_BACK_ENV, text)
    assert read_backs.keys_from_env() == value


@pytest.mark.parametrize("text", ["-1", "4097", "all", "1.5"])
def test_the_setting_refuses_garbage(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(read_backs.READ_BACK_ENV, text)
    with pytest.raises(cellar.InvalidArgument, match=read_backs.READ_BACK_ENV):
        read_backs.keys_from_env()
