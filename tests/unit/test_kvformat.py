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
    assert fmt().namespace() == KVFormat.from_descriptor(fmt().descriptor()).namespace()


# Golden values, computed once and written down. Every stored KV page lives under its format's
# namespace and carries its fingerprint, so a change to the hash input (a field renamed, a
# separator, a salt, the digest) would orphan every stored page after an upgrade. It must be
# deliberate: bump FORMAT_SCHEMA and update these values in the same change.
GOLDEN = [
    (dict(), "f966ef04485c57403cc9049b9d72d5a6",
     b'{"adapter":"sglang-hicache","adapter_version":1,"kv_dtype":"bfloat16",'
     b'"layout":"page_first","model":"m/a@1","page_size_tokens":64,"parallel_rule":"tp1",'
     b'"schema":1,"shape":[["heads","8"],["layers","32"]]}'),
    # what sglang's page_format gives for an MHA pool at tp2 ...
    (dict(model="Qwen/Qwen2.5-0.5B-Instruct", parallel_rule="tp2",
          shape=(("layers", "0-24"), ("object_bytes", "393216"), ("heads", "2"),
                 ("head_dim", "64"), ("v_head_dim", "64"))),
     "19b1ed3581a6ce667b0fc5d513096e5c", None),
    # ... and for an MLA pool
    (dict(model="deepseek-ai/DeepSeek-V2-Lite", kv_dtype="float8_e4m3fn", layout="layer_first",
          page_size_tokens=1, parallel_rule="mla",
          shape=(("layers", "0-27"), ("object_bytes", "16128"), ("kv_cache_dim", "576"))),
     "0d3e0aab0781f5727c59b3b0f2ad1dfa", None),
    # what the LMCache connector's chunk_format gives for a raw chunk
    (dict(model="facebook/opt-125m", kv_dtype="float16", layout="KV_2LTD.raw",
          page_size_tokens=256, adapter="lmcache",
          shape=(("chunk_shapes", "2x12x256x768"), ("chunk_bytes", "9437184"))),
     "b88d4744584052191a62605f962d4d62",
     b'{"adapter":"lmcache","adapter_version":1,"kv_dtype":"float16","layout":"KV_2LTD.raw",'
     b'"model":"facebook/opt-125m","page_size_tokens":256,"parallel_rule":"tp1","schema":1,'
     b'"shape":[["chunk_bytes","9437184"],["chunk_shapes","2x12x256x768"]]}'),
]


@pytest.mark.parametrize("over,fingerprint,descriptor", GOLDEN,
                         ids=["base", "sglang-mha", "sglang-mla", "lmcache"])
def test_namespace_fingerprint_and_header_are_pinned(over: dict[str, object], fingerprint: str,
                                                     descriptor: bytes | None) -> None:
    f = fmt(**over)
    assert f.fingerprint().hex() == fingerprint
    assert f.namespace() == "kv-" + fingerprint[:16]
    assert f.header(4096).hex() == "434b564601000000" + fingerprint + "0010000000000000"
    if descriptor is not None:
        assert f.descriptor() == descriptor


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
