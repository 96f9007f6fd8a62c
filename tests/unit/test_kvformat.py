"""The KV format guard (cellar.integrations.kvformat): pure logic, no engine, no cluster."""

from __future__ import annotations

import dataclasses

import pytest

from cellar.errors import InvalidArgument
from cellar.integrations.kvformat import HEADER_BYTES, FormatMismatch, KVFormat


def fmt(**over: object) -> KVFormat:
    base: dict[str, object] = dict(model="m/a@1", kv_dtype="bfloat16", layout="page_first",
                                   page_size_tokens=64, parallel_rule="tp1",
                                   adapter="sglang-hicache", adapter_version=1,
                                   shape=(("layers", "32"), ("heads", "8")))
    base.update(over)
    return KVFormat(**base)  # type: ignore[arg-type]


def test_namespace_is_stable_and_short() -> None:
    a, b = fmt(), fmt(shape=(("heads", "8"), ("layers", "32")))
    assert a == b and a.namespace() == b.namespace()
    assert a.namespace().startswith("kv-") and len(a.namespace()) == 3 + 16
    assert a.key("abc") == f"{a.namespace()}/abc"
    # a listing under key_prefix() gives the engine keys back; the descriptor lives there too
    assert a.key("abc").removeprefix(a.key_prefix()) == "abc"
    assert a.descriptor_key() == a.key("format") and a.descriptor_key().startswith(a.key_prefix())
    # The hash input is pinned: a change to it must be deliberate (FORMAT_SCHEMA bump).
    assert fmt().namespace() == KVFormat.from_descriptor(fmt().descriptor()).namespace()


@pytest.mark.parametrize("field,value", [
    ("model", "m/b@1"), ("kv_dtype", "float16"), ("layout", "layer_first"),
    ("page_size_tokens", 32), ("parallel_rule", "tp2"), ("adapter", "lmcache"),
    ("adapter_version", 2), ("shape", (("layers", "31"), ("heads", "8"))),
])
def test_every_field_changes_the_namespace(field: str, value: object) -> None:
    assert fmt(**{field: value}).namespace() != fmt().namespace()


@pytest.mark.parametrize("over", [
    {"model": ""}, {"kv_dtype": "bf 16"}, {"page_size_tokens": 0}, {"page_size_tokens": True},
    {"adapter_version": -1}, {"model": "x" * 300}, {"shape": (("a", "1"), ("a", "2"))},
    {"shape": 5},
])
def test_bad_fields_are_refused(over: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        fmt(**over)


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        fmt().model = "other"  # type: ignore[misc]


def test_header_round_trip_and_refusals() -> None:
    f = fmt()
    h = f.header(1000)
    assert len(h) == HEADER_BYTES
    assert f.verify_header(h, HEADER_BYTES + 1000) == 1000
    assert f.verify_header(bytearray(h) + b"payload...") == 1000
    with pytest.raises(FormatMismatch):  # shorter than the header says
        f.verify_header(h, HEADER_BYTES + 999)
    with pytest.raises(FormatMismatch):  # longer
        f.verify_header(h, HEADER_BYTES + 1001)
    with pytest.raises(FormatMismatch):  # another format
        fmt(kv_dtype="float16").verify_header(h, HEADER_BYTES + 1000)
    with pytest.raises(FormatMismatch):
        f.verify_header(b"\0" * HEADER_BYTES)
    with pytest.raises(FormatMismatch):
        f.verify_header(h[:10])
    with pytest.raises(InvalidArgument):
        f.header(-1)


def test_check_size() -> None:
    f = fmt()
    f.check_size(4096, 4096)
    for bad in (4095, 4097, 0):
        with pytest.raises(FormatMismatch):
            f.check_size(bad, 4096)


def test_descriptor_refuses_garbage() -> None:
    for bad in (b"", b"{}", b"[1]", b'{"schema": 99}'):
        with pytest.raises(InvalidArgument):
            KVFormat.from_descriptor(bad)
