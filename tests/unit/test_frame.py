"""The data-plane frame codec: round trips and every rejection with its status."""

from __future__ import annotations

import struct

import pytest

from cellar.proto.grant import GRANT_MAC_BYTES, Grant
from cellar.transfer.frame import (
    MAX_MESSAGE_BYTES,
    MAX_META_BYTES,
    OP_PING,
    OP_READ,
    OP_WRITE,
    REQUEST,
    REQUEST_ID_OFFSET,
    REQUEST_MAGIC,
    RESP_FLAG_CLOSE,
    RESPONSE,
    RESPONSE_MAGIC,
    ST_BAD_FRAME,
    ST_BAD_GRANT,
    ST_OK,
    ST_TOO_LARGE,
    ST_UNSUPPORTED,
    VERSION,
    WRITE_META,
    FrameError,
    RequestHeader,
    WriteMeta,
    decode_request,
    decode_response,
    decode_write_meta,
    pack_response,
)

LIMIT = 1 << 20
GRANT = Grant(OP_WRITE, 9, 4096, 8192, 77, 3, 1_700_000_000_000, 0xDEADBEEF, b"m" * GRANT_MAC_BYTES)


def _raw(**over: object) -> bytes:
    """A request header with selected raw fields replaced (layout order of REQUEST)."""
    fields: dict[str, object] = dict(
        magic=REQUEST_MAGIC, version=VERSION, op=OP_WRITE, flags=0, meta_len=0, request_id=5,
        segment_id=9, goff=4096, glen=8192, alloc=77, epoch=3, expiry=1, tag=2,
        mac=b"m" * GRANT_MAC_BYTES, offset=4096, length=100)
    fields.update(over)
    return REQUEST.pack(*fields.values())


def test_sizes_are_the_documented_layout() -> None:
    assert REQUEST.size == 108
    assert RESPONSE.size == 28
    assert WRITE_META.size == 20
    # request_id sits where an error reply to an undecodable header looks for it
    assert struct.unpack_from("<Q", _raw(request_id=1234), REQUEST_ID_OFFSET)[0] == 1234


@pytest.mark.parametrize("op", [OP_READ, OP_WRITE])
def test_request_round_trip(op: int) -> None:
    g = Grant(op, GRANT.segment_id, GRANT.offset, GRANT.length, GRANT.alloc_id, GRANT.epoch,
              GRANT.expiry_ms, GRANT.key_tag, GRANT.mac)
    h = RequestHeader(op, request_id=2**64 - 1, segment_id=9, offset=5000, length=3000,
                      meta_len=40, flags=0, grant=g)
    d = decode_request(h.pack(), max_payload_bytes=LIMIT)
    assert d == h
    assert d.grant == g


def test_ping_round_trip_has_no_grant() -> None:
    h = RequestHeader(OP_PING, request_id=1, segment_id=0, offset=0, length=0)
    d = decode_request(memoryview(h.pack()), max_payload_bytes=LIMIT)
    assert d.op == OP_PING and d.grant is None and d.request_id == 1


def test_length_at_the_limit_is_accepted() -> None:
    assert decode_request(_raw(length=LIMIT), max_payload_bytes=LIMIT).length == LIMIT
    assert decode_request(_raw(meta_len=MAX_META_BYTES), max_payload_bytes=LIMIT).meta_len == \
        MAX_META_BYTES


@pytest.mark.parametrize(("raw", "status"), [
    (_raw(magic=b"XXXX"), ST_BAD_FRAME),
    (_raw(magic=RESPONSE_MAGIC), ST_BAD_FRAME),
    (_raw(version=VERSION + 1), ST_UNSUPPORTED),
    (_raw(version=0), ST_UNSUPPORTED),
    (_raw(op=0), ST_BAD_FRAME),
    (_raw(op=7), ST_BAD_FRAME),  # 4, 5, 6: COMMIT, RDMA_CONNECT, CLAIM
    (_raw(op=255), ST_BAD_FRAME),
    (_raw(meta_len=MAX_META_BYTES + 1), ST_TOO_LARGE),
    (_raw(meta_len=2**32 - 1), ST_TOO_LARGE),
    (_raw(length=LIMIT + 1), ST_TOO_LARGE),
    (_raw(length=2**64 - 1), ST_TOO_LARGE),
    (_raw()[:-1], ST_BAD_FRAME),
    (b"", ST_BAD_FRAME),
    (_raw() + b"\0", ST_BAD_FRAME),
])
def test_request_rejections(raw: bytes, status: int) -> None:
    with pytest.raises(FrameError) as e:
        decode_request(raw, max_payload_bytes=LIMIT)
    assert e.value.status == status
    assert e.value.message


