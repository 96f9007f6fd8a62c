"""A one-key get made in one step (client/one_read.py): the logic, on fake replies and a fake
transport. A trusted read is made only where the general flow would make the same one (the
key's place within its trust, DRAM, a node no read failed on lately, a buffer the value fits,
a transport that reaches the node); its bytes are kept only if they hash to the place's
checksum, and then the call is counted as a get; otherwise the caller's buffer is cleared, the
place forgotten (so the general flow asks the master) and the failure counted. A key whose
place is not known at all is one lookup then one read of its first replica: pins released,
a miss raised and counted as the flow does, bytes that do not hash cleared and left to the
flow. The real-process checks are tests/integration/test_sdk_trusted_reads.py and
tests/integration/test_sdk_one_lookup.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
import xxhash
from test_client_early_reads import OTHER, VALUE, reply_for
from test_client_trusted_reads import trusted_read

import cellar
from cellar.client import metrics, one_read, operations
from cellar.client.early_reads import Locations
from cellar.client.flows import Session
from cellar.client.session_state import TransportSet
from cellar.proto import cellar_pb2 as pb
from cellar.transfer.base import ST_CONNECT_FAILED, TransferResult


class FakeTransport:
    name = "tcp"

    def __init__(self, reach: bool = True) -> None:
        self.reach = reach
        self.forgotten: list[Any] = []

    def can_reach(self, route: Any) -> bool:
        return self.reach

    def forget(self, route: Any) -> None:
        self.forgotten.append(route)


class View:
    generation = 0
    switched_at = -1e9


def session(locations: Locations | None, transport: FakeTransport | None = None,
            released: list[int] | None = None) -> Session:
    return Session("t", pb.RequestHeader(tenant="t", client_id="c"), 5.0, View(),
                   TransportSet([transport or FakeTransport()]),
                   (released.extend if released is not None else lambda ids: None),
                   locations=locations)


def landed(one: one_read.OneRead, data: bytes) -> TransferResult:
    """The node served `data` into the read's view, hashed as the transport does."""
    one.view[:] = data[:one.view.nbytes]
    return TransferResult(checksum=xxhash.xxh3_64_intdigest(bytes(one.view)))


def gets_counted() -> tuple[float, float]:
    def sample(name: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, {"op": "get"}) or 0.0
    return sample("cellar_client_requests_total"), sample("cellar_client_bytes_total")


def test_a_trusted_key_is_one_read_into_the_callers_buffer_and_counted_as_a_get() -> None:
    locations = Locations()
    trusted_read(locations)
    s = session(locations)
    buffer = memoryview(bytearray(len(VALUE) + 10))
    one = operations.one_get_into(s, "k", buffer)
    assert one is not None and one.view.nbytes == len(VALUE)  # cut to the value's size
    requests, nbytes = gets_counted()
    assert one_read.finish(s, one, landed(one, VALUE), time.perf_counter()) == len(VALUE)
    assert bytes(buffer[:len(VALUE)]) == VALUE and bytes(buffer[len(VALUE):]) == bytes(10)
    assert (locations.trusted, locations.untrusted) == (1, 0)
    assert gets_counted() == (requests + 1, nbytes + len(VALUE))


def test_get_reads_into_new_bytes() -> None:
    locations = Locations()
    trusted_read(locations)
    s = session(locations)
    one = operations.one_get(s, "k")
    assert one is not None
    assert one_read.finish(s, one, landed(one, VALUE), time.perf_counter()) == len(VALUE)
    assert one_read.value(one) == VALUE


def test_bytes_that_do_not_hash_to_the_checksum_are_cleared_and_the_place_forgotten() -> None:
    locations = Locations()
    trusted_read(locations)
    s = session(locations)
    buffer = memoryview(bytearray(len(VALUE)))
    one = operations.one_get_into(s, "k", buffer)
    assert one is not None
    requests, _ = gets_counted()
    assert one_read.finish(s, one, landed(one, OTHER), time.perf_counter()) == -1
    assert bytes(buffer) == bytes(len(VALUE)), "the caller's buffer holds none of them"
    assert locations.find("k", time.monotonic()) is None  # the general flow asks the master
    assert (locations.trusted, locations.untrusted) == (0, 1)
    assert gets_counted()[0] == requests  # the general flow counts the call


def test_a_node_that_refused_is_forgotten_by_the_transport() -> None:
    locations = Locations()
    trusted_read(locations)
    transport = FakeTransport()
    s = session(locations, transport)
    one = operations.one_get_into(s, "k", memoryview(bytearray(len(VALUE))))
    assert one is not None
    failed = TransferResult(ST_CONNECT_FAILED, "refused")
    assert one_read.finish(s, one, failed, time.perf_counter()) == -1
    assert transport.forgotten == [one.location.route]


