"""Every servicer handler's request message, with random field values, through the servicer.

Random protobuf messages of each request type (every field over its whole range, edges
weighted in, the header carrying a valid admin, tenant or node credential, or none: see
fuzzkit.authed) go through `MasterServicer.dispatch`, the authorization check and body both
the gRPC handlers and the fast line run, against a real MasterService holding objects.
Properties:
- nothing raises and nothing is INTERNAL (a handler that trips over a value is a bug: the
  alloc id of 2^64-1 in ReportObjects was one);
- a request refused whole (a non-OK code) changes nothing stored;
- a PutStart whose every key was refused changes nothing stored;
- a well-formed request still works afterwards.
Bounded by the hypothesis profile of tests/fuzz/conftest.py (make test: 60 derandomized
examples per RPC; make fuzz: thousands).
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from fuzzkit import CREDENTIALS, TOKENS, authed, fingerprint, seeded_servicer
from hypothesis import given
from hypothesis import strategies as st

from cellar.master.serving.servicer import MasterServicer
from cellar.proto import cellar_pb2 as pb

INTERNAL = grpc.StatusCode.INTERNAL.value[0]
MESSAGES: dict[str, tuple[Any, Any]] = MasterServicer._messages()


def _check(servicer: MasterServicer, name: str, request: Any) -> None:
    service = servicer.service
    before = fingerprint(service)
    code, out = servicer.dispatch(name, request.SerializeToString())
    assert code != INTERNAL, f"{name} raised: {out!r}"
    if code:
        assert fingerprint(service) == before, f"refused {name} ({code}: {out!r}) changed state"
        return
    reply = MESSAGES[name][1].FromString(out)
    if name == "PutStart" and reply.results and all(r.status for r in reply.results):
        assert fingerprint(service) == before, "a PutStart refused for every key changed state"


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_random_requests_never_break_a_handler(name: str) -> None:
    servicer = seeded_servicer()

    @given(authed(MESSAGES[name][0]))
    def run(request: Any) -> None:
        _check(servicer, name, request)

    run()
    # the master still serves a plain request afterwards (UNAVAILABLE while a fuzzed mount
    # announced a report that never came: the rebuild grace, by design)
    request = pb.KeysRequest(header=pb.RequestHeader(token=TOKENS["default"]), keys=["k0"])
    code, out = servicer.dispatch("Exists", request.SerializeToString())
    expected = grpc.StatusCode.UNAVAILABLE.value[0] if servicer.service.recovering() else 0
    assert code == expected, out


@given(st.lists(st.tuples(st.sampled_from(sorted(MESSAGES)), st.binary(max_size=256),
                          st.sampled_from(CREDENTIALS)), max_size=8))
def test_random_bytes_as_any_request(calls: list[tuple[str, bytes, str]]) -> None:
    servicer = _shared()
    for name, data, token in calls:
        # protobuf merges concatenated messages: the appended header (field 1 of every
        # request) carries the credential, so random bodies get past authentication
        suffix = pb.KeysRequest(header=pb.RequestHeader(token=token)).SerializeToString()
        before = fingerprint(servicer.service)
        code, out = servicer.dispatch(name, data + suffix)
        assert code != INTERNAL, f"{name} raised: {out!r}"
        if code:
            assert fingerprint(servicer.service) == before


_SERVICER: list[MasterServicer] = []


def _shared() -> MasterServicer:
    if not _SERVICER:
        _SERVICER.append(seeded_servicer())
    return _SERVICER[0]