def test_response_round_trip_and_message() -> None:
    ok = pack_response(ST_OK, 42, 4096)
    assert len(ok) == RESPONSE.size
    h = decode_response(ok, max_payload_bytes=LIMIT)
    assert (h.status, h.request_id, h.length, h.msg_len, h.flags) == (ST_OK, 42, 4096, 0, 0)

    err = pack_response(ST_BAD_GRANT, 43, 0, "mac mismatch", RESP_FLAG_CLOSE)
    h = decode_response(err[:RESPONSE.size], max_payload_bytes=LIMIT)
    assert (h.status, h.request_id, h.flags) == (ST_BAD_GRANT, 43, RESP_FLAG_CLOSE)
    assert err[RESPONSE.size:RESPONSE.size + h.msg_len] == b"mac mismatch"


def test_response_message_is_bounded_and_encodable() -> None:
    raw = pack_response(ST_BAD_GRANT, 1, 0, "x" * (MAX_MESSAGE_BYTES * 3))
    assert len(raw) == RESPONSE.size + MAX_MESSAGE_BYTES
    # a lone surrogate must not crash the server's error path
    assert decode_response(pack_response(ST_BAD_GRANT, 1, 0, "\udc80")[:RESPONSE.size],
                           max_payload_bytes=LIMIT).msg_len > 0
    # OK responses carry no message
    assert len(pack_response(ST_OK, 1, 0, "ignored")) == RESPONSE.size


@pytest.mark.parametrize(("raw", "status"), [
    (RESPONSE.pack(b"XXXX", VERSION, 0, 0, 0, 1, 0), ST_BAD_FRAME),
    (RESPONSE.pack(RESPONSE_MAGIC, VERSION + 1, 0, 0, 0, 1, 0), ST_BAD_FRAME),
    (RESPONSE.pack(RESPONSE_MAGIC, VERSION, 0, 0, MAX_MESSAGE_BYTES + 1, 1, 0), ST_TOO_LARGE),
    (RESPONSE.pack(RESPONSE_MAGIC, VERSION, 0, 0, 0, 1, LIMIT + 1), ST_TOO_LARGE),
    (RESPONSE.pack(RESPONSE_MAGIC, VERSION, 0, 0, 0, 1, 0)[:-1], ST_BAD_FRAME),
])
def test_response_rejections(raw: bytes, status: int) -> None:
    with pytest.raises(FrameError) as e:
        decode_response(raw, max_payload_bytes=LIMIT)
    assert e.value.status == status


def test_write_meta_round_trip() -> None:
    m = WriteMeta(checksum=2**64 - 1, object_size=123, tenant="téñant", key="ключ/0")
    assert decode_write_meta(m.pack()) == m
    assert decode_write_meta(memoryview(m.pack())) == m
    empty = WriteMeta(0, 0, "", "")
    assert decode_write_meta(empty.pack()) == empty


def test_write_meta_pack_refuses_over_the_meta_limit() -> None:
    with pytest.raises(FrameError) as e:
        WriteMeta(0, 0, "t", "k" * MAX_META_BYTES).pack()
    assert e.value.status == ST_TOO_LARGE


@pytest.mark.parametrize("raw", [
    b"",
    WRITE_META.pack(1, 2, 3, 4)[:-1],                       # short fixed part
    WRITE_META.pack(1, 2, 3, 4) + b"abc",                  # lengths claim 7, have 3
    WRITE_META.pack(1, 2, 1, 1) + b"abc",                  # lengths claim 2, have 3
    WRITE_META.pack(1, 2, 0xFFFF, 0xFFFF),                 # huge claims, nothing behind
    WRITE_META.pack(1, 2, 2, 1) + b"\xff\xfek",            # tenant not UTF-8
    WRITE_META.pack(1, 2, 1, 2) + b"t\xc3",                # key cut inside a code point
])
def test_write_meta_rejections(raw: bytes) -> None:
    with pytest.raises(FrameError) as e:
        decode_write_meta(raw)
    assert e.value.status == ST_BAD_FRAME
