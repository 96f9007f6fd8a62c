"""Properties of the data-plane frame codec (cellar.transfer.frame) over random bytes and fields.

- any 108 bytes either decode to a header whose every length lies within the limits, or raise
  FrameError (never another exception);
- a header built from any in-range fields decodes back to the same fields;
- write meta and commit meta: random bytes decode or raise FrameError; packed meta round-trips;
- response headers: random bytes decode within the limits or raise FrameError.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cellar.proto.grant import GRANT_MAC_BYTES, Grant
from cellar.transfer.frame import (
    MAX_MESSAGE_BYTES,
    MAX_META_BYTES,
    OP_RDMA_CONNECT,
    OP_READ,
    OP_WRITE,
    OPS,
    OPS_COMMIT_LIKE,
    OPS_WITHOUT_GRANT,
    REQUEST,
    REQUEST_MAGIC,
    RESPONSE,
    RESPONSE_MAGIC,
    VERSION,
    WRITE_META,
    FrameError,
    RequestHeader,
    WriteMeta,
    decode_commit_meta,
    decode_request,
    decode_response,
    decode_write_meta,
    pack_commit_meta,
    request_flags,
    with_checksum,
)

MAX_PAYLOAD = 64 << 20
U64 = st.integers(0, (1 << 64) - 1)
U32 = st.integers(0, (1 << 32) - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)


def _header_bytes() -> st.SearchStrategy[bytes]:
    """Mostly-plausible headers (right magic and version) mixed with raw noise."""
    plausible = st.builds(
        lambda op, flags, meta_len, rest, offset, length: REQUEST.pack(
            REQUEST_MAGIC, VERSION, op, flags, meta_len, *rest, bytes(GRANT_MAC_BYTES), offset,
            length),
        st.integers(0, 255), st.integers(0, 0xFFFF), U32, st.tuples(*[U64] * 8), U64, U64)
    return st.one_of(plausible, st.binary(min_size=REQUEST.size, max_size=REQUEST.size))


@given(_header_bytes())
def test_any_header_decodes_within_limits_or_is_a_frame_error(raw: bytes) -> None:
    try:
        req = decode_request(raw, max_payload_bytes=MAX_PAYLOAD)
    except FrameError as e:
        assert e.status and e.message
        return
    assert req.op in OPS
    assert req.meta_len <= MAX_META_BYTES
    assert req.length <= MAX_PAYLOAD or req.op in OPS_COMMIT_LIKE
    assert (req.grant is None) == (req.op in OPS_WITHOUT_GRANT)


@given(st.sampled_from(sorted(OPS)), U64, U64, U64, U64, U64, U64, U64, U64,
       st.integers(0, MAX_META_BYTES), st.binary(min_size=GRANT_MAC_BYTES, max_size=GRANT_MAC_BYTES),
       st.sampled_from((OP_READ, OP_WRITE)))
def test_in_range_headers_round_trip(op: int, request_id: int, segment_id: int, offset: int,
                                     length: int, alloc_id: int, epoch: int, expiry_ms: int,
                                     tag: int, meta_len: int, mac: bytes, connect_op: int) -> None:
    length %= MAX_PAYLOAD + 1
    # a commit or claim carries a write grant; a connect, a read or a write grant (its flag)
    grant_op = OP_WRITE if op in OPS_COMMIT_LIKE else connect_op if op == OP_RDMA_CONNECT else op
    grant = None if op in OPS_WITHOUT_GRANT else Grant(
        grant_op, segment_id, offset, length, alloc_id, epoch, expiry_ms, tag, mac)
    flags = 0 if grant is None else request_flags(op, grant)
    header = RequestHeader(op, request_id, segment_id, offset, length, meta_len, flags, grant)
    assert decode_request(header.pack(), max_payload_bytes=MAX_PAYLOAD) == header


@given(st.binary(max_size=MAX_META_BYTES + 64))
def test_random_meta_decodes_or_is_a_frame_error(meta: bytes) -> None:
    for decode in (decode_write_meta, decode_commit_meta):
        try:
            decode(meta)
        except FrameError:
            pass


@given(U64, U64, TEXT, TEXT, U64, U64)
def test_meta_round_trips(checksum: int, size: int, tenant: str, key: str, dev: int,
                          ino: int) -> None:
    meta = WriteMeta(checksum, size, tenant, key)
    if WRITE_META.size + len(tenant.encode()) + len(key.encode()) > MAX_META_BYTES:
        try:
            meta.pack()
        except FrameError:
            return
        raise AssertionError("oversized meta packed")
    assert decode_write_meta(meta.pack()) == meta
    assert decode_commit_meta(pack_commit_meta(meta, dev, ino)) == (meta, dev, ino)


@given(U64, U64, U64, TEXT, TEXT, U64, U64)
def test_setting_the_checksum_of_packed_meta_is_packing_with_it(
        checksum: int, digest: int, size: int, tenant: str, key: str, dev: int, ino: int) -> None:
    # a shm COMMIT gets its digest after the copy (transfer/shm_commits.py with_digest)
    meta = WriteMeta(checksum, size, tenant, key)
    if WRITE_META.size + len(tenant.encode()) + len(key.encode()) > MAX_META_BYTES:
        return
    hashed = WriteMeta(digest, size, tenant, key)
    assert with_checksum(meta.pack(), digest) == hashed.pack()
    assert decode_commit_meta(with_checksum(pack_commit_meta(meta, dev, ino), digest)) == (
        hashed, dev, ino)


@given(st.binary(max_size=WRITE_META.size - 1), U64)
def test_setting_the_checksum_of_a_short_meta_is_a_frame_error(meta: bytes, digest: int) -> None:
    try:
        with_checksum(meta, digest)
    except FrameError as e:
        assert e.status
        return
    raise AssertionError("a meta shorter than WRITE_META took a checksum")


@given(st.one_of(
    st.binary(min_size=RESPONSE.size, max_size=RESPONSE.size),
    st.builds(lambda status, flags, msg_len, rid, length: RESPONSE.pack(
        RESPONSE_MAGIC, VERSION, status, flags, msg_len, rid, length),
        st.integers(0, 255), st.integers(0, 0xFFFF), U32, U64, U64)))
def test_any_response_decodes_within_limits_or_is_a_frame_error(raw: bytes) -> None:
    try:
        resp = decode_response(raw, max_payload_bytes=MAX_PAYLOAD)
    except FrameError:
        return
    assert resp.msg_len <= MAX_MESSAGE_BYTES and resp.length <= MAX_PAYLOAD