def test_no_one_read_where_the_general_flow_would_not_trust() -> None:
    fits = memoryview(bytearray(len(VALUE)))
    locations = Locations()
    trusted_read(locations, trust_ms=0)  # known, but no trust granted: the flow reads early
    assert operations.one_get_into(session(locations), "k", fits) is None
    locations = Locations()
    trusted_read(locations, disk=True)
    assert operations.one_get_into(session(locations), "k", fits) is None  # a disk replica
    locations = Locations()
    trusted_read(locations)
    short = memoryview(bytearray(len(VALUE) - 1))
    assert operations.one_get_into(session(locations), "k", short) is None  # BufferTooSmall
    assert operations.one_get_into(session(locations, FakeTransport(reach=False)), "k",
                                   fits) is None
    s = session(locations)
    s.health.mark_failed("n1")
    assert operations.one_get_into(s, "k", fits) is None  # a node a read failed on lately
    assert operations.one_get_into(session(locations), "", fits) is None  # the flow says why
    assert operations.one_get_into(session(locations), "k", b"read-only") is None
    assert operations.one_get_into(session(locations), "k", fits) is not None


def looked_up(locations: Locations | None, buffer: memoryview | None = None,
              released: list[int] | None = None, missing: tuple[str, ...] = ()
              ) -> tuple[Session, one_read.OneRead, bool]:
    """A get of "k" this client never read: its lookup made against a fake reply."""
    s = session(locations, released=released)
    s.unpins.add([41, 42])  # releases queued by earlier gets ride on the lookup
    one = operations.one_get_into(s, "k", buffer) if buffer is not None else \
        operations.one_get(s, "k")
    assert one is not None and one.batch is not None and one.op is None
    request = one_read.lookup_request(s, one)
    assert list(request.keys) == ["k"] and list(request.unpin_ids) == [41, 42]
    return s, one, one_read.on_lookup(s, one, reply_for({"k": VALUE}, missing=missing))


def test_a_key_never_read_is_one_lookup_then_one_read_of_its_first_replica() -> None:
    locations, released = Locations(), []
    buffer = memoryview(bytearray(len(VALUE) + 10))
    requests, nbytes = gets_counted()
    s, one, planned = looked_up(locations, buffer, released)
    assert planned and one.ops()[0].route.node_id == "n1"
    assert one_read.finish(s, one, landed(one, VALUE), time.perf_counter()) == len(VALUE)
    assert bytes(buffer[:len(VALUE)]) == VALUE and bytes(buffer[len(VALUE):]) == bytes(10)
    assert released == [1]  # the lookup's pin, queued for release
    assert locations.find("k", time.monotonic()) is not None  # the next get may read early
    assert locations.looked_up == 1  # counted (the soak reports it)
    assert gets_counted() == (requests + 1, nbytes + len(VALUE))
    s, one, planned = looked_up(Locations())  # `get`: into new bytes
    assert planned and one_read.finish(s, one, landed(one, VALUE), time.perf_counter()) > 0
    assert one_read.value(one) == VALUE


def test_a_lookup_that_misses_raises_not_found_counted_with_its_pins_released() -> None:
    released: list[int] = []
    requests, _ = gets_counted()
    with pytest.raises(cellar.NotFound):
        looked_up(Locations(), memoryview(bytearray(len(VALUE))), released, missing=("k",))
    assert gets_counted()[0] == requests + 1 and released == []  # a miss holds no pin


def test_a_lookup_read_that_does_not_hash_leaves_nothing_and_the_flow_asks_again() -> None:
    locations, released = Locations(), []
    buffer = memoryview(bytearray(len(VALUE)))
    requests, _ = gets_counted()
    s, one, planned = looked_up(locations, buffer, released)
    assert planned
    assert one_read.finish(s, one, landed(one, OTHER), time.perf_counter()) == -1
    assert bytes(buffer) == bytes(len(VALUE)), "the caller's buffer holds none of them"
    assert released == [1] and locations.find("k", time.monotonic()) is None
    assert gets_counted()[0] == requests  # the general flow counts the call


def test_a_lookup_whose_value_does_not_fit_raises_before_any_read() -> None:
    released: list[int] = []
    with pytest.raises(cellar.BufferTooSmall):
        looked_up(Locations(), memoryview(bytearray(len(VALUE) - 1)), released)
    assert released == [1]


def test_a_lookup_that_raised_puts_its_pin_releases_back() -> None:
    s = session(Locations())
    s.unpins.add([7])
    one = operations.one_get_into(s, "k", memoryview(bytearray(8)))
    assert one is not None
    one_read.lookup_request(s, one)
    assert s.unpins.drain() == []
    one_read.lookup_failed(s, one, cellar.Timeout("no answer"))
    assert s.unpins.drain() == [7]


def test_no_lookup_without_a_transport_to_the_replica() -> None:
    released: list[int] = []
    s = session(Locations(), FakeTransport(reach=False), released)
    one = operations.one_get_into(s, "k", memoryview(bytearray(len(VALUE))))
    assert one is not None
    one_read.lookup_request(s, one)
    assert not one_read.on_lookup(s, one, reply_for({"k": VALUE}))  # the flow answers
    assert released == [1]
