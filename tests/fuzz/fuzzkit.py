"""Helpers for the property-based fuzz tests (imported by tests/fuzz/test_props_*.py; no tests).

- `message(cls)`: a hypothesis strategy of random protobuf messages of `cls`, every field drawn
  from its whole range with the edges weighted in (0, 1, 2^63-1, 2^64-1, huge and empty
  strings, unknown enum values), nested messages to a bounded depth;
- `seeded_servicer()`: a real MasterServicer (behind its real Authorizer) over a real
  MasterService with two mounted segments, two tenants and a few objects (complete, being
  written, pinned), so fuzzed requests reach real code paths; `TOKENS` holds valid
  credentials of every kind (admin, tenant, node) for it, and `authed(cls)` draws messages
  carrying one of them (or none, or junk), so most requests get past authentication;
- `fingerprint(service)`: everything a request could change that is stored, to assert that a
  refused request changed nothing.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

from cellar.master.config import MasterConfig
from cellar.master.service import MasterService, PutEndItem, PutItem
from cellar.master.serving.auth import Authorizer
from cellar.master.serving.leadership import Leadership
from cellar.master.serving.servicer import MasterServicer
from cellar.proto import cellar_pb2 as pb
from cellar.proto.grant import node_credential
from cellar.tokens import KIND_ADMIN, KIND_TENANT, TokenStore
from tests.support.receipts import receipts_for

SECRET = bytes(range(32))
MAX_DEPTH = 3
U64_EDGES = [0, 1, 2, 7, 4096, (1 << 31) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
U32_EDGES = [0, 1, 2, 7, 1024, (1 << 31) - 1, (1 << 32) - 1]
# names the seeded state uses, so fuzzed requests hit existing tenants, keys, nodes, segments
WORDS = ["", "default", "alpha", "beta", "k0", "k1", "w0", "node-a", "node-b", "x" * 2000,
         "\x00", "é", "a/b"]


def _ints(lo: int, hi: int, edges: list[int]) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([e for e in edges if lo <= e <= hi]), st.integers(lo, hi))


_TEXT = st.one_of(st.sampled_from(WORDS),
                  st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_UINT64: _ints(0, (1 << 64) - 1, U64_EDGES),
    FieldDescriptor.TYPE_FIXED64: _ints(0, (1 << 64) - 1, U64_EDGES),
    FieldDescriptor.TYPE_UINT32: _ints(0, (1 << 32) - 1, U32_EDGES),
    FieldDescriptor.TYPE_FIXED32: _ints(0, (1 << 32) - 1, U32_EDGES),
    FieldDescriptor.TYPE_INT64: _ints(-(1 << 63), (1 << 63) - 1, [-1, *U64_EDGES[:8]]),
    FieldDescriptor.TYPE_INT32: _ints(-(1 << 31), (1 << 31) - 1, [-1, *U32_EDGES[:6]]),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_STRING: _TEXT,
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=48),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True),
}


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message(message_factory.GetMessageClass(field.message_type), depth + 1)
    if field.type == FieldDescriptor.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(values), st.integers(-(1 << 31), (1 << 31) - 1))
    return _SCALARS[field.type]


def message(cls: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Random messages of protobuf class `cls` (see the module docstring)."""
    if depth > MAX_DEPTH:
        return st.just(cls())
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in cls.DESCRIPTOR.fields:
        one = st.deferred(lambda f=field: _field(f, depth))
        parts[field.name] = st.lists(one, max_size=4) if field.is_repeated else one
    return st.fixed_dictionaries({}, optional=parts).map(lambda values: _build(cls, values))


def _build(cls: Any, values: dict[str, Any]) -> Any:
    msg = cls()
    for name, value in values.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        target = getattr(msg, name)
        if field.is_repeated:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value:
                    target.add().CopyFrom(item)
            else:
                target.extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg


_STORE = TokenStore(None)
TOKENS: dict[str, str] = {"admin": _STORE.create(KIND_ADMIN)[1]}
for _tenant in ("default", "alpha", "beta"):
    TOKENS[_tenant] = _STORE.create(KIND_TENANT, _tenant)[1]
for _node in ("node-a", "node-b"):
    TOKENS[_node] = node_credential(SECRET, _node)
CREDENTIALS = [*TOKENS.values(), "", "cellar_junk", "cellarnode_00_node-a"]


def authed(cls: Any) -> st.SearchStrategy[Any]:
    """Random `cls` messages whose header carries a valid credential (mostly), or none/junk."""
    def sign(pair: tuple[Any, str]) -> Any:
        msg, token = pair
        if "header" in cls.DESCRIPTOR.fields_by_name:
            msg.header.token = token
        return msg
    return st.tuples(message(cls), st.sampled_from(CREDENTIALS)).map(sign)


def _info(segment_id: int, node_id: str) -> pb.SegmentInfo:
    return pb.SegmentInfo(segment_id=segment_id, size_bytes=64 << 20, host_id="h-" + node_id,
                          node_id=node_id,
                          endpoints=[pb.Endpoint(transport="tcp", address="127.0.0.1:1")])


def seeded_servicer(**settings: Any) -> MasterServicer:
    settings.setdefault("new_node_ramp_s", 0.0)
    settings.setdefault("rebuild_grace_s", 0.0)
    settings.setdefault("tenants", {"alpha": {"quota_bytes": "32MiB", "hard_pin": True},
                                    "beta": {"quota_objects": 10}})
    config = MasterConfig(**settings)
    config.validate()
    servicer = MasterServicer(Leadership(config, SECRET, ha=False), Authorizer(_STORE, SECRET))
    service = servicer.service
    for i, node in enumerate(("node-a", "node-b")):
        assert service.mount_segment(node, 1, [_info(i + 1, node)]).results == [(0, "")]
    for tenant in ("", "alpha", "beta"):
        for i in range(3):
            r = service.put_start(tenant, "seed", [PutItem(f"k{i}", 4096 * (i + 1))]).results[0]
            assert r.status == 0, r.message
            service.put_end(tenant, "seed", [PutEndItem(f"k{i}", r.put_id, i, receipts_for(SECRET, r, i))])
        service.put_start(tenant, "seed", [PutItem("w0", 8192)])  # left WRITING
        service.get_replicas(tenant, "seed", ["k0"])  # left pinned
    return servicer


def fingerprint(service: MasterService) -> tuple[Any, ...]:
    """What is stored: tenants and their use, objects, puts, pins, segments, allocators."""
    tenants = tuple(sorted(
        (name, t.used_bytes, t.object_count, t.writing_bytes, t.hard_pinned_bytes,
         t.quota_bytes, t.quota_objects, tuple(sorted(t.objects)), tuple(sorted(t.writing)))
        for name, t in service.tenants.by_name.items()))
    segments = tuple(sorted((sid, s.node.node_id, s.allocator.used_bytes)
                            for sid, s in service.membership.segments.items()))
    return (tenants, segments, len(service.objects.puts), len(service.pins),
            service.evictor.evicted_keys, service.objects.complete_count)
