"""Every servicer handler's request message, with random field values, through the servicer.

Random protobuf messages of each request type (every field over its whole range, edges
weighted in: see fuzzkit.message) go through `MasterServicer.dispatch`, the body both the gRPC
handlers and the fast line run, against a real MasterService holding objects. Properties:
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
from fuzzkit import SECRET, fingerprint, message, seeded_servicer
from hypothesis import given
from hypothesis import strategies as st

from cellar.master.auth import METHOD_POLICY, NODE_RPC
from cellar.master.servicer import MasterServicer
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import node_credential

INTERNAL = grpc.StatusCode.INTERNAL.value[0]
MESSAGES: dict[str, tuple[Any, Any]] = MasterServicer._messages()


def _authorize(servicer: MasterServicer, name: str, request: Any, authorized: bool) -> None:
    """Give most requests a credential the master accepts, so their fields reach the handler
    (the rest keep their random token and exercise the refusal path)."""
    if not authorized:
        return
    if METHOD_POLICY.get(name) == NODE_RPC:
        request.header.token = node_credential(SECRET, getattr(request, "node_id", ""))
    else:
        request.header.token = servicer.admin_token  # type: ignore[attr-defined]


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

    @given(message(MESSAGES[name][0]), st.sampled_from([True, True, True, False]))
    def run(request: Any, authorized: bool) -> None:
        _authorize(servicer, name, request, authorized)
        _check(servicer, name, request)

    run()
    # the master still serves a plain request afterwards (UNAVAILABLE while a fuzzed mount
    # announced a report that never came: the rebuild grace, by design)
    header = pb.RequestHeader(token=servicer.admin_token)  # type: ignore[attr-defined]
    code, out = servicer.dispatch("Exists", pb.KeysRequest(header=header,
                                                           keys=["k0"]).SerializeToString())
    expected = grpc.StatusCode.UNAVAILABLE.value[0] if servicer.service.recovering() else 0
    assert code == expected, out


@given(st.lists(st.tuples(st.sampled_from(sorted(MESSAGES)), st.binary(max_size=256)),
                max_size=8))
def test_random_bytes_as_any_request(calls: list[tuple[str, bytes]]) -> None:
    servicer = _shared()
    for name, data in calls:
        before = fingerprint(servicer.service)
        code, out = servicer.dispatch(name, data)
        assert code != INTERNAL, f"{name} raised: {out!r}"
        if code:
            assert fingerprint(servicer.service) == before


_SERVICER: list[MasterServicer] = []


def _shared() -> MasterServicer:
    if not _SERVICER:
        _SERVICER.append(seeded_servicer())
    return _SERVICER[0]
