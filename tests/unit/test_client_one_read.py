"""A one-key get made as one trusted read (client/one_read.py): the logic, on fake replies and a
fake transport. It is made only where the general flow would make the same trusted read (the
key's place within its trust, DRAM, a node no read failed on lately, a buffer the value fits,
a transport that reaches the node); its bytes are kept only if they hash to the place's
checksum, and then the call is counted as a get; otherwise the caller's buffer is cleared, the
place forgotten (so the general flow asks the master) and the failure counted. The
real-process checks are tests/integration/test_sdk_trusted_reads.py."""

from __future__ import annotations

import time
from typing import Any

import xxhash
from test_client_early_reads import OTHER, VALUE
from test_client_trusted_reads import trusted_read

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


def session(locations: Locations | None, transport: FakeTransport | None = None) -> Session:
    return Session("t", pb.RequestHeader(tenant="t", client_id="c"), 5.0, View(),
                   TransportSet([transport or FakeTransport()]), lambda ids: None,
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
    assert operations.one_get_into(session(Locations()), "k", fits) is None  # never read
    assert operations.one_get_into(session(None), "k", fits) is None  # early reads off
    locations = Locations()
    trusted_read(locations, trust_ms=0)
    assert operations.one_get_into(session(locations), "k", fits) is None  # no trust granted
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
