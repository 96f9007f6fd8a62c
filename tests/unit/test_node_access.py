"""NodeAccess: every grant rejection maps to its frame status; no memory for a refused request."""

from __future__ import annotations

import pytest

from cellar.proto.grant import GRANT_OP_READ, GRANT_OP_WRITE, Grant, any_key_tag, key_tag, sign
from cellar.proto.receipt import ReceiptSigner
from cellar.storage_node.access import NodeAccess
from cellar.storage_node.clock import MasterClock, wall_ms
from cellar.storage_node.index import ObjectIndex
from cellar.storage_node.segment import Segment
from cellar.transfer import frame
from cellar.transfer.base import Discard
from cellar.transfer.frame import FrameError, RequestHeader, WriteMeta

SECRET = bytes(range(32))
SEG = 42
SEG_BYTES = 1 << 20
EPOCH = 5
SKEW_MS = 1000


@pytest.fixture
def node() -> NodeAccess:
    clock = MasterClock()
    clock.epoch = EPOCH
    segment = Segment.in_memory(SEG, SEG_BYTES)
    return NodeAccess({SEG: segment}, ObjectIndex(allowed_skew_ms=SKEW_MS), SECRET, clock,
                      allowed_skew_ms=SKEW_MS)


def make_grant(op: int = GRANT_OP_WRITE, *, segment: int = SEG, offset: int = 4096,
               length: int = 1000, alloc: int = 1, epoch: int = EPOCH,
               expiry_ms: int | None = None, tenant: str = "t", key: str = "k",
               secret: bytes = SECRET) -> Grant:
    return sign(secret, op=op, segment_id=segment, offset=offset, length=length, alloc_id=alloc,
                epoch=epoch, expiry_ms=wall_ms() + 60_000 if expiry_ms is None else expiry_ms,
                tag=key_tag(tenant, key))


def request(grant: Grant, offset: int | None = None, length: int | None = None) -> RequestHeader:
    return RequestHeader(grant.op, 1, grant.segment_id,
                         grant.offset if offset is None else offset,
                         grant.length if length is None else length, grant=grant)


def meta(size: int = 1000, tenant: str = "t", key: str = "k", checksum: int = 9) -> WriteMeta:
    return WriteMeta(checksum, size, tenant, key)


def status_of(fn, *args) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(FrameError) as exc:
        fn(*args)
    return exc.value.status


def write(node: NodeAccess, grant: Grant, data: bytes, offset: int | None = None,
          wmeta: WriteMeta | None = None) -> None:
    req = request(grant, offset, len(data))
    wm = wmeta or meta(grant.length)
    view = node.writable(req, wm)  # held in flight until released, as the data server does
    try:
        if isinstance(view, memoryview):
            view[:] = data
        node.written(req, wm)
    finally:
        node.release(req)


def test_write_then_read_round_trip(node: NodeAccess) -> None:
    g = make_grant()
    payload = bytes(range(256)) * 3 + b"x" * 232
    write(node, g, payload[:500])
    write(node, g, payload[500:], offset=g.offset + 500)
    entry = node.index.get(1)
    assert entry is not None and entry.state.value == "sealed" and entry.key == "k"
    r = make_grant(GRANT_OP_READ)
    assert bytes(node.readable(request(r))) == payload
    # a read of a sub-range is allowed
    assert bytes(node.readable(request(r, r.offset + 10, 20))) == payload[10:30]


def test_unknown_segment(node: NodeAccess) -> None:
    g = make_grant(segment=SEG + 1)
    assert status_of(node.writable, request(g), meta()) == frame.ST_UNKNOWN_SEGMENT
    assert status_of(node.readable, request(make_grant(GRANT_OP_READ, segment=SEG + 1))) == \
        frame.ST_UNKNOWN_SEGMENT


def test_bad_mac(node: NodeAccess) -> None:
    forged = make_grant(secret=b"\x01" * 32)
    assert status_of(node.writable, request(forged), meta()) == frame.ST_BAD_GRANT
    g = make_grant()
    stretched = Grant(g.op, g.segment_id, g.offset, g.length * 2, g.alloc_id, g.epoch,
                      g.expiry_ms, g.key_tag, g.mac)
    assert status_of(node.writable, request(stretched), meta()) == frame.ST_BAD_GRANT
    assert status_of(node.readable, request(make_grant(GRANT_OP_READ, secret=b"\x02" * 32))) == \
        frame.ST_BAD_GRANT


def test_wrong_op(node: NodeAccess) -> None:
    read_grant = make_grant(GRANT_OP_READ)
    req = RequestHeader(GRANT_OP_WRITE, 1, SEG, read_grant.offset, 10, grant=Grant(
        GRANT_OP_WRITE, *[getattr(read_grant, f) for f in (
            "segment_id", "offset", "length", "alloc_id", "epoch", "expiry_ms", "key_tag", "mac")]))
    assert status_of(node.writable, req, meta()) == frame.ST_BAD_GRANT  # op is under the MAC


def test_expired(node: NodeAccess) -> None:
    now = wall_ms()
    assert status_of(node.writable, request(make_grant(expiry_ms=now - 5_000)), meta()) == \
        frame.ST_EXPIRED
    assert status_of(node.readable, request(make_grant(GRANT_OP_READ, expiry_ms=now - 5_000))) \
        == frame.ST_EXPIRED
    # inside the allowed skew it still passes
    node.writable(request(make_grant(expiry_ms=now - SKEW_MS // 2)), meta())


def test_clock_offset_is_used(node: NodeAccess) -> None:
    g = make_grant(expiry_ms=wall_ms() + 10_000)
    node.clock.offset_ms = 60_000  # the master's clock runs a minute ahead of ours
    assert status_of(node.writable, request(g), meta()) == frame.ST_EXPIRED


def test_stale_epoch(node: NodeAccess) -> None:
    assert status_of(node.writable, request(make_grant(epoch=EPOCH - 1)), meta()) == \
        frame.ST_STALE_EPOCH
    node.writable(request(make_grant(epoch=EPOCH + 1, alloc=2)), meta())  # newer is fine


def test_request_outside_grant(node: NodeAccess) -> None:
    g = make_grant()
    assert status_of(node.writable, request(g, g.offset - 1, 10), meta()) == frame.ST_OUT_OF_RANGE
    assert status_of(node.writable, request(g, g.offset + 995, 10), meta()) == frame.ST_OUT_OF_RANGE
    r = make_grant(GRANT_OP_READ)
    assert status_of(node.readable, request(r, r.offset, r.length + 1)) == frame.ST_OUT_OF_RANGE


def test_range_outside_segment(node: NodeAccess) -> None:
    g = make_grant(offset=SEG_BYTES - 100, length=1000)  # validly signed, past the end
    assert status_of(node.writable, request(g), meta()) == frame.ST_OUT_OF_RANGE
    r = make_grant(GRANT_OP_READ, offset=SEG_BYTES, length=1)
    assert status_of(node.readable, request(r)) == frame.ST_OUT_OF_RANGE
    huge = make_grant(GRANT_OP_READ, offset=(1 << 63), length=(1 << 63) - 1)
    assert status_of(node.readable, request(huge)) == frame.ST_OUT_OF_RANGE


def test_key_tag_mismatch(node: NodeAccess) -> None:
    g = make_grant(key="k")
    assert status_of(node.writable, request(g), meta(key="other")) == frame.ST_BAD_GRANT
    assert status_of(node.writable, request(g), meta(tenant="other")) == frame.ST_BAD_GRANT


def test_object_must_fit_grant(node: NodeAccess) -> None:
    g = make_grant(length=1000)
    assert status_of(node.writable, request(g, length=100), meta(size=1001)) == frame.ST_OUT_OF_RANGE
    # the grant covers a padded block, the object is smaller: writing past the object is refused
    assert status_of(node.writable, request(g, g.offset + 500, 500), meta(size=600)) == \
        frame.ST_OUT_OF_RANGE


def test_sealed_alloc_refuses_and_keeps_bytes(node: NodeAccess) -> None:
    g = make_grant()
    write(node, g, b"a" * 1000)
    # another object's meta under the same grant: refused
    assert status_of(node.writable, request(g, g.offset, 10), meta(checksum=8)) == frame.ST_SEALED
    r = make_grant(GRANT_OP_READ)
    assert bytes(node.readable(request(r))) == b"a" * 1000


def test_a_retried_chunk_of_a_sealed_alloc_gets_its_receipt_again(node: NodeAccess) -> None:
    """Issue 19: the reply that carried the receipt was lost and the writer sends the chunk
    again. Before: ST_SEALED with no receipt, and PutEnd revoked the put. Now the same
    receipt comes back, and the repeated payload (here other bytes) never lands."""
    g = make_grant()
    req = request(g, g.offset, 1000)
    view = node.writable(req, meta())
    assert isinstance(view, memoryview)
    view[:] = b"a" * 1000
    receipt = node.written(req, meta())
    node.release(req)
    assert receipt
    # ST_SEALED before; now its payload is drained (Discard): no allocation of its length
    again = node.writable(req, meta())
    assert again == Discard(1000)
    assert node.written(req, meta()) == receipt
    node.release(req)
    read = request(make_grant(GRANT_OP_READ))
    assert bytes(node.readable(read)) == b"a" * 1000  # type: ignore[arg-type]
    node.release(read)
    assert node.index.in_flight(g.alloc_id) == 0
    # a chunk of it (a striped write's part) gets the receipt too; another tenant's meta not
    part = request(g, g.offset + 500, 500)
    assert node.writable(part, meta()) == Discard(500)
    assert node.written(part, meta()) == receipt
    node.release(part)
    assert status_of(node.writable, req, meta(tenant="u")) in (frame.ST_BAD_GRANT, frame.ST_SEALED)


def test_freed_alloc_refused_until_grant_expires(node: NodeAccess) -> None:
    from types import SimpleNamespace

    g = make_grant(alloc=3)
    node.writable(request(g, g.offset, 10), meta())  # partial write, then the master frees it
    node.written(request(g, g.offset, 10), meta())
    node.index.apply_freed([SimpleNamespace(segment_id=SEG, alloc_id=3, offset=g.offset,
                                            length=g.length)], node.clock.now_ms())
    assert status_of(node.writable, request(g, g.offset + 10, 10), meta()) == frame.ST_SEALED


def test_late_writer_cannot_touch_reused_range(node: NodeAccess) -> None:
    """A sealed object's range is reused by a new allocation; the old writer stays out."""
    old = make_grant(alloc=10, key="old")
    write(node, old, b"o" * 1000, wmeta=meta(key="old"))
    new = make_grant(alloc=11, key="new")
    write(node, new, b"n" * 1000, wmeta=meta(key="new"))
    assert status_of(node.writable, request(old, old.offset, 10), meta(key="old")) == frame.ST_SEALED
    assert bytes(node.readable(request(make_grant(GRANT_OP_READ, alloc=11, key="new")))) == b"n" * 1000
    # a read grant of the old allocation reads nothing: the range holds another object now
    assert status_of(node.readable, request(make_grant(GRANT_OP_READ, alloc=10, key="old"))) == frame.ST_BAD_GRANT


def test_put_ahead_grant_takes_any_key_of_its_tenant_only(node: NodeAccess) -> None:
    """A put-ahead grant (proto/grant.py ANY_KEY) names the tenant: the first write names the
    key, every later chunk must name the same one, another tenant's write is refused, and the
    receipt names the key stored (the master binds only that one: master/put_ahead.py)."""
    g = sign(SECRET, op=GRANT_OP_WRITE, segment_id=SEG, offset=4096, length=1000, alloc_id=7,
             epoch=EPOCH, expiry_ms=wall_ms() + 60_000, tag=any_key_tag("t"))
    assert status_of(node.writable, request(g, length=500), meta(tenant="u", key="k")) == \
        frame.ST_BAD_GRANT
    first = request(g, length=500)
    node.writable(first, meta(key="chosen"))[:] = b"a" * 500  # type: ignore[index]
    assert node.written(first, meta(key="chosen")) == b""  # not sealed yet
    node.release(first)
    rest = request(g, g.offset + 500, 500)
    assert status_of(node.writable, rest, meta(key="other")) == frame.ST_BAD_GRANT
    node.writable(rest, meta(key="chosen"))[:] = b"b" * 500  # type: ignore[index]
    raw = node.written(rest, meta(key="chosen"))
    got = ReceiptSigner(SECRET).open(raw)
    assert got.key_tag == key_tag("t", "chosen") and got.alloc_id == 7 and got.length == 1000
    entry = node.index.get(7)
    assert entry is not None and entry.key == "chosen"
    # reads name the real key, never the put-ahead tag
    r = sign(SECRET, op=GRANT_OP_READ, segment_id=SEG, offset=4096, length=1000, alloc_id=7,
             epoch=EPOCH, expiry_ms=wall_ms() + 60_000, tag=key_tag("t", "chosen"))
    assert bytes(node.readable(request(r))) == b"a" * 500 + b"b" * 500
    r_any = sign(SECRET, op=GRANT_OP_READ, segment_id=SEG, offset=4096, length=1000, alloc_id=7,
                 epoch=EPOCH, expiry_ms=wall_ms() + 60_000, tag=any_key_tag("t"))
    assert status_of(node.readable, request(r_any)) == frame.ST_BAD_GRANT
